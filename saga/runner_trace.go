package saga

import (
	"context"
	"errors"

	"github.com/compensa/compensa/internal/tracing"
)

// traceAttempt starts the span of one attempt of step (a compensation when
// comp), child of the span that started the instance, and returns ctx with
// it: the step's emitted rows and http calls carry its traceparent. With
// tracing off it returns ctx as is, allocating nothing.
func (w *work) traceAttempt(ctx context.Context, step Step, comp bool, attempt int) context.Context {
	if w.r.tracer == nil {
		return ctx
	}
	w.endSpan(OutcomeAborted, nil) // an attempt that ended without a hook
	ctx, w.span = tracing.Step(ctx, w.r.tracer, w.inst.TraceParent, w.inst.SagaName, w.inst.SagaVersion,
		w.inst.ID, step.Name, w.inst.CurrentStep, attempt, comp)
	return ctx
}

// endSpan ends the current attempt's span with its outcome, if one is open.
func (w *work) endSpan(o Outcome, err error) {
	if w.span == nil {
		return
	}
	acted := o == OutcomeCompleted || o == OutcomeAwaiting || errors.Is(err, ErrMayHaveActed) || errors.Is(err, errStepTimeout)
	tracing.EndStep(w.span, string(o), acted, err)
	w.span = nil
}
