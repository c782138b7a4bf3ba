package saga

import (
	"context"
	"errors"
	"testing"

	"github.com/google/uuid"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/compensa/compensa/internal/tracing"
)

const testTraceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

func tracedWork(r *Runner) *work {
	return &work{r: r, inst: Instance{ID: uuid.New(), SagaName: "order", SagaVersion: 3, CurrentStep: 1, TraceParent: testTraceparent}}
}

// TestStepTracingOffAllocatesNothing: with a no-op TracerProvider the
// runner's tracing hooks around an attempt allocate nothing. (Not
// parallel: AllocsPerRun needs the process to itself.)
func TestStepTracingOffAllocatesNothing(t *testing.T) {
	w := tracedWork(&Runner{tracer: tracing.Tracer(noop.NewTracerProvider())})
	step := Step{Name: "charge"}
	ctx := context.Background()
	if n := testing.AllocsPerRun(1000, func() {
		c := w.traceAttempt(ctx, step, false, 1)
		w.endSpan(OutcomeCompleted, nil)
		_ = c
	}); n != 0 {
		t.Fatalf("the step path's tracing allocates %v times per attempt with tracing off; want 0", n)
	}
}

// TestStepSpanAttributes: an attempt's span is a child of the instance's
// traceparent and carries saga, version, step, attempt, outcome and
// may-have-acted.
func TestStepSpanAttributes(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	w := tracedWork(&Runner{tracer: tracing.Tracer(sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp)))})
	ctx := w.traceAttempt(context.Background(), Step{Name: "charge"}, true, 2)
	if tracing.Traceparent(ctx) == "" {
		t.Fatal("the attempt's context carries no span")
	}
	w.endSpan(OutcomeRetry, MayHaveActed(errors.New("503")))
	spans := exp.GetSpans()
	if len(spans) != 1 {
		t.Fatalf("%d spans", len(spans))
	}
	s := spans[0]
	if s.Name != "saga compensate order.charge" || s.Parent.SpanID().String() != "b7ad6b7169203331" || s.SpanContext.TraceID().String() != "0af7651916cd43dd8448eb211c80319c" {
		t.Fatalf("span %q parent %s trace %s", s.Name, s.Parent.SpanID(), s.SpanContext.TraceID())
	}
	got := map[string]string{}
	for _, a := range s.Attributes {
		got[string(a.Key)] = a.Value.Emit()
	}
	want := map[string]string{"compensa.saga.name": "order", "compensa.saga.version": "3", "compensa.step.name": "charge",
		"compensa.step.attempt": "2", "compensa.step.outcome": "retry", "compensa.step.may_have_acted": "true", "compensa.step.compensation": "true"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q; want %q (all: %v)", k, got[k], v, got)
		}
	}
}

func BenchmarkStepTracingOff(b *testing.B) {
	w := tracedWork(&Runner{tracer: tracing.Tracer(noop.NewTracerProvider())})
	step := Step{Name: "charge"}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		w.traceAttempt(ctx, step, false, 1)
		w.endSpan(OutcomeCompleted, nil)
	}
}
