package correlator

import (
	"context"
	"testing"
	"time"

	"github.com/compensa/compensa/test/pgtest"
)

// TestWaitVisibleWaitsForTheTriggersTransaction: a batch does not start
// instances while a trigger's transaction is not visible to a new snapshot,
// and goes on as soon as it is.
func TestWaitVisibleWaitsForTheTriggersTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	trig, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer trig.Rollback(ctx)
	var xid64 int64
	if err := trig.QueryRow(ctx, `SELECT pg_current_xact_id()::text::bigint`).Scan(&xid64); err != nil {
		t.Fatal(err)
	}
	xid := xid64 & 0xffffffff

	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := waitVisible(ctx, tx, []int64{xid}, 300*time.Millisecond); err == nil {
		t.Fatal("an open transaction was taken as visible")
	}
	committed := make(chan error, 1)
	go func() {
		time.Sleep(200 * time.Millisecond)
		committed <- trig.Commit(ctx)
	}()
	began := time.Now()
	if err := waitVisible(ctx, tx, []int64{xid}, 10*time.Second); err != nil {
		t.Fatalf("a committed transaction: %v", err)
	}
	if took := time.Since(began); took < 150*time.Millisecond {
		t.Fatalf("returned after %s, before the commit", took)
	}
	if err := <-committed; err != nil {
		t.Fatal(err)
	}
	// Long-committed transactions (and a batch without xids) pass at once.
	if err := waitVisible(ctx, tx, []int64{3, xid}, time.Millisecond); err != nil {
		t.Fatal(err)
	}
}
