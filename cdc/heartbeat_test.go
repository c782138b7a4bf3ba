package cdc_test

import (
	"context"
	"testing"
	"time"

	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/testkit"
)

// With the outbox idle and another table writing 256 MB of WAL, the relay
// keeps the slot's confirmed position close behind the server's, so that
// PostgreSQL releases the WAL the slot retained (pg_current_wal_lsn() −
// restart_lsn), and its heartbeats move the sink's checkpoint.
//
// The relay's part is the confirmation: of the empty transactions the other
// table's writes decode to, and of heartbeats when nothing arrives at all.
// How far restart_lsn then trails is PostgreSQL's part: it moves only to a
// record of the running transactions (logged at the end of each checkpoint
// and every 15 s), and not past one while a transaction that began before it
// is still open, as the writer's often is. Under a loaded machine's slow
// checkpoints that is several checkpoint intervals, so the test bounds the
// confirmation lag while the writer runs, and the retained WAL once it has
// stopped and a checkpoint has logged the running transactions. The cluster
// is the test's own, with checkpoints about every 16 MB as a busy server's
// would come; the writer keeps to 10 MB/s (36 GB an hour, a heavy load).
func TestHeartbeatKeepsSlotAdvancingWhileOutboxIdle(t *testing.T) {
	testkit.SkipShort(t, "watches an idle slot across heartbeats")
	t.Parallel()
	db := privateDB(t, map[string]string{"max_wal_size": "32MB", "min_wal_size": "32MB"})
	sink := newSink(t, db.Pool)
	cfg := baseConfig(t, db)
	cfg.HeartbeatInterval = 100 * time.Millisecond
	r := startStream(t, cfg, sink)
	testkit.WaitFor(t, 20*time.Second, "first checkpoint", func() bool { return checkpointLSN(t, db.Pool, db.Slot) != 0 })
	ctx := context.Background()
	exec(t, db.Pool, `CREATE TABLE filler (id bigserial, pad text)`)
	var from int64
	if err := db.Pool.QueryRow(ctx, `SELECT pg_current_wal_lsn() - '0/0'::pg_lsn`).Scan(&from); err != nil {
		t.Fatal(err)
	}
	ckpt0 := checkpointLSN(t, db.Pool, db.Slot)
	const target, limit, settled, rate = 256 << 20, 64 << 20, 16 << 20, 10 << 20
	var written, worstLag, worstRetained int64
	began := time.Now()
	for written < target {
		exec(t, db.Pool, `INSERT INTO filler (pad) SELECT repeat(md5(g::text), 30) FROM generate_series(1, 4000) g`)
		now, lag, retained := slotDistances(t, db)
		written = now - from
		worstLag, worstRetained = max(worstLag, lag), max(worstRetained, retained)
		if ahead := time.Duration(float64(written)/rate*float64(time.Second)) - time.Since(began); ahead > 0 {
			time.Sleep(ahead)
		}
	}
	t.Logf("wrote %d MB of WAL in %s; confirmed_flush_lsn trailed by at most %d MB, the slot retained at most %d MB",
		written>>20, time.Since(began).Round(time.Millisecond), worstLag>>20, worstRetained>>20)
	if worstLag >= limit {
		t.Fatalf("confirmed_flush_lsn trailed the server by up to %d MB while the outbox was idle, want < %d MB", worstLag>>20, limit>>20)
	}
	testkit.WaitFor(t, 30*time.Second, "the slot to release the idle WAL", func() bool {
		exec(t, db.Pool, `CHECKPOINT`)
		_, _, retained := slotDistances(t, db)
		return retained < settled
	})
	if n := countHandled(t, db.Pool); n != 0 {
		t.Fatalf("%d events handled from an idle outbox", n)
	}
	if ckpt := checkpointLSN(t, db.Pool, db.Slot); ckpt <= ckpt0 {
		t.Fatalf("the checkpoint did not move (%s): heartbeats did not reach the sink", ckpt)
	}
	heartbeats := 0
	for _, b := range sink.snapshot() {
		if b.Heartbeat {
			heartbeats++
		}
	}
	if heartbeats == 0 {
		t.Fatal("no heartbeat batch reached the sink")
	}
	lag := r.s.Lag()
	if !lag.Leader || lag.LastCommit.IsZero() || lag.Seconds > 10 {
		t.Fatalf("Lag() = %+v: want leader with a recent commit", lag)
	}
}

// slotDistances reads the server's WAL position and how far db's slot trails
// it: its confirmed position (lag) and the WAL it retains.
func slotDistances(t *testing.T, db *pgtest.DB) (now, lag, retained int64) {
	t.Helper()
	err := db.Pool.QueryRow(context.Background(), `SELECT pg_current_wal_lsn() - '0/0'::pg_lsn,
			pg_current_wal_lsn() - confirmed_flush_lsn, pg_current_wal_lsn() - restart_lsn
		FROM pg_replication_slots WHERE slot_name = $1`, db.Slot).Scan(&now, &lag, &retained)
	if err != nil {
		t.Fatal(err)
	}
	return now, lag, retained
}
