package correlator_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/google/uuid"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/compensa/compensa/correlator"
)

const producerTP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

// TestStartKeepsTheStartSpansTraceparent: with a TracerProvider, a trigger
// whose row carries a traceparent starts its instance under a "saga start"
// span, child of the "correlate" span, itself a child of (and linked to) the
// producer's; the instance keeps the start span's traceparent. Without one,
// the instance keeps none.
func TestStartKeepsTheStartSpansTraceparent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, traced := range []bool{true, false} {
		b := setup(t)
		exp := tracetest.NewInMemoryExporter()
		if traced {
			var err error
			b.corr, err = correlator.New(b.db.Pool, &correlator.Config{Registry: b.reg,
				TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))})
			if err != nil {
				t.Fatal(err)
			}
		}
		ev := trigger(uuid.New())
		ev.Headers = json.RawMessage(`{"traceparent":"` + producerTP + `"}`)
		if err := b.corr.HandleBatch(ctx, b.batch(ev)); err != nil {
			t.Fatal(err)
		}
		var stored *string
		if err := b.db.Pool.QueryRow(ctx, `SELECT traceparent FROM saga_instances`).Scan(&stored); err != nil {
			t.Fatal(err)
		}
		if !traced {
			if stored != nil {
				t.Fatalf("tracing off stored traceparent %q", *stored)
			}
			continue
		}
		spans := exp.GetSpans()
		if len(spans) != 2 {
			t.Fatalf("%d spans; want correlate and saga start", len(spans))
		}
		corr, start := spans[0], spans[1]
		if start.Name != "saga start brief_enrichment" {
			corr, start = start, corr
		}
		if corr.Name != "correlate research_brief.created" || corr.Parent.SpanID().String() != "b7ad6b7169203331" ||
			len(corr.Links) != 1 || corr.Links[0].SpanContext.SpanID().String() != "b7ad6b7169203331" {
			t.Fatalf("correlate span %q parent %s links %v", corr.Name, corr.Parent.SpanID(), corr.Links)
		}
		if start.Parent.SpanID() != corr.SpanContext.SpanID() {
			t.Fatalf("saga start is not a child of correlate")
		}
		want := "00-0af7651916cd43dd8448eb211c80319c-" + start.SpanContext.SpanID().String() + "-01"
		if stored == nil || *stored != want {
			t.Fatalf("instance traceparent %v; want %s (the saga start span)", stored, want)
		}
	}
}
