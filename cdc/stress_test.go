package cdc_test

import (
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/compensa/compensa/cdc"
	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/testkit"
)

// countingMetrics records what the stream reports.
type countingMetrics struct {
	cdc.NopMetrics
	mu                       sync.Mutex
	batches, events, lags    int
	leads, unleads, restarts int
}

func (m *countingMetrics) BatchHandled(s cdc.BatchStats) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.batches++
	m.events += s.Events
}

func (m *countingMetrics) LagObserved(cdc.Lag) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lags++
}

func (m *countingMetrics) LeaderChanged(v bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if v {
		m.leads++
	} else {
		m.unleads++
	}
}

// Starting and stopping a stream at random moments under load, half the
// time like a crash: no goroutine leaks (TestMain checks), no lost or
// doubled event, and the metrics hook sees it all.
func TestStartStopStress(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	sink := newSink(t, db.Pool)
	cfg := baseConfig(t, db)
	m := &countingMetrics{}
	cfg.Metrics = m
	first := startStream(t, cfg, sink)
	testkit.WaitFor(t, 20*time.Second, "first checkpoint", func() bool { return checkpointLSN(t, db.Pool, db.Slot) != 0 })
	first.stop(t)
	prod := startProducer(db.Pool, 3, 3*time.Millisecond)
	const cycles = 15
	for i := range cycles {
		r := startStream(t, cfg, sink)
		time.Sleep(time.Duration(rand.IntN(300)) * time.Millisecond)
		if i%2 == 0 {
			r.crash(t)
		} else if err := r.stop(t); err != nil {
			t.Fatalf("cycle %d: Run returned %v", i, err)
		}
	}
	ids := prod.finish(t)
	startStream(t, cfg, sink)
	testkit.WaitFor(t, 30*time.Second, "every event", func() bool { return countHandledOf(t, db.Pool, ids) == len(ids) })
	assertExactlyOnce(t, db.Pool, ids)
	// The stream reports a batch after the sink returned from it: the
	// last batch's report may come a moment after its rows are visible.
	// (A crash can cancel a sink's commit that the server carries out
	// anyway: the sink returns an error and the stream reports nothing, so
	// the reports are counted against the sink's returns, not against the
	// rows.)
	acked := sink.ackedEvents()
	testkit.WaitFor(t, 30*time.Second, "the last batch's report", func() bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.events >= acked
	})
	m.mu.Lock()
	defer m.mu.Unlock()
	t.Logf("%d events over %d start/stop cycles; the sink acknowledged %d; metrics: %d batches, %d events, %d lag reports, %d/%d leadership changes",
		len(ids), cycles, acked, m.batches, m.events, m.lags, m.leads, m.unleads)
	// A stream stopped within milliseconds may never have led, so count
	// pairs: every leadership taken, but the last stream's, was given up.
	if m.events < acked || m.lags == 0 || m.leads < 2 || m.unleads < m.leads-1 {
		t.Fatalf("metrics missed something: %+v", m)
	}
}
