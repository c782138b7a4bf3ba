package tracing

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/relay"
	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/test/natstest"
	"github.com/compensa/compensa/test/pgtest"
)

// orderSaga reserves stock over HTTP, confirms the order with an event the
// sinks deliver, then fails to ship (the carrier answers 400): the confirm
// and the reservation are compensated.
const orderSaga = `saga: order
version: 1
triggers: [{event_type: order.placed}]
defaults:
  timeout: 5s
  retry: { max_attempts: 2, initial: 50ms }
steps:
  - name: reserve
    http: { method: POST, url: "PART/reserve", body: { order: "${ trigger.payload.order }" } }
    compensate:
      http: { method: POST, url: "PART/release", body: { order: "${ trigger.payload.order }" } }
  - name: confirm
    emit:
      - event_type: order.confirmed
        aggregate_type: order
        aggregate_id: "${ trigger.aggregate_id }"
        payload: { order: "${ trigger.payload.order }" }
    compensate:
      emit: [{event_type: order.cancelled, aggregate_type: order, aggregate_id: "${ trigger.aggregate_id }", payload: { order: "${ trigger.payload.order }" }}]
  - name: ship
    http: { method: POST, url: "PART/ship", body: { order: "${ trigger.payload.order }" } }
`

// testProvider is the tracer provider of the test's own services (the
// producer, the participant), exporting to the same receiver.
func testProvider(t *testing.T, endpoint, service string) *sdktrace.TracerProvider {
	exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(endpoint+"/v1/traces"))
	if err != nil {
		t.Fatal(err)
	}
	res := resource.NewSchemaless(semconv.ServiceName(service))
	return sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithResource(res))
}

var prop = propagation.TraceContext{}

// traceparentOf parses a traceparent header into its trace and span ids.
func traceparentOf(t *testing.T, tp string) (traceID, spanID string) {
	parts := strings.Split(tp, "-")
	if len(parts) != 4 || len(parts[1]) != 32 || len(parts[2]) != 16 {
		t.Fatalf("traceparent %q is not W3C (00-<trace>-<span>-<flags>)", tp)
	}
	return parts[1], parts[2]
}

func startNATS(t *testing.T) *natstest.Server { return natstest.Start(t) }

