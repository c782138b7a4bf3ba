package correlator

import (
	"context"

	"github.com/google/uuid"

	"github.com/compensa/compensa/internal/tracing"
	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/saga"
)

// traceEvent starts the span of a trigger's handling, child of and linked
// to the producer's span its row carries; ctx without a span when tracing
// is off.
func (p *plan) traceEvent(ev *outbox.Event) context.Context {
	if p.tr == nil {
		return context.Background()
	}
	ctx, span := tracing.Correlate(context.Background(), p.tr, ev.Headers, ev.ID.String(), ev.EventType, false)
	if span != nil {
		p.spans = append(p.spans, span)
	}
	return ctx
}

// traceStart starts the span of one saga start and keeps its traceparent
// for the instance row (nil when tracing is off).
func (p *plan) traceStart(ctx context.Context, d saga.Definition, id [16]byte, trigger uuid.UUID) {
	if p.tr == nil {
		p.startTrace = append(p.startTrace, nil)
		return
	}
	sctx, span := tracing.SagaStart(ctx, p.tr, d.Name, d.Version, uuid.UUID(id).String(), trigger.String())
	if span == nil {
		p.startTrace = append(p.startTrace, nil)
		return
	}
	p.spans = append(p.spans, span)
	tp := tracing.Traceparent(sctx)
	p.startTrace = append(p.startTrace, &tp)
}

// traceReply starts the span of a reply's handling, linked to the span of
// the participant that wrote it (which continues the command's).
func (p *plan) traceReply(ev *outbox.Event) {
	if p.tr == nil {
		return
	}
	if _, span := tracing.Correlate(context.Background(), p.tr, ev.Headers, ev.ID.String(), ev.EventType, true); span != nil {
		p.spans = append(p.spans, span)
	}
}

// endSpans ends the plan's spans with the batch's outcome.
func (p *plan) endSpans(err error) {
	for _, s := range p.spans {
		tracing.End(s, err)
	}
	p.spans = nil
}
