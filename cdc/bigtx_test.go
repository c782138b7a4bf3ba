package cdc_test

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/compensa/compensa/cdc"
	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/testkit"
)

// A transaction of 100,000 rows (about 100 MB of payload) goes through in
// parts of MaxBatchEvents with bounded memory; the checkpoint and the slot
// reach the transaction's end only with its last part. Not parallel: it
// measures this process's heap.
func TestHugeTransactionInBoundedParts(t *testing.T) {
	testkit.SkipShort(t, "streams a transaction of hundreds of thousands of rows")
	db := pgtest.NewDB(t)
	sink := newSink(t, db.Pool)
	const rows, part = 100_000, 5000
	var early atomic.Value
	sink.setBefore(func(ctx context.Context, b cdc.Batch) error {
		if !b.Partial {
			return nil
		}
		// While parts are handed over, nothing of the transaction may be
		// checkpointed or acknowledged. The checkpoint may stand exactly at
		// CommitLSN (a keepalive that came before the transaction's first
		// part): PostgreSQL replays a transaction whose commit record starts
		// at the confirmed position, and only a checkpoint at or past EndLSN
		// means "handled".
		if ck := checkpointLSN(t, db.Pool, db.Slot); ck >= b.EndLSN {
			early.Store(fmt.Sprintf("checkpoint %s reached the transaction at %s before its last part", ck, b.CommitLSN))
		}
		if c, _ := slotState(t, db.Pool, db.Slot); c > b.CommitLSN {
			early.Store(fmt.Sprintf("confirmed_flush_lsn %s passed the transaction at %s before its last part", c, b.CommitLSN))
		}
		return nil
	})
	cfg := baseConfig(t, db)
	cfg.MaxBatchEvents = part
	startStream(t, cfg, sink)
	testkit.WaitFor(t, 20*time.Second, "first checkpoint", func() bool { return checkpointLSN(t, db.Pool, db.Slot) != 0 })

	runtime.GC()
	var base runtime.MemStats
	runtime.ReadMemStats(&base)
	var peak atomic.Uint64
	stopSampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		var m runtime.MemStats
		for {
			select {
			case <-stopSampling:
				return
			case <-time.After(25 * time.Millisecond):
			}
			runtime.ReadMemStats(&m)
			if m.HeapAlloc > peak.Load() {
				peak.Store(m.HeapAlloc)
			}
		}
	}()
	exec(t, db.Pool, `INSERT INTO outbox (id, event_type, payload)
		SELECT gen_random_uuid(), 'bulk', jsonb_build_object('i', g, 'pad', repeat('x', 1000))
		FROM generate_series(1, $1::int) g`, rows)
	testkit.WaitFor(t, 120*time.Second, "every row", func() bool { return countHandled(t, db.Pool) == rows })
	// The last part may hold no rows (here 100,000 is a multiple of the
	// part size): every row is handled before the final batch arrives.
	testkit.WaitFor(t, 20*time.Second, "the transaction's final batch", func() bool {
		var partAt pglogrepl.LSN
		for _, b := range sink.snapshot() {
			if b.Partial {
				partAt = b.CommitLSN
			} else if partAt != 0 && b.CommitLSN == partAt && !b.Heartbeat && !b.Snapshot {
				return true
			}
		}
		return false
	})
	close(stopSampling)
	<-sampled
	if msg := early.Load(); msg != nil {
		t.Fatal(msg)
	}
	var parts, finals int
	var final cdc.Batch
	for _, b := range sink.snapshot() {
		switch {
		case b.Partial:
			parts++
			if b.EndLSN != b.CommitLSN+1 {
				t.Fatalf("a part has EndLSN %s, want CommitLSN+1 = %s", b.EndLSN, b.CommitLSN+1)
			}
		case b.CommitLSN != 0 && !b.Heartbeat && !b.Snapshot:
			finals++
			final = b
		}
	}
	if parts != rows/part || finals != 1 || sink.maxLen > part {
		t.Fatalf("%d parts and %d final batches (largest %d events), want %d parts of at most %d and 1 final", parts, finals, sink.maxLen, rows/part, part)
	}
	if ck := checkpointLSN(t, db.Pool, db.Slot); ck < final.EndLSN {
		t.Fatalf("checkpoint %s is short of the transaction's end %s", ck, final.EndLSN)
	}
	testkit.WaitFor(t, 10*time.Second, "confirmed_flush_lsn at the transaction's end", func() bool {
		c, _ := slotState(t, db.Pool, db.Slot)
		return c >= final.EndLSN
	})
	grew := int64(peak.Load()) - int64(base.HeapAlloc)
	t.Logf("100,000 rows of about 1 KB: heap grew by at most %d MB", grew>>20)
	if grew > 64<<20 {
		t.Fatalf("heap grew by %d MB while streaming 100 MB in parts of %d: memory is not bounded", grew>>20, part)
	}
}

// A crash between the parts of a large transaction replays it whole; every
// row arrives and the checkpoint ends at the transaction's end.
func TestCrashBetweenPartsReplaysTheTransaction(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	sink := newSink(t, db.Pool)
	cfg := baseConfig(t, db)
	cfg.MaxBatchEvents = 1000
	var parts atomic.Int32
	crashed := make(chan struct{})
	sink.setBefore(func(ctx context.Context, b cdc.Batch) error {
		if b.Partial && parts.Add(1) == 3 {
			close(crashed)
			<-ctx.Done() // the crash abandons this part
			return ctx.Err()
		}
		return nil
	})
	r := startStream(t, cfg, sink)
	testkit.WaitFor(t, 20*time.Second, "first checkpoint", func() bool { return checkpointLSN(t, db.Pool, db.Slot) != 0 })
	exec(t, db.Pool, `INSERT INTO outbox (id, event_type, payload) SELECT gen_random_uuid(), 'bulk', '{}' FROM generate_series(1, 10000)`)
	<-crashed
	r.crash(t)
	if n := countHandled(t, db.Pool); n != 2000 {
		t.Fatalf("%d rows handled before the crash, want the first two parts (2000)", n)
	}
	sink.setBefore(nil)
	startStream(t, cfg, sink)
	testkit.WaitFor(t, 30*time.Second, "every row", func() bool { return countHandled(t, db.Pool) == 10000 })
	var replayed int
	if err := db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM cdc_handled WHERE n > 1`).Scan(&replayed); err != nil {
		t.Fatal(err)
	}
	if replayed != 2000 {
		t.Fatalf("%d rows handled twice, want the 2000 of the parts before the crash (absorbed by unique indexes in the correlator)", replayed)
	}
}