// TestOneTraceFromProducerToBroker: a producer's traced transaction starts
// a saga; the relay, configured by the standard OTEL_* variables, exports
// over OTLP/HTTP one trace: producer → correlator → saga start → each step
// (the http step's client span, the participant's server span under it) →
// the emitted event → the webhook and NATS deliveries, whose receivers read
// traceparent and continue the trace; the compensations are in it too. The
// spans are all there once Stop returns: Stop flushes.
func TestOneTraceFromProducerToBroker(t *testing.T) {
	// Not parallel: the relay reads OTEL_* from the environment.
	ctx := context.Background()
	db := pgtest.NewDB(t)
	recv := newReceiver(t)
	testTP := testProvider(t, recv.URL, "test-services")
	defer testTP.Shutdown(ctx)

	// The participant continues the trace of each request in a server span.
	var mu sync.Mutex
	got := map[string][]string{} // what -> traceparents received
	record := func(what, tp string) {
		mu.Lock()
		got[what] = append(got[what], tp)
		mu.Unlock()
	}
	received := func(what string) []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), got[what]...)
	}
	participant := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		record(r.URL.Path, r.Header.Get("traceparent"))
		pctx := prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		_, sp := testTP.Tracer("participant").Start(pctx, "participant "+r.URL.Path, trace.WithSpanKind(trace.SpanKindServer))
		defer sp.End()
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/ship" {
			w.WriteHeader(http.StatusBadRequest)
			w.Write([]byte(`{"error":"no carrier"}`))
			return
		}
		w.Write([]byte(`{"ok":true}`))
	}))
	defer participant.Close()
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		record("webhook", r.Header.Get("traceparent"))
		w.WriteHeader(http.StatusNoContent)
	}))
	defer hook.Close()
	ns := startNATS(t)
	nc, err := nats.Connect(ns.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := nc.Subscribe("traced.>", func(m *nats.Msg) { record("nats", m.Header.Get("traceparent")) }); err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	sagas := filepath.Join(dir, "sagas")
	os.Mkdir(sagas, 0o700)
	os.WriteFile(filepath.Join(sagas, "order.yaml"), []byte(strings.ReplaceAll(orderSaga, "PART", participant.URL)), 0o600)
	sinksFile := filepath.Join(dir, "sinks.yaml")
	os.WriteFile(sinksFile, []byte(fmt.Sprintf(`sinks:
  - name: hook
    match: { event_types: ["order.confirmed"] }
    webhook: { url: %s/events, timeout: 5s }
  - name: bus
    match: { event_types: ["order.confirmed"] }
    nats: { url: %s, stream: TRACED, subject: "traced.{event_type}" }
`, hook.URL, ns.URL())), 0o600)

	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", recv.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	t.Setenv("OTEL_SERVICE_NAME", "relay-under-test")
	token := apiToken
	r, err := relay.New(ctx, relay.Config{DatabaseURL: db.URL, Registry: saga.NewRegistry(), Slot: db.Slot, Publication: db.Publication,
		Sagas: sagas, Sinks: sinksFile, Workers: 2, HTTPAddr: "127.0.0.1:0", APIToken: token,
		StatusInterval: 100 * time.Millisecond, HeartbeatInterval: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := r.Stop(sctx); err != nil {
			t.Error(err)
		}
	}
	defer stop()

	// The producer: its span around the transaction that writes the trigger.
	pctx, producer := testTP.Tracer("producer").Start(ctx, "place order", trace.WithSpanKind(trace.SpanKindProducer))
	trigger := uuid.New()
	tx, err := db.Pool.Begin(pctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := outbox.Write(pctx, tx, outbox.Message{ID: trigger, EventType: "order.placed", AggregateType: "order", AggregateID: "o-42",
		Payload: map[string]string{"order": "o-42"}}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(pctx); err != nil {
		t.Fatal(err)
	}
	producer.End()
	traceID, producerSpan := producer.SpanContext().TraceID().String(), producer.SpanContext().SpanID().String()

	// POST /v1/events takes the trace context from the request's headers.
	body := []byte(`{"event_type":"audit.noted","payload":{}}`)
	req, _ := http.NewRequest("POST", "http://"+r.Addr()+"/v1/events", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("POST /v1/events: %s", resp.Status)
	}
	var apiTP string
	if err := db.Pool.QueryRow(ctx, `SELECT headers->>'traceparent' FROM outbox WHERE event_type = 'audit.noted'`).Scan(&apiTP); err != nil {
		t.Fatal(err)
	}
	if apiTP != "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" {
		t.Fatalf("POST /v1/events wrote traceparent %q; want the request's", apiTP)
	}

	deadline := time.Now().Add(90 * time.Second)
	for {
		var st string
		db.Pool.QueryRow(ctx, `SELECT status::text FROM saga_instances WHERE trigger_event_id = $1`, trigger).Scan(&st)
		if st == "COMPENSATED" && len(received("webhook")) > 0 && len(received("nats")) > 0 && len(received("/release")) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("saga %q, webhook %d, nats %d, release %d: timed out", st, len(received("webhook")), len(received("nats")), len(received("/release")))
		}
		time.Sleep(50 * time.Millisecond)
	}
	var confirmedTP string
	if err := db.Pool.QueryRow(ctx, `SELECT headers->>'traceparent' FROM outbox WHERE event_type = 'order.confirmed'`).Scan(&confirmedTP); err != nil {
		t.Fatal(err)
	}
	stop()
	spans := recv.all()
	defer func() {
		if t.Failed() {
			for _, s := range spans {
				t.Logf("%s %s parent %s %s %v", s.TraceID[:8], s.SpanID, s.Parent, s.Name, s.Attrs)
			}
		}
	}()
	if len(recv.bad) > 0 {
		t.Fatalf("the receiver got requests it could not read: %v", recv.bad)
	}

	// Every span of the saga is in the producer's trace.
	byID := map[string]span{}
	find := func(name string, where func(span) bool) []span {
		var out []span
		for _, s := range spans {
			if s.Name == name && s.TraceID == traceID && (where == nil || where(s)) {
				out = append(out, s)
			}
		}
		return out
	}
	one := func(name string, where func(span) bool) span {
		t.Helper()
		f := find(name, where)
		if len(f) != 1 {
			var names []string
			for _, s := range spans {
				names = append(names, fmt.Sprintf("%s(%s parent %s trace %s)", s.Name, s.SpanID, s.Parent, s.TraceID[:8]))
			}
			t.Fatalf("%d spans %q in trace %s; want 1. All spans: %s", len(f), name, traceID, strings.Join(names, ", "))
		}
		return f[0]
	}
	for _, s := range spans {
		byID[s.SpanID] = s
	}
	childOf := func(s span, parent span) {
		t.Helper()
		if s.Parent != parent.SpanID {
			t.Errorf("span %q has parent %s (%q); want %q (%s)", s.Name, s.Parent, byID[s.Parent].Name, parent.Name, parent.SpanID)
		}
	}
	prod := byID[producerSpan]
	if prod.Name != "place order" {
		t.Fatalf("the producer's span was not received")
	}
	corr := one("correlate order.placed", nil)
	childOf(corr, prod)
	if corr.Kind != tracepb.Span_SPAN_KIND_CONSUMER || len(corr.Links) != 1 || corr.Links[0] != producerSpan || corr.Service != "relay-under-test" {
		t.Errorf("correlate span: kind %v, links %v, service %q; want a consumer span linked to the producer's, from OTEL_SERVICE_NAME", corr.Kind, corr.Links, corr.Service)
	}
	start := one("saga start order", nil)
	childOf(start, corr)
	if start.Attrs["compensa.saga.name"] != "order" || start.Attrs["compensa.saga.version"] != "1" || start.Attrs["compensa.trigger.event_id"] != trigger.String() {
		t.Errorf("saga start attributes %v", start.Attrs)
	}
	step := func(name string, comp bool, outcome string) span {
		t.Helper()
		prefix := "saga step order."
		if comp {
			prefix = "saga compensate order."
		}
		s := one(prefix+name, func(s span) bool { return s.Attrs["compensa.step.outcome"] == outcome })
		childOf(s, start)
		for _, k := range []string{"compensa.saga.name", "compensa.saga.version", "compensa.saga.instance_id", "compensa.step.name", "compensa.step.attempt", "compensa.step.may_have_acted"} {
			if s.Attrs[k] == "" {
				t.Errorf("span %q lacks %s: %v", s.Name, k, s.Attrs)
			}
		}
		return s
	}
	reserve := step("reserve", false, "completed")
	confirm := step("confirm", false, "completed")
	ship := step("ship", false, "failed")
	if !ship.Error || ship.Attrs["compensa.step.may_have_acted"] != "false" {
		t.Errorf("the failed ship attempt: error %v, may_have_acted %q; want an error that did not act (400 is permanent)", ship.Error, ship.Attrs["compensa.step.may_have_acted"])
	}
	step("confirm", true, "completed")
	releaseStep := step("reserve", true, "completed")

	// The http steps' client spans, and the participant's server spans under them.
	for _, c := range []struct {
		step span
		path string
	}{{reserve, "/reserve"}, {ship, "/ship"}, {releaseStep, "/release"}} {
		client := one("POST", func(s span) bool { return s.Parent == c.step.SpanID })
		if client.Kind != tracepb.Span_SPAN_KIND_CLIENT || client.Attrs["http.request.method"] != "POST" || client.Attrs["server.address"] != "127.0.0.1" {
			t.Errorf("client span of %s: kind %v attrs %v", c.path, client.Kind, client.Attrs)
		}
		srv := one("participant "+c.path, nil)
		childOf(srv, client)
		tps := received(c.path)
		if len(tps) == 0 {
			t.Fatalf("the participant got no %s", c.path)
		}
		if tr, sp := traceparentOf(t, tps[0]); tr != traceID || sp != client.SpanID {
			t.Errorf("%s carried traceparent %s; want trace %s, span %s (the client span)", c.path, tps[0], traceID, client.SpanID)
		}
	}
	if client := one("POST", func(s span) bool { return s.Parent == ship.SpanID }); client.Attrs["http.response.status_code"] != "400" || !client.Error {
		t.Errorf("the ship call's client span: %v error %v; want status 400 and an error", client.Attrs, client.Error)
	}

	// The emitted event carries the confirm step's trace context.
	if tr, sp := traceparentOf(t, confirmedTP); tr != traceID || sp != confirm.SpanID {
		t.Errorf("order.confirmed's row carries traceparent %s; want the confirm step's span %s", confirmedTP, confirm.SpanID)
	}
	// Each sink's delivery span is a child of it, and what the webhook
	// receiver and the NATS consumer read continues the delivery span.
	for _, c := range []struct {
		what, name string
		kind       tracepb.Span_SpanKind
		attr, val  string
	}{
		{"webhook", "POST", tracepb.Span_SPAN_KIND_CLIENT, "compensa.sink.name", "hook"},
		{"nats", "send traced.order.confirmed", tracepb.Span_SPAN_KIND_PRODUCER, "messaging.system", "nats"},
	} {
		d := one(c.name, func(s span) bool { return s.Parent == confirm.SpanID })
		if d.Kind != c.kind || d.Attrs[c.attr] != c.val {
			t.Errorf("%s delivery span: kind %v attrs %v", c.what, d.Kind, d.Attrs)
		}
		tps := received(c.what)
		tr, sp := traceparentOf(t, tps[0])
		if tr != traceID || sp != d.SpanID {
			t.Errorf("the %s receiver read traceparent %s; want trace %s span %s (the delivery span)", c.what, tps[0], traceID, d.SpanID)
		}
	}
	if d := one("send traced.order.confirmed", nil); d.Attrs["messaging.destination.name"] != "traced.order.confirmed" {
		t.Errorf("NATS delivery span attributes %v", d.Attrs)
	}
	// Nothing of the relay's ended up in another trace for this saga.
	for _, s := range spans {
		if s.Attrs["compensa.saga.instance_id"] != "" && s.TraceID != traceID {
			t.Errorf("span %q of the saga is in trace %s, not the producer's %s", s.Name, s.TraceID, traceID)
		}
	}
}
