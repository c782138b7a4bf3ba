package cdc_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/testkit"
)

func TestCommittedTransactionIsDeliveredRolledBackIsNot(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	sink := newSink(t, db.Pool)
	startStream(t, baseConfig(t, db), sink)
	ctx := context.Background()

	// The stream has taken its snapshot and streams once a checkpoint exists.
	testkit.WaitFor(t, 20*time.Second, "first checkpoint", func() bool { return checkpointLSN(t, db.Pool, db.Slot) != 0 })

	rolledBack := uuid.New()
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	exec(t, db.Pool, `SELECT 1`)
	if _, err := tx.Exec(ctx, `INSERT INTO research_briefs (tenant_id, title) VALUES ($1, 'rolled back')`, uuid.New()); err != nil {
		t.Fatal(err)
	}
	if err := outbox.Write(ctx, tx, outbox.Message{ID: rolledBack, EventType: "research_brief.created", Payload: map[string]string{"x": "y"}}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	committed := uuid.New()
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO research_briefs (tenant_id, title) VALUES ($1, 'committed')`, uuid.New()); err != nil {
			return err
		}
		return outbox.Write(ctx, tx, outbox.Message{ID: committed, EventType: "research_brief.created", Payload: map[string]string{"brief_id": "b"}})
	})
	if err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 20*time.Second, "the committed event", func() bool { return handledCounts(t, db.Pool)[committed] == 1 })
	got := handledCounts(t, db.Pool)
	if _, ok := got[rolledBack]; ok {
		t.Fatalf("the rolled-back event was delivered")
	}
	if len(got) != 1 {
		t.Fatalf("handled %d events, want 1", len(got))
	}
}
