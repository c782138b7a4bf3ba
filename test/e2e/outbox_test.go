package e2e

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/test/pgtest"
)

type queryCounter struct{ n atomic.Int64 }

func (c *queryCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *queryCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func TestOutboxWriteIsOneRoundTripInTheCallersTransaction(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := context.Background()
	cfg, err := pgx.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	counter := &queryCounter{}
	cfg.Tracer = counter
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)

	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	msgs := make([]outbox.Message, 500)
	tenant, corr := uuid.New(), uuid.New()
	for i := range msgs {
		msgs[i] = outbox.Message{TenantID: tenant, EventType: "order.placed", AggregateType: "order",
			AggregateID: "42", Payload: map[string]int{"n": i}, Headers: map[string]string{"trace": "abc"}, CorrelationID: corr}
	}
	before := counter.n.Load()
	if err := outbox.Write(ctx, tx, msgs...); err != nil {
		t.Fatal(err)
	}
	if n := counter.n.Load() - before; n != 1 {
		t.Fatalf("500 messages took %d statements, want 1", n)
	}
	for i, m := range msgs {
		if m.ID == uuid.Nil {
			t.Fatalf("message %d got no id", i)
		}
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n := count(t, db, `SELECT count(*) FROM outbox`); n != 0 {
		t.Fatalf("a rolled-back Write left %d rows", n)
	}

	tx, _ = conn.Begin(ctx)
	raw := json.RawMessage(`{"brief_id":"x"}`)
	if err := outbox.Write(ctx, tx, outbox.Message{EventType: "a", Payload: raw}, outbox.Message{EventType: "b"}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var payload, headers string
	var tenantNull bool
	if err := db.Pool.QueryRow(ctx, `SELECT payload::text, headers::text, tenant_id IS NULL FROM outbox WHERE event_type = 'a'`).
		Scan(&payload, &headers, &tenantNull); err != nil {
		t.Fatal(err)
	}
	if payload != `{"brief_id": "x"}` || headers != "{}" || !tenantNull {
		t.Fatalf("row: payload %s headers %s tenant null %v", payload, headers, tenantNull)
	}

	tx, _ = conn.Begin(ctx)
	defer tx.Rollback(ctx)
	err = outbox.Write(ctx, tx, outbox.Message{EventType: "bad", Payload: json.RawMessage(`{not json`)})
	if err == nil || !strings.Contains(err.Error(), "not valid JSON") {
		t.Fatalf("invalid JSON payload: %v", err)
	}
	if err := outbox.Write(ctx, tx, outbox.Message{Payload: 1}); err == nil || !strings.Contains(err.Error(), "EventType") {
		t.Fatalf("missing event type: %v", err)
	}
}
