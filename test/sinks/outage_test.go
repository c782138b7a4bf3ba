package sinks

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/relay"
	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/sink"
	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/testkit"
)

// outageSample is one reading taken while the sink is down.
type outageSample struct {
	at        time.Duration
	retained  int64 // pg_current_wal_lsn() - confirmed_flush_lsn, bytes
	confirmed string
	completed int
	parked    int
}

// TestSinkDownForMinutes: a sink down for minutes. A relay
// (relay.New: stream, correlator, runner, sinks) runs a saga per event under
// a steady load while its webhook endpoint answers 503 for 2 minutes
// (RELAY_TEST_HEAVY=1; 6 s in the short mode of make test). During the outage the
// slot keeps advancing and the WAL it retains stays bounded, sagas keep
// completing, and the parked count grows; after recovery everything is
// delivered, the parked rows drain, and per aggregate the first deliveries
// are in commit order.
func TestSinkDownForMinutes(t *testing.T) {
	// Not parallel: the webhook secret is passed through the environment.
	outage, every := 6*time.Second, time.Second
	if full {
		outage, every = 2*time.Minute, 5*time.Second
	}
	const aggs = 8
	const rate = 40 * time.Millisecond // one event (one transaction) every 40 ms: 25/s
	// Bound on the WAL the slot may retain: far above what a moving slot
	// holds (a few status intervals' worth, tens of kB) and far below what a
	// stuck one would in the full mode (the outage's whole WAL, ~15 MB; the
	// test checks that the load made that much).
	const retainedBound = 4 << 20

	ctx := context.Background()
	db := pgtest.NewDB(t)
	ep := newEndpoint(t)
	t.Setenv("OUTAGE_WEBHOOK_SECRET", secret)
	file := filepath.Join(t.TempDir(), "sinks.yaml")
	if err := os.WriteFile(file, []byte(fmt.Sprintf(`sinks:
  - name: hook
    match: { event_types: ["order.placed"] }
    webhook:
      url: %s/events
      secret_env: OUTAGE_WEBHOOK_SECRET
      timeout: 2s
`, ep.srv.URL)), 0o600); err != nil {
		t.Fatal(err)
	}
	reg := saga.NewRegistry()
	reg.MustRegister(saga.Definition{Name: "placed", Version: 1, Triggers: []saga.Trigger{{EventType: "order.placed"}},
		Steps: []saga.Step{{Name: "noop", Do: func(context.Context, *saga.StepTx) error { return nil }}}})
	r, err := relay.New(ctx, relay.Config{DatabaseURL: db.URL, Registry: reg, Slot: db.Slot, Publication: db.Publication,
		HTTPAddr: "127.0.0.1:0", Sinks: file, Workers: 4,
		StatusInterval: 100 * time.Millisecond, HeartbeatInterval: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := r.Stop(sctx); err != nil {
			t.Error(err)
		}
	}()

	// The steady load: one transaction per event, ids kept in commit order.
	var mu sync.Mutex
	var ids []string
	loadCtx, stopLoad := context.WithCancel(ctx)
	loadDone := make(chan error, 1)
	go func() {
		tick := time.NewTicker(rate)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-loadCtx.Done():
				loadDone <- nil
				return
			case <-tick.C:
			}
			tx, err := db.Pool.Begin(ctx)
			if err != nil {
				loadDone <- err
				return
			}
			// A slice, so that Write's chosen id is visible here.
			m := []outbox.Message{{AggregateType: "order", AggregateID: fmt.Sprintf("o-%d", i%aggs), EventType: "order.placed", Payload: map[string]int{"n": i}}}
			if err := outbox.Write(ctx, tx, m...); err != nil {
				tx.Rollback(ctx)
				loadDone <- err
				return
			}
			if err := tx.Commit(ctx); err != nil {
				loadDone <- err
				return
			}
			mu.Lock()
			ids = append(ids, m[0].ID.String())
			mu.Unlock()
		}
	}()
	written := func() int { mu.Lock(); defer mu.Unlock(); return len(ids) }

	testkit.WaitFor(t, 60*time.Second, "deliveries while the endpoint is up", func() bool { return len(ep.ids()) >= 20 })

	sample := func(start time.Time) outageSample {
		var s outageSample
		s.at = time.Since(start).Round(100 * time.Millisecond)
		if err := db.Pool.QueryRow(ctx, `SELECT (pg_current_wal_lsn() - confirmed_flush_lsn)::bigint, confirmed_flush_lsn::text
			FROM pg_replication_slots WHERE slot_name = $1`, db.Slot).Scan(&s.retained, &s.confirmed); err != nil {
			t.Fatal(err)
		}
		s.completed = count(t, db, `SELECT count(*) FROM saga_instances WHERE saga_name = 'placed' AND status = 'COMPLETED'`)
		s.parked = count(t, db, `SELECT count(*) FROM relay_sink_parked WHERE sink = 'hook'`)
		return s
	}
	var walStart string
	db.Pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&walStart)
	ep.status.Store(503)
	start := time.Now()
	var samples []outageSample
	for time.Since(start) < outage {
		time.Sleep(every)
		s := sample(start)
		samples = append(samples, s)
		t.Logf("down %6s: WAL retained %7d B (slot at %s), sagas completed %5d, parked %5d, events written %5d",
			s.at, s.retained, s.confirmed, s.completed, s.parked, written())
	}
	var walGenerated int64
	db.Pool.QueryRow(ctx, `SELECT (pg_current_wal_lsn() - $1::pg_lsn)::bigint`, walStart).Scan(&walGenerated)
	ep.status.Store(0)
	recovered := time.Now()

	var maxRetained int64
	for i, s := range samples {
		maxRetained = max(maxRetained, s.retained)
		if s.retained > retainedBound {
			t.Errorf("at %s of the outage the slot retains %d bytes of WAL, over the %d bound: the slot is not advancing", s.at, s.retained, retainedBound)
		}
		if i == 0 {
			continue
		}
		p := samples[i-1]
		if s.confirmed == p.confirmed {
			t.Errorf("confirmed_flush_lsn stayed at %s from %s to %s of the outage", s.confirmed, p.at, s.at)
		}
		if s.completed <= p.completed {
			t.Errorf("no saga completed between %s (%d) and %s (%d) of the outage", p.at, p.completed, s.at, s.completed)
		}
		if s.parked <= p.parked {
			t.Errorf("parked count did not grow between %s (%d) and %s (%d) of the outage", p.at, p.parked, s.at, s.parked)
		}
	}
	if full && walGenerated < 2*retainedBound {
		t.Errorf("the outage generated only %d bytes of WAL: too little for the %d bound to tell a stuck slot from a moving one", walGenerated, retainedBound)
	}
	if len(samples) < 2 {
		t.Fatalf("%d samples during the outage", len(samples))
	}
	peakParked := samples[len(samples)-1].parked

	// Recovery under the same load, then stop the load and drain.
	time.Sleep(3 * time.Second)
	stopLoad()
	if err := <-loadDone; err != nil {
		t.Fatalf("load: %v", err)
	}
	mu.Lock()
	all := append([]string(nil), ids...)
	mu.Unlock()
	testkit.WaitFor(t, 5*time.Minute, "the parked events to drain and every event to be delivered", func() bool {
		return count(t, db, `SELECT count(*) FROM relay_sink_parked`) == 0 && len(firstSeen(ep.ids())) >= len(all)
	})
	drained := time.Since(recovered)
	pos := firstSeen(ep.ids())
	last := map[int]int{}
	for i, id := range all {
		p, ok := pos[id]
		if !ok {
			t.Fatalf("event %d (%s) never delivered", i, id)
		}
		if prev, seen := last[i%aggs]; seen && p < prev {
			t.Fatalf("aggregate o-%d: event %d first delivered before an earlier one", i%aggs, i)
		}
		last[i%aggs] = p
	}
	testkit.WaitFor(t, 60*time.Second, "every saga to complete", func() bool {
		return count(t, db, `SELECT count(*) FROM saga_instances WHERE saga_name = 'placed' AND status = 'COMPLETED'`) == len(all)
	})
	st, err := sink.List(ctx, db.Pool)
	if err != nil || len(st) != 1 || st[0].State != sink.StateUp || st[0].Parked != 0 {
		t.Fatalf("sink after draining: %+v %v", st, err)
	}
	t.Logf("FIGURES outage %s at %s/event over %d aggregates: %d events, WAL generated during the outage %d B, max retained by the slot %d B (bound %d), "+
		"sagas completed during the outage %d, parked peak %d, drained and all delivered %s after recovery, %d deliveries for %d ids, order per aggregate kept",
		outage, rate, aggs, len(all), walGenerated, maxRetained, retainedBound,
		samples[len(samples)-1].completed-samples[0].completed, peakParked, drained.Round(100*time.Millisecond), len(ep.ids()), len(pos))
}
