package tracing

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/relay"
	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/test/pgtest"
)

const apiToken = "a53d83e2ff31814c89f7678e7b31d3069c520439d72f4039953d90fc54f89881"

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestReplyLinksToCommand: with a TracerProvider passed in relay.Config, a
// step's command row carries the step's traceparent; a participant that
// continues it writes the reply with outbox.Write, which adds the
// participant's traceparent; the correlator's handling of the reply links
// to it, and the attempt that consumes the reply is in the saga's trace.
// The relay's log lines of a traced step carry trace_id and span_id.
func TestReplyLinksToCommand(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(ctx)
	tr := tp.Tracer("test")

	reg := saga.NewRegistry()
	reg.MustRegister(saga.Definition{Name: "ship", Version: 1, Triggers: []saga.Trigger{{EventType: "parcel.ready"}},
		Steps: []saga.Step{{Name: "book", ReplyTimeout: 30 * time.Second, Do: func(ctx context.Context, x *saga.StepTx) error {
			return x.EmitCommand(ctx, outbox.Message{EventType: "carrier.book", Payload: map[string]string{"parcel": "p-1"}})
		}}}})
	var logs lockedBuffer
	r, err := relay.New(ctx, relay.Config{DatabaseURL: db.URL, Registry: reg, Slot: db.Slot, Publication: db.Publication, Workers: 2,
		StatusInterval: 100 * time.Millisecond, HeartbeatInterval: 300 * time.Millisecond, TracerProvider: tp,
		HTTPAddr: "127.0.0.1:0", APIToken: apiToken,
		Logger: slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		r.Stop(sctx)
	}()

	write := func(ctx context.Context, m outbox.Message) {
		t.Helper()
		tx, err := db.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if err := outbox.Write(ctx, tx, m); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	pctx, producer := tr.Start(ctx, "producer")
	write(pctx, outbox.Message{EventType: "parcel.ready", Payload: map[string]string{"parcel": "p-1"}})
	producer.End()
	traceID := producer.SpanContext().TraceID().String()

	// The participant reads the command and its traceparent from the row.
	var cmdID uuid.UUID
	var cmdHeaders map[string]string
	deadline := time.Now().Add(60 * time.Second)
	for db.Pool.QueryRow(ctx, `SELECT id, headers FROM outbox WHERE event_type = 'carrier.book'`).Scan(&cmdID, &cmdHeaders) != nil {
		if time.Now().After(deadline) {
			t.Fatal("no command")
		}
		time.Sleep(50 * time.Millisecond)
	}
	cmdTP := cmdHeaders["traceparent"]
	if tr, _ := traceparentOf(t, cmdTP); tr != traceID {
		t.Fatalf("the command's traceparent %s is not in the producer's trace %s", cmdTP, traceID)
	}
	hctx, handle := tr.Start(withTraceparent(ctx, cmdTP), "participant handles carrier.book", trace.WithSpanKind(trace.SpanKindConsumer))
	write(hctx, outbox.Message{EventType: "carrier.booked", CorrelationID: cmdID, Payload: map[string]any{"ok": true}})
	handle.End()
	// outbox.Write never overwrites a traceparent the caller set, and adds
	// none without a span.
	own := "00-11111111111111111111111111111111-2222222222222222-01"
	write(hctx, outbox.Message{EventType: "audit.own", Headers: map[string]string{"traceparent": own}})
	write(ctx, outbox.Message{EventType: "audit.none"})

	for {
		var st string
		db.Pool.QueryRow(ctx, `SELECT status::text FROM saga_instances WHERE saga_name = 'ship' ORDER BY created_at LIMIT 1`).Scan(&st)
		if st == "COMPLETED" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("saga %q", st)
		}
		time.Sleep(50 * time.Millisecond)
	}
	headersOf := func(eventType string) map[string]string {
		var h map[string]string
		if err := db.Pool.QueryRow(ctx, `SELECT headers FROM outbox WHERE event_type = $1`, eventType).Scan(&h); err != nil {
			t.Fatal(err)
		}
		return h
	}
	if got := headersOf("carrier.booked")["traceparent"]; !strings.Contains(got, handle.SpanContext().SpanID().String()) {
		t.Errorf("the reply row's traceparent %q; want the participant's span %s", got, handle.SpanContext().SpanID())
	}
	if got := headersOf("audit.own")["traceparent"]; got != own {
		t.Errorf("outbox.Write replaced the caller's traceparent: %q", got)
	}
	if h := headersOf("audit.none"); h["traceparent"] != "" {
		t.Errorf("outbox.Write without a span wrote %v", h)
	}
	// POST /v1/sagas writes the trigger with the request's trace context.
	req, _ := http.NewRequest("POST", "http://"+r.Addr()+"/v1/sagas", strings.NewReader(`{"saga":"ship","payload":{"parcel":"p-2"}}`))
	req.Header.Set("Authorization", "Bearer "+apiToken)
	req.Header.Set("traceparent", "00-33333333333333333333333333333333-4444444444444444-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("POST /v1/sagas: %s", resp.Status)
	}
	var startTP string
	if err := db.Pool.QueryRow(ctx, `SELECT headers->>'traceparent' FROM outbox WHERE event_type = 'parcel.ready' AND payload->>'parcel' = 'p-2'`).Scan(&startTP); err != nil {
		t.Fatal(err)
	}
	if startTP != "00-33333333333333333333333333333333-4444444444444444-01" {
		t.Errorf("POST /v1/sagas wrote the trigger with traceparent %q; want the request's", startTP)
	}
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	r.Stop(sctx)

	spans := exp.GetSpans()
	var booking, consumed, reply *tracetest.SpanStub
	for i := range spans {
		s := &spans[i]
		if s.SpanContext.TraceID().String() != traceID {
			continue // the instance POST /v1/sagas started is in the request's trace
		}
		switch {
		case s.Name == "saga step ship.book" && attr(s, "compensa.step.outcome") == "awaiting":
			booking = s
		case s.Name == "saga step ship.book" && attr(s, "compensa.step.outcome") == "completed":
			consumed = s
		case s.Name == "correlate carrier.booked":
			reply = s
		}
	}
	if booking == nil || consumed == nil || reply == nil {
		t.Fatalf("spans: awaiting %v, consumed %v, reply %v", booking != nil, consumed != nil, reply != nil)
	}
	if !strings.Contains(cmdTP, booking.SpanContext.SpanID().String()) {
		t.Errorf("the command carries %s; want the awaiting attempt's span %s", cmdTP, booking.SpanContext.SpanID())
	}
	if len(reply.Links) != 1 || reply.Links[0].SpanContext.SpanID() != handle.SpanContext().SpanID() || attr(reply, "messaging.operation.name") != "reply" {
		t.Errorf("the reply's handling links %v; want the participant's span %s", reply.Links, handle.SpanContext().SpanID())
	}
	if consumed.SpanContext.TraceID().String() != traceID || consumed.Parent.SpanID() != booking.Parent.SpanID() {
		t.Errorf("the attempt that consumed the reply is not under the saga's start span")
	}
	// Log lines of the traced step carry its ids.
	found := false
	for _, line := range strings.Split(logs.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == "saga step committed" {
			found = true
			if m["trace_id"] != traceID || m["span_id"] == "" || m["span_id"] == nil {
				t.Errorf("log line without the step's trace: %s", line)
			}
		}
	}
	if !found {
		t.Error("no \"saga step committed\" log line")
	}
}

func attr(s *tracetest.SpanStub, k string) string {
	for _, a := range s.Attributes {
		if string(a.Key) == k {
			return a.Value.Emit()
		}
	}
	return ""
}

func withTraceparent(ctx context.Context, tp string) context.Context {
	return prop.Extract(ctx, propagation.MapCarrier{"traceparent": tp})
}
