package outbox_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/test/pgtest"
)

func TestEventFromMessage(t *testing.T) {
	t.Parallel()
	tenant, corr := uuid.New(), uuid.New()
	ev := outbox.EventFromMessage([]byte(`{"id": "order-7", "tenant_id": "` + tenant.String() + `", "aggregate_type": "order",
		"aggregate_id": 7, "event_type": "order.placed", "payload": {"total": 42}, "headers": {"traceparent": "00-x"},
		"correlation_id": "` + corr.String() + `", "extra": true}`))
	if ev.Poison != "" {
		t.Fatalf("poison: %s", ev.Poison)
	}
	if ev.RawID != "order-7" || ev.ID != outbox.EventIDFromText("order-7") || ev.TenantID != tenant || ev.AggregateType != "order" ||
		ev.AggregateID != "7" || ev.EventType != "order.placed" || string(ev.Payload) != `{"total": 42}` ||
		string(ev.Headers) != `{"traceparent": "00-x"}` || ev.CorrelationID.UUID != corr || ev.CausationID.Valid {
		t.Fatalf("decoded %+v", ev)
	}

	// Only event_type is needed: no id (the relay derives one), payload {}.
	ev = outbox.EventFromMessage([]byte(`{"event_type": "ping"}`))
	if ev.Poison != "" || ev.ID != uuid.Nil || ev.RawID != "" || string(ev.Payload) != "{}" || ev.TenantID != outbox.NilTenant {
		t.Fatalf("minimal message decoded as %+v", ev)
	}

	for content, want := range map[string]string{
		`not json`:                    "is not JSON",
		`[1, 2]`:                      "is not a JSON object",
		`"text"`:                      "is not a JSON object",
		``:                            "is not JSON",
		"{\"event_type\": \"a\xff\"}": "not valid UTF-8",
		`{"payload": {}}`:             "has no event_type",
		`{"event_type": ""}`:          "has no event_type",
		`{"event_type": 5}`:           "event_type is a JSON number, want a string",
		`{"event_type": "x", "tenant_id": "t-1"}`: `tenant_id "t-1" is not a UUID`,
		`{"event_type": "x", "headers": [1]}`:     "headers is not a JSON object",
		`{"event_type": "x", "id": {"a": 1}}`:     "id is neither a string nor a number",
		`{"event_type": "x", "payload": {"a": 1}`: "is not JSON",
	} {
		ev := outbox.EventFromMessage([]byte(content))
		if !strings.Contains(ev.Poison, want) {
			t.Errorf("%q: poison %q, want it to say %q", content, ev.Poison, want)
		}
	}
	if ev := outbox.EventFromMessage([]byte(`{"event_type": 5, "payload": 1}`)); ev.EventType != "" {
		t.Errorf("a non-string event_type was read as %q", ev.EventType)
	}
	if ev := outbox.EventFromMessage([]byte(`{"event_type": "named", "tenant_id": 5}`)); ev.EventType != "named" || ev.Poison == "" {
		t.Errorf("a refused message keeps the event_type that could be read: %+v", ev)
	}
}

// Emit writes transactional messages that decode into the same events, in
// order, with the caller's trace context in their headers, and nothing into
// the outbox table; a rolled-back transaction emits nothing.
func TestEmit(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := context.Background()
	slot := "emit_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	if _, err := db.Pool.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Pool.Exec(context.Background(), `SELECT pg_drop_replication_slot($1)`, slot) })
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, TraceFlags: trace.FlagsSampled})
	tctx := trace.ContextWithSpanContext(ctx, sc)
	msgs := []outbox.Message{
		{TenantID: uuid.New(), AggregateType: "order", AggregateID: "o-1", EventType: "order.placed", Payload: map[string]int{"n": 1},
			Headers: map[string]string{"k": "v"}, CorrelationID: uuid.New()},
		{EventType: "order.noted", Payload: json.RawMessage(`[1,2]`)},
	}
	if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { return outbox.Emit(tctx, tx, msgs...) }); err != nil {
		t.Fatal(err)
	}
	if msgs[0].ID == uuid.Nil || msgs[1].ID == uuid.Nil {
		t.Fatalf("Emit did not fill in the ids")
	}
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := outbox.Emit(ctx, tx, outbox.Message{EventType: "rolled.back"}); err != nil {
		t.Fatal(err)
	}
	tx.Rollback(ctx)
	if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { return outbox.Emit(ctx, tx, outbox.Message{}) }); err == nil {
		t.Fatal("a message without EventType was emitted")
	}
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("Emit wrote %d outbox rows (%v)", n, err)
	}

	// The test cluster commits asynchronously, and a slot decodes only
	// what is flushed: read until the messages are there.
	var got []outbox.Event
	for deadline := time.Now().Add(20 * time.Second); len(got) < len(msgs) && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		got = peekMessages(t, db, slot)
	}
	if len(got) != len(msgs) {
		t.Fatalf("decoded %d messages, want %d: %+v", len(got), len(msgs), got)
	}
	for i, m := range msgs {
		ev := got[i]
		if ev.Poison != "" || ev.ID != m.ID || ev.EventType != m.EventType || ev.TenantID != m.TenantID ||
			ev.AggregateID != m.AggregateID || ev.AggregateType != m.AggregateType || ev.CorrelationID.UUID != m.CorrelationID {
			t.Errorf("message %d decoded as %+v", i, ev)
		}
		if !strings.Contains(string(ev.Headers), `"traceparent":"00-01000000000000000000000000000000-0200000000000000-01"`) {
			t.Errorf("message %d headers %s lack the caller's traceparent", i, ev.Headers)
		}
	}
	if string(got[1].Payload) != `[1,2]` {
		t.Errorf("payload %s", got[1].Payload)
	}
}

// peekMessages decodes the outbox messages the slot holds.
func peekMessages(t *testing.T, db *pgtest.DB, slot string) []outbox.Event {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), `SELECT data FROM pg_logical_slot_peek_binary_changes($1, NULL, NULL,
		'proto_version', '1', 'publication_names', $2, 'messages', 'true')`, slot, db.Publication)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []outbox.Event
	for rows.Next() {
		var data []byte
		if err := rows.Scan(&data); err != nil {
			t.Fatal(err)
		}
		m, err := pglogrepl.Parse(data)
		if err != nil {
			t.Fatal(err)
		}
		if lm, ok := m.(*pglogrepl.LogicalDecodingMessage); ok && lm.Prefix == outbox.DefaultMessagePrefix {
			if !lm.Transactional {
				t.Errorf("Emit wrote a non-transactional message")
			}
			got = append(got, outbox.EventFromMessage(lm.Content))
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return got
}

// Whatever a message holds, decoding it never panics, and an event it
// accepts has an event type and a payload the relay can encode.
func FuzzEventFromMessage(f *testing.F) {
	for _, s := range []string{`{"event_type": "a"}`, `{"event_type": "a", "payload": [1, {"b": null}], "headers": {"k": "v"}}`,
		`{"id": 1e400, "event_type": "x"}`, `not json`, `{"tenant_id": null, "event_type": "x", "aggregate_id": -0.5}`, `{"event_type": "\u0000"}`, ``} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, content []byte) {
		ev := outbox.EventFromMessage(content)
		if ev.Poison != "" {
			return
		}
		if ev.EventType == "" || outbox.CheckEncodable(ev.Payload) != nil || !json.Valid(ev.Payload) {
			t.Fatalf("accepted %q as %+v", content, ev)
		}
		if len(ev.Headers) > 0 && !json.Valid(ev.Headers) {
			t.Fatalf("accepted headers %q", ev.Headers)
		}
	})
}
