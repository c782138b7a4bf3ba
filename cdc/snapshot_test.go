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

// First start: 1,000 rows committed before the relay ever ran, and a
// producer writing while it creates its slot. The slot's exported snapshot
// and the stream from its consistent point meet exactly: every row is
// handled once.
func TestFirstStartHandlesRowsWrittenBeforeTheSlot(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	sink := newSink(t, db.Pool)
	var before []uuid.UUID
	for range 10 {
		before = append(before, writeEvents(t, db.Pool, 100, "early")...)
	}
	prod := startProducer(db.Pool, 2, 2*time.Millisecond)
	time.Sleep(100 * time.Millisecond)
	startStream(t, baseConfig(t, db), sink)
	testkit.WaitFor(t, 20*time.Second, "first checkpoint", func() bool { return checkpointLSN(t, db.Pool, db.Slot) != 0 })
	time.Sleep(500 * time.Millisecond)
	during := prod.finish(t)
	all := append(append([]uuid.UUID(nil), before...), during...)
	testkit.WaitFor(t, 30*time.Second, "every row", func() bool { return countHandled(t, db.Pool) >= len(all) })
	assertExactlyOnce(t, db.Pool, all)

	var viaSnapshot, viaStream int
	err := db.Pool.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE snapshot), count(*) FILTER (WHERE NOT snapshot) FROM cdc_handled`).Scan(&viaSnapshot, &viaStream)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d rows before the start, %d written during it: %d via the snapshot, %d via the stream", len(before), len(during), viaSnapshot, viaStream)
	if viaSnapshot < len(before) || viaStream == 0 {
		t.Fatalf("%d rows via the snapshot and %d via the stream: want all %d early rows from the snapshot and some from the stream", viaSnapshot, viaStream, len(before))
	}
}

// Setup (relay migrate --create-slot) creates the publication and the slot;
// rows written between it and the first Run are handled, as are the older
// ones. Setup is idempotent.
func TestSetupThenFirstRunMissesNothing(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := context.Background()
	older := writeEvents(t, db.Pool, 20, "older")
	cfg := baseConfig(t, db)
	for range 2 {
		if err := cdc.Setup(ctx, db.Pool, cfg); err != nil {
			t.Fatalf("Setup: %v", err)
		}
	}
	if c, active := slotState(t, db.Pool, db.Slot); c == 0 || active {
		t.Fatalf("slot after Setup: confirmed %s active %t", c, active)
	}
	between := writeEvents(t, db.Pool, 30, "between")
	sink := newSink(t, db.Pool)
	startStream(t, cfg, sink)
	testkit.WaitFor(t, 20*time.Second, "the table read", func() bool { return checkpointLSN(t, db.Pool, db.Slot) != 0 })
	after := writeEvents(t, db.Pool, 10, "after")
	all := append(append(append([]uuid.UUID(nil), older...), between...), after...)
	waitHandled(t, db.Pool, "every row", all)
	// Rows written after Setup come through the table read and the slot;
	// the correlator's unique indexes absorb that overlap.
	got := handledCounts(t, db.Pool)
	for _, id := range append(append([]uuid.UUID(nil), older...), after...) {
		if got[id] != 1 {
			t.Fatalf("event %s handled %d times, want once", id, got[id])
		}
	}
}
