package cdc

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/compensa/compensa/internal/pgcluster"
	"github.com/compensa/compensa/test/testkit"
)

// With a standby named in synchronized_standby_slots, a position is passed
// only once that standby's physical slot has flushed the WAL written when
// the position was offered; without one, every position passes at once.
func TestStandbyGateHoldsBackUntilTheStandbyHasTheWAL(t *testing.T) {
	testkit.SkipShort(t, "needs PostgreSQL 17 from npm")
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := pgcluster.Start(ctx, pgcluster.Options{Version: failoverMajor})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	pool, err := pgxpool.New(ctx, c.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	exec := func(sql string) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	currentWAL := func() pglogrepl.LSN {
		t.Helper()
		var s string
		if err := pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		l, err := pglogrepl.ParseLSN(s)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}

	start := currentWAL()
	g := newStandbyGate(ctx, pool, start)
	if !g.open.Load() {
		t.Fatal("the gate holds back although no standby is named")
	}
	exec(`CREATE TABLE IF NOT EXISTS gate_work (n int)`)
	exec(`INSERT INTO gate_work VALUES (1)`)
	if at := currentWAL(); g.pass(at) != at {
		t.Fatal("without synchronized_standby_slots a position must pass at once")
	}

	// A standby's slot that stays where it is: the standby has nothing past it.
	exec(`SELECT pg_create_physical_replication_slot('gate_standby', true)`)
	exec(`ALTER SYSTEM SET synchronized_standby_slots = 'gate_standby'`)
	exec(`SELECT pg_reload_conf()`)
	deadline := time.Now().Add(10 * time.Second)
	for g.poll(ctx); g.open.Load(); g.poll(ctx) {
		if time.Now().After(deadline) {
			t.Fatal("the gate did not see synchronized_standby_slots")
		}
		time.Sleep(50 * time.Millisecond)
	}
	safe := pglogrepl.LSN(g.safe.Load())
	exec(`INSERT INTO gate_work VALUES (2)`) // the relay's work for the next position
	offered := currentWAL()
	if got := g.pass(offered); got != safe {
		t.Fatalf("passed %s at once, want %s until the standby has the WAL", got, safe)
	}
	for range 3 {
		g.poll(ctx)
	}
	if got := g.pass(offered); got != safe {
		t.Fatalf("passed %s while the standby's slot stands still, want %s", got, safe)
	}

	// The standby flushes everything written so far. A physical slot is
	// advanced only as far as the primary has flushed its WAL, which the
	// test cluster (synchronous_commit off) does a moment later: advance
	// again until the slot is past the WAL the gate waits for.
	deadline = time.Now().Add(20 * time.Second)
	for {
		exec(`SELECT pg_replication_slot_advance('gate_standby', pg_current_wal_lsn())`)
		g.poll(ctx)
		got := g.pass(offered)
		if got == offered {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("passed %s after the standby flushed the WAL, want %s", got, offered)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
