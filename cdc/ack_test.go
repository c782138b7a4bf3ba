package cdc_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/compensa/compensa/cdc"
	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/testkit"
)

// A sink that fails leaves the batch unacknowledged; the stream reconnects
// and replays it until the sink takes it.
func TestSinkFailureReplaysTheBatch(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	sink := newSink(t, db.Pool)
	var failures, attempts atomic.Int32
	failures.Store(2)
	var commitLSN atomic.Uint64
	sink.setBefore(func(_ context.Context, b cdc.Batch) error {
		if len(b.Events) == 0 {
			return nil
		}
		attempts.Add(1)
		commitLSN.Store(uint64(b.CommitLSN))
		if failures.Add(-1) >= 0 {
			return errors.New("sink unavailable")
		}
		return nil
	})
	startStream(t, baseConfig(t, db), sink)
	testkit.WaitFor(t, 20*time.Second, "first checkpoint", func() bool { return checkpointLSN(t, db.Pool, db.Slot) != 0 })

	ids := writeEvents(t, db.Pool, 3, "order.placed")
	deadline := time.Now().Add(30 * time.Second)
	for handledCounts(t, db.Pool)[ids[0]] == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the batch was never handled")
		}
		// Until the sink took the batch, PostgreSQL was never told it was
		// flushed.
		if c := commitLSN.Load(); c != 0 && failures.Load() >= 0 {
			if confirmed, _ := slotState(t, db.Pool, db.Slot); confirmed > pglogrepl.LSN(c) {
				t.Fatalf("confirmed_flush_lsn %s passed the failing batch at %s", confirmed, pglogrepl.LSN(c))
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := attempts.Load(); n != 3 {
		t.Fatalf("the sink saw the batch %d times, want 3 (two failures, then success)", n)
	}
	assertExactlyOnce(t, db.Pool, ids)
	testkit.WaitFor(t, 10*time.Second, "confirmed_flush_lsn past the handled batch", func() bool {
		c, _ := slotState(t, db.Pool, db.Slot)
		return c > pglogrepl.LSN(commitLSN.Load())
	})
}

// A sink error that wraps ErrStop ends Run with it instead of a replay.
func TestSinkCanStopTheStream(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	sink := newSink(t, db.Pool)
	sink.setBefore(func(_ context.Context, b cdc.Batch) error {
		if len(b.Events) > 0 {
			return fmt.Errorf("%w: the schema is too old", cdc.ErrStop)
		}
		return nil
	})
	r := startStream(t, baseConfig(t, db), sink)
	testkit.WaitFor(t, 20*time.Second, "first checkpoint", func() bool { return checkpointLSN(t, db.Pool, db.Slot) != 0 })
	writeEvents(t, db.Pool, 1, "x")
	err, done := r.wait(20 * time.Second)
	if !done || !errors.Is(err, cdc.ErrStop) || !strings.Contains(err.Error(), "the schema is too old") {
		t.Fatalf("Run = %v (returned %t), want the sink's ErrStop", err, done)
	}
}

// While the sink holds a batch, neither keepalives nor heartbeats nor WAL
// from other tables move the slot past it; a crash at that moment replays it.
//
// The slot may stand exactly at the held transaction's commit record: a
// keepalive sent after the walsender read the transaction's last change but
// before it decoded the commit reports that position while, on our side, no
// transaction is open. PostgreSQL skips on restart only the transactions
// whose commit record begins before confirmed_flush_lsn, so this one is
// replayed, which the end of the test checks.
func TestAckNeverPassesABatchInFlight(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	sink := newSink(t, db.Pool)
	release := make(chan struct{})
	var held atomic.Uint64
	sink.setBefore(func(ctx context.Context, b cdc.Batch) error {
		if len(b.Events) == 0 {
			return nil
		}
		held.Store(uint64(b.CommitLSN))
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	cfg := baseConfig(t, db)
	first := startStream(t, cfg, sink)
	testkit.WaitFor(t, 20*time.Second, "first checkpoint", func() bool { return checkpointLSN(t, db.Pool, db.Slot) != 0 })

	ids := writeEvents(t, db.Pool, 5, "order.placed")
	testkit.WaitFor(t, 10*time.Second, "the sink to hold the batch", func() bool { return held.Load() != 0 })
	exec(t, db.Pool, `CREATE TABLE other (id int, pad text)`)
	for i := range 20 {
		exec(t, db.Pool, `INSERT INTO other SELECT g, repeat('x', 200) FROM generate_series(1, 500) g`)
		_ = i
		time.Sleep(50 * time.Millisecond) // heartbeats and status updates flow meanwhile
		if c, _ := slotState(t, db.Pool, db.Slot); c > pglogrepl.LSN(held.Load()) {
			t.Fatalf("confirmed_flush_lsn %s passed the batch in flight at %s", c, pglogrepl.LSN(held.Load()))
		}
	}
	first.crash(t)
	if c, _ := slotState(t, db.Pool, db.Slot); c > pglogrepl.LSN(held.Load()) {
		t.Fatalf("after the crash confirmed_flush_lsn %s is past the unhandled batch at %s", c, pglogrepl.LSN(held.Load()))
	}
	if n := countHandled(t, db.Pool); n != 0 {
		t.Fatalf("%d events handled while the sink held them", n)
	}

	close(release)
	startStream(t, cfg, sink)
	testkit.WaitFor(t, 20*time.Second, "the replayed batch", func() bool { return countHandled(t, db.Pool) == len(ids) })
	assertExactlyOnce(t, db.Pool, ids)
}

// Events committed while the relay is down, after a clean stop or a crash,
// are all delivered on restart, none twice.
func TestRestartResumesWithoutLoss(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	sink := newSink(t, db.Pool)
	cfg, logs := baseConfigLogs(t, db)
	var all []uuidT
	r := startStream(t, cfg, sink)
	for range 5 {
		all = append(all, writeEvents(t, db.Pool, 10, "a")...)
	}
	testkit.WaitFor(t, 20*time.Second, "first events", func() bool { return countHandled(t, db.Pool) == len(all) })
	if err := r.stop(t); err != nil {
		t.Fatalf("clean stop: Run returned %v", err)
	}
	for range 5 {
		all = append(all, writeEvents(t, db.Pool, 10, "b")...)
	}
	r = startStream(t, cfg, sink)
	testkit.WaitFor(t, 20*time.Second, "events written while stopped", func() bool { return countHandled(t, db.Pool) == len(all) })
	if !strings.Contains(logs.String(), "resuming") || !strings.Contains(logs.String(), "checkpoint=") {
		t.Fatalf("the restart did not log the checkpoint against the slot's position:\n%s", logs.String())
	}

	// A crash while events keep coming.
	prod := startProducer(db.Pool, 3, 5*time.Millisecond)
	time.Sleep(300 * time.Millisecond)
	r.crash(t)
	time.Sleep(200 * time.Millisecond)
	startStream(t, cfg, sink)
	time.Sleep(300 * time.Millisecond)
	all = append(all, prod.finish(t)...)
	testkit.WaitFor(t, 30*time.Second, "every event", func() bool { return countHandled(t, db.Pool) == len(all) })
	assertExactlyOnce(t, db.Pool, all)
}

// With periodic status updates effectively off, the stream still answers
// the server's reply-requested keepalives: a 2 s wal_sender_timeout never
// cuts it, and the slot advances after a batch.
func TestRepliesWhenTheServerAsks(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	sink := newSink(t, db.Pool)
	cfg, logs := baseConfigLogs(t, db)
	cfg.DatabaseURL = db.URL + "&options=-c%20wal_sender_timeout%3D2s"
	cfg.StatusInterval = time.Hour
	cfg.HeartbeatInterval = time.Hour
	startStream(t, cfg, sink)
	testkit.WaitFor(t, 20*time.Second, "first checkpoint", func() bool { return checkpointLSN(t, db.Pool, db.Slot) != 0 })
	ids := writeEvents(t, db.Pool, 3, "x")
	testkit.WaitFor(t, 10*time.Second, "events", func() bool { return countHandled(t, db.Pool) == 3 })
	var end pglogrepl.LSN
	for _, b := range sink.snapshot() {
		if len(b.Events) == 0 && !b.Snapshot {
			continue
		}
		end = max(end, b.EndLSN)
	}
	time.Sleep(5 * time.Second) // more than two wal_sender_timeouts
	if strings.Contains(logs.String(), "reconnecting") {
		t.Fatalf("the walsender timed the stream out:\n%s", logs.String())
	}
	if c, active := slotState(t, db.Pool, db.Slot); !active || c < end {
		t.Fatalf("slot active %t confirmed %s; want active and past the batch at %s", active, c, end)
	}
	assertExactlyOnce(t, db.Pool, ids)
}

// A stream waiting for the next message stops as soon as it is told to,
// however long it would otherwise wait before its next status update.
func TestStopInterruptsTheWaitForTheNextMessage(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	sink := newSink(t, db.Pool)
	cfg := baseConfig(t, db)
	cfg.StatusInterval = time.Hour
	cfg.HeartbeatInterval = time.Hour
	r := startStream(t, cfg, sink)
	ids := writeEvents(t, db.Pool, 2, "x")
	testkit.WaitFor(t, 20*time.Second, "events", func() bool { return countHandled(t, db.Pool) == 2 })
	time.Sleep(200 * time.Millisecond) // waiting for a message now
	began := time.Now()
	if err := r.stop(t); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v", err)
	}
	if took := time.Since(began); took > 5*time.Second {
		t.Fatalf("Run returned %s after cancel, want promptly (the next status update is an hour away)", took)
	}
	assertExactlyOnce(t, db.Pool, ids)
}
