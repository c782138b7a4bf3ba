package cdc_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/compensa/compensa/cdc"
	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/testkit"
)

// Small transactions that queue up while the sink is busy reach it merged,
// in order, each exactly once, and bounded by MaxBatchEvents.
func TestSmallTransactionsMergeWhileTheSinkIsBusy(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	sink := newSink(t, db.Pool)
	sink.keep = true
	gate := make(chan struct{})
	sink.setBefore(func(ctx context.Context, b cdc.Batch) error {
		if len(b.Events) > 0 {
			select { // hold the first batch with events until the backlog exists
			case <-gate:
			case <-ctx.Done():
			}
		}
		return nil
	})
	cfg := baseConfig(t, db)
	cfg.MaxBatchEvents = 50
	r := startStream(t, cfg, sink)
	var want []uuid.UUID
	want = append(want, writeEvents(t, db.Pool, 1, "first")...)
	time.Sleep(300 * time.Millisecond) // the first transaction reaches the sink and waits at the gate
	for i := 0; i < 200; i++ {
		want = append(want, writeEvents(t, db.Pool, 1, "queued")...)
	}
	time.Sleep(500 * time.Millisecond) // let the stream decode the backlog
	close(gate)
	testkit.WaitFor(t, 30*time.Second, "all 201 events", func() bool { return countHandled(t, db.Pool) == len(want) })
	assertExactlyOnce(t, db.Pool, want)

	merged, maxTx := 0, 0
	for _, b := range sink.snapshot() {
		if b.Transactions > 1 {
			merged++
		}
		maxTx = max(maxTx, b.Transactions)
	}
	if merged == 0 {
		// Whether transactions queue depends on how fast the walsender
		// decodes on a loaded machine; exactly once and order are what must
		// hold. The benchmark measures how much merging happens.
		t.Log("no batch merged several transactions this time (the stream kept up)")
	}
	if sink.maxLen > cfg.MaxBatchEvents {
		t.Fatalf("a batch held %d events, above MaxBatchEvents %d", sink.maxLen, cfg.MaxBatchEvents)
	}
	got := sink.kept()
	for i := range got {
		if got[i].ID != want[i] {
			t.Fatalf("event %d out of order", i)
		}
	}
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d merged batches, up to %d transactions in one", merged, maxTx)
}
