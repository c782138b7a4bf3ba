package sinkspan_test

import (
	"context"
	"encoding/json"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/compensa/compensa/internal/tracing"
	"github.com/compensa/compensa/internal/tracing/sinkspan"
	"github.com/compensa/compensa/sink"
)

// recorder stands for a RabbitMQ or Redis sink: it keeps what it was handed
// and names the routing key or stream as those sinks do.
type recorder struct{ got []*sink.Event }

func (r *recorder) Deliver(_ context.Context, evs []*sink.Event) []error {
	r.got = append(r.got, evs...)
	return make([]error, len(evs))
}
func (r *recorder) Close() error                           { return nil }
func (r *recorder) RoutingKey(ev *sink.Event) string       { return "outbox." + ev.EventType }
func (r *recorder) Stream(ev *sink.Event) string           { return "outbox." + ev.AggregateType }
func (r *recorder) headers(t *testing.T) map[string]string { return headersOf(t, r.got[0]) }

func headersOf(t *testing.T, ev *sink.Event) map[string]string {
	t.Helper()
	h := map[string]string{}
	for _, x := range ev.MessageHeaders() {
		h[x.Key] = x.Value
	}
	return h
}

// A RabbitMQ or Redis delivery gets a producer span named for its
// destination, child of the row's traceparent, and the event the sink
// sends carries the span's traceparent (a message header, a stream field).
func TestRabbitMQAndRedisSpans(t *testing.T) {
	t.Parallel()
	const parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	for _, c := range []struct {
		spec             sink.Spec
		name, system, op string
		extra            string
	}{
		{sink.Spec{Name: "rabbit", RabbitMQ: &sink.RabbitMQSpec{Exchange: "outbox"}}, "publish outbox", "rabbitmq", "publish", "messaging.rabbitmq.destination.routing_key"},
		{sink.Spec{Name: "streams", Redis: &sink.RedisSpec{Stream: sink.MustTemplate("outbox.{aggregate_type}")}}, "send outbox.order", "redis", "xadd", ""},
	} {
		exp := tracetest.NewInMemoryExporter()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
		rec := &recorder{}
		s := sinkspan.Wrap(sink.Destination{Spec: c.spec, Sink: rec}, tracing.Tracer(tp))
		ev := &sink.Event{ID: "e-1", EventType: "order.confirmed", AggregateType: "order", AggregateID: "o-1",
			Payload: json.RawMessage(`{}`), Headers: json.RawMessage(`{"traceparent":"` + parent + `"}`)}
		if errs := s.Deliver(context.Background(), []*sink.Event{ev}); errs[0] != nil {
			t.Fatal(errs[0])
		}
		spans := exp.GetSpans()
		if len(spans) != 1 {
			t.Fatalf("%s: %d spans", c.spec.Name, len(spans))
		}
		sp := spans[0]
		if sp.Name != c.name || sp.SpanKind != trace.SpanKindProducer || sp.Parent.SpanID().String() != "b7ad6b7169203331" {
			t.Fatalf("%s: span %q kind %v parent %s", c.spec.Name, sp.Name, sp.SpanKind, sp.Parent.SpanID())
		}
		attrs := map[string]string{}
		for _, a := range sp.Attributes {
			attrs[string(a.Key)] = a.Value.Emit()
		}
		if attrs["messaging.system"] != c.system || attrs["messaging.operation.name"] != c.op || attrs["messaging.message.id"] != "e-1" ||
			(c.extra != "" && attrs[c.extra] != "outbox.order.confirmed") {
			t.Fatalf("%s: attributes %v", c.spec.Name, attrs)
		}
		want := "00-0af7651916cd43dd8448eb211c80319c-" + sp.SpanContext.SpanID().String() + "-01"
		if got := rec.headers(t)["traceparent"]; got != want {
			t.Fatalf("%s: traceparent sent %q, want %q (the delivery span)", c.spec.Name, got, want)
		}
	}
}
