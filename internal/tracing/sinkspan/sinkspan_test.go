package sinkspan_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/compensa/compensa/internal/tracing"
	"github.com/compensa/compensa/internal/tracing/sinkspan"
	"github.com/compensa/compensa/sink"
	"github.com/compensa/compensa/sink/kafkasink"
)

// TestKafkaDeliveryContinuesTrace: a Kafka delivery gets a producer span
// (messaging conventions), child of the row's traceparent, and the record's
// traceparent header continues that span; the event handed in is not
// changed (the fan-out shares it between sinks).
func TestKafkaDeliveryContinuesTrace(t *testing.T) {
	t.Parallel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(1))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ks, err := kafkasink.New(kafkasink.Config{Brokers: c.ListenAddrs(), Topic: sink.MustTemplate("orders"), Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer ks.Close()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	spec := sink.Spec{Name: "orders", Kafka: &sink.KafkaSpec{Topic: sink.MustTemplate("orders")}}
	s := sinkspan.Wrap(sink.Destination{Spec: spec, Sink: ks}, tracing.Tracer(tp))

	const parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	headers := json.RawMessage(`{"traceparent":"` + parent + `","x":"y"}`)
	ev := &sink.Event{ID: "e-1", EventType: "order.confirmed", AggregateID: "o-1", Payload: json.RawMessage(`{}`), Headers: headers}
	if errs := s.Deliver(context.Background(), []*sink.Event{ev}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	if string(ev.Headers) != string(headers) {
		t.Fatalf("the event handed in was changed: %s", ev.Headers)
	}
	spans := exp.GetSpans()
	if len(spans) != 1 {
		t.Fatalf("%d spans", len(spans))
	}
	sp := spans[0]
	if sp.Name != "send orders" || sp.SpanKind != trace.SpanKindProducer || sp.Parent.SpanID().String() != "b7ad6b7169203331" {
		t.Fatalf("span %q kind %v parent %s", sp.Name, sp.SpanKind, sp.Parent.SpanID())
	}
	attrs := map[string]string{}
	for _, a := range sp.Attributes {
		attrs[string(a.Key)] = a.Value.Emit()
	}
	if attrs["messaging.system"] != "kafka" || attrs["messaging.destination.name"] != "orders" || attrs["messaging.operation.type"] != "send" {
		t.Fatalf("attributes %v", attrs)
	}

	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics("orders"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got := map[string]string{}
	for len(got) == 0 && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			for _, h := range r.Headers {
				got[h.Key] = string(h.Value)
			}
		})
	}
	want := "00-0af7651916cd43dd8448eb211c80319c-" + sp.SpanContext.SpanID().String() + "-01"
	if got["traceparent"] != want || got["x"] != "y" {
		t.Fatalf("record headers %v; want traceparent %s (the delivery span) and the row's other headers", got, want)
	}
	if !strings.HasPrefix(got["traceparent"], "00-0af7651916cd43dd8448eb211c80319c-") {
		t.Fatal("the record left the row's trace")
	}
}

// TestWrapOffIsTheSink: with tracing off the sink is returned as is.
func TestWrapOffIsTheSink(t *testing.T) {
	t.Parallel()
	ks, err := kafkasink.New(kafkasink.Config{Brokers: []string{"127.0.0.1:1"}, Topic: sink.MustTemplate("x")})
	if err != nil {
		t.Fatal(err)
	}
	defer ks.Close()
	if got := sinkspan.Wrap(sink.Destination{Sink: ks}, nil); got != sink.Sink(ks) {
		t.Fatal("Wrap with tracing off wrapped the sink")
	}
}
