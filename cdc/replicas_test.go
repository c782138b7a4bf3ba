package cdc_test

import (
	"testing"
	"time"

	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/testkit"
)

// Three streams on one slot: exactly one leads. The leader is killed (like
// SIGKILL) or stopped six times under load; another takes over within a few
// seconds, and every event is handled exactly once.
func TestReplicasTakeOverUnderLoad(t *testing.T) {
	testkit.SkipShort(t, "replicas taking over under load")
	t.Parallel()
	db := pgtest.NewDB(t)
	sink := newSink(t, db.Pool)
	cfg := baseConfig(t, db)
	streams := []*running{startStream(t, cfg, sink), startStream(t, cfg, sink), startStream(t, cfg, sink)}
	leader := func() *running {
		t.Helper()
		var found *running
		testkit.WaitFor(t, 15*time.Second, "exactly one leader", func() bool {
			found = nil
			n := 0
			for _, s := range streams {
				if s.s.Lag().Leader {
					n++
					found = s
				}
			}
			if n > 1 {
				t.Fatalf("%d streams lead at once", n)
			}
			return n == 1
		})
		return found
	}
	testkit.WaitFor(t, 20*time.Second, "first checkpoint", func() bool { return checkpointLSN(t, db.Pool, db.Slot) != 0 })
	prod := startProducer(db.Pool, 4, 5*time.Millisecond)
	var worst time.Duration
	for i := range 6 {
		time.Sleep(400 * time.Millisecond)
		l := leader()
		if i%2 == 0 {
			l.crash(t)
		} else if err := l.stop(t); err != nil {
			t.Fatalf("stopping the leader: %v", err)
		}
		killed := time.Now()
		marker := writeEvents(t, db.Pool, 1, "marker")[0]
		for j, s := range streams {
			if s == l {
				streams[j] = startStream(t, cfg, sink)
			}
		}
		testkit.WaitFor(t, 20*time.Second, "a new leader to stream", func() bool { return handledCounts(t, db.Pool)[marker] == 1 })
		worst = max(worst, time.Since(killed))
	}
	ids := prod.finish(t)
	testkit.WaitFor(t, 30*time.Second, "every event", func() bool { return countHandled(t, db.Pool) >= len(ids)+6 })
	assertExactlyOnce(t, db.Pool, ids)
	t.Logf("%d events, 6 leader changes, slowest takeover %s", len(ids), worst.Round(time.Millisecond))
	if worst > 10*time.Second {
		t.Fatalf("a takeover took %s", worst)
	}
	leader()
}
