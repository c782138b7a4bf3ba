package cdc_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/compensa/compensa/cdc"
	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/testkit"
)

// A slot dropped under a running relay that has a checkpoint stops it with
// ErrSlotLost; it is not re-created, unless RecreateSlot says so.
func TestDroppedSlotIsFatalAndNotRecreated(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	sink := newSink(t, db.Pool)
	cfg := baseConfig(t, db)
	r := startStream(t, cfg, sink)
	ids := writeEvents(t, db.Pool, 3, "before")
	testkit.WaitFor(t, 20*time.Second, "events", func() bool { return countHandled(t, db.Pool) == len(ids) })
	ctx := context.Background()

	// The relay reconnects at once, so terminate its walsender and drop
	// until the drop wins.
	testkit.WaitFor(t, 20*time.Second, "the slot to be dropped", func() bool {
		db.Pool.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, db.Slot)
		_, err := db.Pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, db.Slot)
		return err == nil
	})
	lost := writeEvents(t, db.Pool, 2, "while-gone")
	err, done := r.wait(20 * time.Second)
	if !done {
		t.Fatal("Run goes on after its slot was dropped")
	}
	if !errors.Is(err, cdc.ErrSlotLost) {
		t.Fatalf("Run returned %v, want ErrSlotLost", err)
	}
	for _, want := range []string{db.Slot, "skipped", "--recreate-slot"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, db.Slot).Scan(&n); err != nil || n != 0 {
		t.Fatalf("slot re-created (count %d, err %v)", n, err)
	}
	if err := cdc.Preflight(ctx, db.Pool, cfg); !errors.Is(err, cdc.ErrSlotLost) {
		t.Fatalf("Preflight = %v, want ErrSlotLost", err)
	}
	// A second Run refuses too, without creating anything.
	if err, _ := startStream(t, cfg, sink).wait(20 * time.Second); !errors.Is(err, cdc.ErrSlotLost) {
		t.Fatalf("second Run = %v, want ErrSlotLost", err)
	}

	// The operator's explicit choice: re-create. Rows still in the table
	// are re-read, so the events committed while the slot was gone arrive.
	cfg.RecreateSlot = true
	startStream(t, cfg, sink)
	testkit.WaitFor(t, 20*time.Second, "events committed while the slot was gone", func() bool {
		got := handledCounts(t, db.Pool)
		return got[lost[0]] >= 1 && got[lost[1]] >= 1
	})
	after := writeEvents(t, db.Pool, 2, "after")
	testkit.WaitFor(t, 20*time.Second, "events after re-creation", func() bool {
		got := handledCounts(t, db.Pool)
		return got[after[0]] == 1 && got[after[1]] == 1
	})
}

// PostgreSQL's own recipe for an invalidated slot: a small
// max_slot_wal_keep_size, pg_switch_wal() and CHECKPOINT until wal_status
// is 'lost'. The relay stops with ErrSlotLost and leaves the slot alone.
// The setting is cluster-wide: the test has a cluster of its own.
func TestInvalidatedSlotIsFatal(t *testing.T) {
	testkit.SkipShort(t, "fills the WAL until the slot is invalidated")
	t.Parallel()
	db := privateDB(t, nil)
	sink := newSink(t, db.Pool)
	cfg := baseConfig(t, db)
	r := startStream(t, cfg, sink)
	ids := writeEvents(t, db.Pool, 3, "before")
	testkit.WaitFor(t, 20*time.Second, "events", func() bool { return countHandled(t, db.Pool) == len(ids) })
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	exec(t, db.Pool, `ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'`)
	exec(t, db.Pool, `SELECT pg_reload_conf()`)
	t.Cleanup(func() {
		db.Pool.Exec(ctx, `ALTER SYSTEM RESET max_slot_wal_keep_size`)
		db.Pool.Exec(ctx, `SELECT pg_reload_conf()`)
	})
	exec(t, db.Pool, `CREATE TABLE filler (pad text)`)
	testkit.WaitFor(t, 60*time.Second, "wal_status 'lost'", func() bool {
		exec(t, db.Pool, `INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 2000)`)
		exec(t, db.Pool, `SELECT pg_switch_wal()`)
		exec(t, db.Pool, `CHECKPOINT`)
		var status string
		db.Pool.QueryRow(ctx, `SELECT coalesce(wal_status, '') FROM pg_replication_slots WHERE slot_name = $1`, db.Slot).Scan(&status)
		return status == "lost"
	})
	if err := cdc.Preflight(ctx, db.Pool, cfg); !errors.Is(err, cdc.ErrSlotLost) {
		t.Fatalf("Preflight = %v, want ErrSlotLost", err)
	}
	err, done := startStream(t, cfg, sink).wait(20 * time.Second)
	if !done || !errors.Is(err, cdc.ErrSlotLost) {
		t.Fatalf("Run = %v (returned: %t), want ErrSlotLost", err, done)
	}
	if !strings.Contains(err.Error(), "invalidated") || !strings.Contains(err.Error(), db.Slot) {
		t.Fatalf("error %q does not say the slot %s was invalidated", err, db.Slot)
	}
	var status string
	if err := db.Pool.QueryRow(ctx, `SELECT coalesce(wal_status, '') FROM pg_replication_slots WHERE slot_name = $1`, db.Slot).Scan(&status); err != nil || status != "lost" {
		t.Fatalf("the slot was touched: wal_status %q, err %v", status, err)
	}
}
