package cdc_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/compensa/compensa/cdc"
	"github.com/compensa/compensa/internal/pgcluster"
	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/testkit"
)

// The walsender terminated, and the leadership connection cut, under load:
// the stream reconnects and resumes; nothing is lost, nothing doubles.
func TestReconnectAfterTerminatedBackends(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	sink := newSink(t, db.Pool)
	cfg, logs := baseConfigLogs(t, db)
	reconnects := &countReconnects{}
	cfg.Metrics = reconnects
	r := startStream(t, cfg, sink)
	testkit.WaitFor(t, 20*time.Second, "first checkpoint", func() bool { return checkpointLSN(t, db.Pool, db.Slot) != 0 })
	prod := startProducer(db.Pool, 5, 10*time.Millisecond)
	for i := range 4 {
		time.Sleep(400 * time.Millisecond)
		testkit.WaitFor(t, 10*time.Second, "an active walsender", func() bool { _, active := slotState(t, db.Pool, db.Slot); return active })
		if i == 2 {
			// Cut the connection that holds the leadership lock.
			exec(t, db.Pool, `SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) AND granted`)
			continue
		}
		exec(t, db.Pool, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, db.Slot)
	}
	time.Sleep(300 * time.Millisecond)
	ids := prod.finish(t)
	testkit.WaitFor(t, 30*time.Second, "every event", func() bool { return countHandledOf(t, db.Pool, ids) == len(ids) })
	assertExactlyOnce(t, db.Pool, ids)
	if _, done := r.wait(0); done {
		t.Fatal("Run ended on a transient failure")
	}
	if n := reconnects.n.Load(); n < 4 {
		t.Fatalf("%d failed sessions, want 4", n)
	}
	if !strings.Contains(logs.String(), "reconnecting") {
		t.Fatal("no reconnect logged")
	}
	t.Logf("%d events across 4 cuts", len(ids))
}

// An immediate restart of PostgreSQL (crash recovery): the stream
// reconnects with backoff and resumes. Restarting affects the whole cluster,
// so the test has one of its own, durable so that a commit the producer saw
// survives the crash.
func TestReconnectAfterServerCrashRestart(t *testing.T) {
	testkit.SkipShort(t, "crashes and restarts a cluster of its own")
	t.Parallel()
	db := privateDurableDB(t)
	sink := newSink(t, db.Pool)
	cfg, logs := baseConfigLogs(t, db)
	reconnects := &countReconnects{}
	cfg.Metrics = reconnects
	r := startStream(t, cfg, sink)
	testkit.WaitFor(t, 30*time.Second, "first checkpoint", func() bool { return checkpointLSN(t, db.Pool, db.Slot) != 0 })
	prod := startRetryingProducer(db.Pool)
	for range 2 {
		time.Sleep(500 * time.Millisecond)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		if err := db.Cluster.Restart(ctx, true); err != nil {
			cancel()
			t.Fatal(err)
		}
		cancel()
	}
	time.Sleep(500 * time.Millisecond)
	ids := prod.finish(t)
	testkit.WaitFor(t, 60*time.Second, "every event", func() bool { return countHandledOf(t, db.Pool, ids) == len(ids) })
	assertExactlyOnce(t, db.Pool, ids)
	if _, done := r.wait(0); done {
		t.Fatal("Run ended on a server restart")
	}
	// Two restarts may fall into one outage (the second while the stream
	// still waits to reconnect from the first): every failed session is
	// counted, and the outage is logged once with its recovery.
	if n := reconnects.n.Load(); n < 2 {
		t.Fatalf("%d failed sessions, want at least 2", n)
	}
	if !strings.Contains(logs.String(), "reconnecting") || !strings.Contains(logs.String(), "stream recovered") {
		t.Fatal("the outage and its recovery are not logged")
	}
	t.Logf("%d events across 2 crash restarts", len(ids))
}

func privateDurableDB(t *testing.T) *pgtest.DB {
	return privateDBOpts(t, pgcluster.Options{Durable: true})
}

// countReconnects counts the sessions that ended with a transient error.
type countReconnects struct{ n atomic.Int64 }

func (c *countReconnects) BatchHandled(cdc.BatchStats)       {}
func (c *countReconnects) LagObserved(cdc.Lag)               {}
func (c *countReconnects) LeaderChanged(bool)                {}
func (c *countReconnects) Reconnecting(error, time.Duration) { c.n.Add(1) }
