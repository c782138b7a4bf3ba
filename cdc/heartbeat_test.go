package cdc_test

import (
	"context"
	"testing"
	"time"

	"github.com/compensa/compensa/test/testkit"
)

// With the outbox idle and another table writing 256 MB of WAL, heartbeats
// keep the slot's retained WAL (pg_current_wal_lsn() − restart_lsn) small.
//
// PostgreSQL moves a slot's restart_lsn only where it logged the running
// transactions: at checkpoints and every 15 s from the background writer.
// However promptly the relay confirms, a slot retains the WAL written since
// the last such record; the test runs on a cluster of its own whose
// max_wal_size makes checkpoints come about every 16 MB, as a busy
// production server's would, and which no other test writes to. The writer
// keeps to 10 MB/s (36 GB an hour, a heavy load) so that the checkpointer
// keeps its pace.
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
	const target, limit, rate = 256 << 20, 64 << 20, 10 << 20
	var written, worst int64
	began := time.Now()
	for written < target {
		exec(t, db.Pool, `INSERT INTO filler (pad) SELECT repeat(md5(g::text), 30) FROM generate_series(1, 4000) g`)
		var now, retained int64
		err := db.Pool.QueryRow(ctx, `SELECT pg_current_wal_lsn() - '0/0'::pg_lsn, pg_current_wal_lsn() - restart_lsn
			FROM pg_replication_slots WHERE slot_name = $1`, db.Slot).Scan(&now, &retained)
		if err != nil {
			t.Fatal(err)
		}
		written = now - from
		worst = max(worst, retained)
		if ahead := time.Duration(float64(written)/rate*float64(time.Second)) - time.Since(began); ahead > 0 {
			time.Sleep(ahead)
		}
	}
	t.Logf("wrote %d MB of WAL in %s; the slot retained at most %d MB", written>>20, time.Since(began).Round(time.Millisecond), worst>>20)
	if worst >= limit {
		t.Fatalf("the slot retained up to %d MB of WAL while the outbox was idle, want < %d MB", worst>>20, limit>>20)
	}
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
