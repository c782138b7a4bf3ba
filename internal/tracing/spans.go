package tracing

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// Attribute keys of the relay's own spans (semantic conventions name the
// rest: messaging.*, http.*, url.*, server.*).
const (
	AttrSaga         = attribute.Key("compensa.saga.name")
	AttrVersion      = attribute.Key("compensa.saga.version")
	AttrInstance     = attribute.Key("compensa.saga.instance_id")
	AttrStep         = attribute.Key("compensa.step.name")
	AttrStepIndex    = attribute.Key("compensa.step.index")
	AttrAttempt      = attribute.Key("compensa.step.attempt")
	AttrOutcome      = attribute.Key("compensa.step.outcome")
	AttrMayHaveActed = attribute.Key("compensa.step.may_have_acted")
	AttrCompensation = attribute.Key("compensa.step.compensation")
	AttrEventType    = attribute.Key("compensa.event.type")
	AttrTrigger      = attribute.Key("compensa.trigger.event_id")
	AttrSink         = attribute.Key("compensa.sink.name")
)

// Correlate starts the span of the correlator's handling of one event: a
// consumer span, child of the producer's span (from the row's traceparent)
// and linked to it, so that the trace goes on from the producer's
// transaction. tr nil (off) returns ctx and a nil span.
func Correlate(ctx context.Context, tr trace.Tracer, headers json.RawMessage, eventID, eventType string, reply bool) (context.Context, trace.Span) {
	if tr == nil {
		return ctx, nil
	}
	pctx := FromHeaders(ctx, headers)
	op := "process"
	if reply {
		op = "reply"
	}
	opts := []trace.SpanStartOption{
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			semconv.MessagingOperationTypeProcess,
			semconv.MessagingOperationName(op),
			semconv.MessagingMessageID(eventID),
			AttrEventType.String(eventType),
		),
	}
	if sc := trace.SpanContextFromContext(pctx); sc.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
	}
	return tr.Start(pctx, "correlate "+eventType, opts...)
}

// SagaStart starts the span of one saga instance's start, child of ctx (the
// correlator's span of the trigger). Its traceparent is what the instance
// keeps, so that its steps continue the trace on any relay.
func SagaStart(ctx context.Context, tr trace.Tracer, saga string, version int, instance, trigger string) (context.Context, trace.Span) {
	if tr == nil {
		return ctx, nil
	}
	return tr.Start(ctx, "saga start "+saga, trace.WithAttributes(
		AttrSaga.String(saga), AttrVersion.Int(version), AttrInstance.String(instance), AttrTrigger.String(trigger)))
}

// Step starts the span of one step attempt or one compensation attempt,
// child of the instance's stored traceparent. tr nil (off) returns ctx and
// a nil span without allocating.
func Step(ctx context.Context, tr trace.Tracer, traceparent, saga string, version int, instance [16]byte, step string, index, attempt int, compensation bool) (context.Context, trace.Span) {
	if tr == nil {
		return ctx, nil
	}
	ctx = WithTraceparent(ctx, traceparent, "")
	name := "saga step " + saga + "." + step
	if compensation {
		name = "saga compensate " + saga + "." + step
	}
	ctx, span := tr.Start(ctx, name)
	if span.IsRecording() { // a span sampled out costs no attributes
		span.SetAttributes(AttrSaga.String(saga), AttrVersion.Int(version), AttrInstance.String(uuidString(instance)),
			AttrStep.String(step), AttrStepIndex.Int(index), AttrAttempt.Int(attempt), AttrCompensation.Bool(compensation))
	}
	return ctx, span
}

// EndStep ends a step's span with its outcome. A nil span (off) is a no-op.
func EndStep(span trace.Span, outcome string, mayHaveActed bool, err error) {
	if span == nil {
		return
	}
	if !span.IsRecording() {
		span.End()
		return
	}
	span.SetAttributes(AttrOutcome.String(outcome), AttrMayHaveActed.Bool(mayHaveActed))
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// End ends span, recording err when not nil. A nil span is a no-op.
func End(span trace.Span, err error) {
	if span == nil {
		return
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// HTTPClient starts the client span of an outgoing request and puts the
// span's traceparent in req's headers, replacing any. The tracer is the one
// of ctx's span (the step's): with tracing off the span is a no-op, and the
// trace context ctx carries, if any, still goes out. The URL's path and
// query are left out of the attributes: a declared step may put a secret
// there.
func HTTPClient(ctx context.Context, req *http.Request) trace.Span {
	tr := trace.SpanFromContext(ctx).TracerProvider().Tracer(ScopeName)
	ctx, span := tr.Start(ctx, req.Method, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
		semconv.HTTPRequestMethodKey.String(req.Method),
		semconv.URLScheme(req.URL.Scheme),
		semconv.ServerAddress(req.URL.Hostname()),
	))
	if p := req.URL.Port(); p != "" {
		if n, err := strconv.Atoi(p); err == nil {
			span.SetAttributes(semconv.ServerPort(n))
		}
	}
	req.Header.Del(HeaderTraceparent)
	req.Header.Del(HeaderTracestate)
	Propagator.Inject(ctx, propagationHeader(req.Header))
	return span
}

// EndHTTP ends an HTTP client span with the response's status code, or
// as failed without a response. The transport's error is not recorded: it
// names the URL.
func EndHTTP(span trace.Span, resp *http.Response, err error) {
	switch {
	case err != nil || resp == nil:
		span.SetStatus(codes.Error, "no response")
	default:
		span.SetAttributes(semconv.HTTPResponseStatusCode(resp.StatusCode))
		if resp.StatusCode >= 400 {
			span.SetStatus(codes.Error, http.StatusText(resp.StatusCode))
		}
	}
	span.End()
}

func uuidString(b [16]byte) string {
	const hexd = "0123456789abcdef"
	var s [36]byte
	j := 0
	for i, c := range b {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			s[j] = '-'
			j++
		}
		s[j], s[j+1] = hexd[c>>4], hexd[c&0xf]
		j += 2
	}
	return string(s[:])
}
