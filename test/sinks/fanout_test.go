// Package sinks tests the fan-out on real parts: PostgreSQL with a logical
// replication slot, the cdc stream, the correlator's transaction and a real
// HTTP endpoint that verifies every signature.
package sinks

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/compensa/compensa/cdc"
	"github.com/compensa/compensa/correlator"
	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/sink"
	"github.com/compensa/compensa/sink/webhook"
	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/redistest"
	"github.com/compensa/compensa/test/relaytest"
	"github.com/compensa/compensa/test/testkit"
)

func TestMain(m *testing.M) {
	testkit.SkipSuiteInShort("the relay binary against real brokers and their faults")
	code := m.Run()
	// The brokers the hostile-row tests share, before the leak check.
	hostileRabbit.Stop()
	redistest.StopShared()
	code = pgtest.Finish(code)
	relaytest.Cleanup()
	os.Exit(code)
}

var secret = "whsec_" + base64.StdEncoding.EncodeToString([]byte("fanout-test-secret-0123456789"))

type endpoint struct {
	srv     *httptest.Server
	status  atomic.Int32 // 0: 204
	hang    chan struct{}
	hanging atomic.Bool
	mu      sync.Mutex
	arrived []string          // webhook-id in arrival order
	bodies  map[string][]byte // the first body received per webhook-id
	bad     atomic.Int32
	refuse  sync.Map     // webhook-id → the status it is always answered with
	refused atomic.Int32 // requests answered from refuse
}

func newEndpoint(t *testing.T) *endpoint {
	e := &endpoint{hang: make(chan struct{}), bodies: map[string][]byte{}}
	key, _ := webhook.DecodeSecret(secret)
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		id := r.Header.Get("webhook-id")
		if !webhook.Verify(key, id, r.Header.Get("webhook-timestamp"), body, r.Header.Get("webhook-signature")) {
			e.bad.Add(1)
			w.WriteHeader(401)
			return
		}
		if code, ok := e.refuse.Load(id); ok {
			e.refused.Add(1)
			w.WriteHeader(code.(int))
			return
		}
		if e.hanging.Load() {
			select {
			case <-e.hang:
			case <-r.Context().Done():
				return
			}
		}
		if s := e.status.Load(); s != 0 {
			w.WriteHeader(int(s))
			return
		}
		e.mu.Lock()
		e.arrived = append(e.arrived, id)
		if _, ok := e.bodies[id]; !ok {
			e.bodies[id] = body
		}
		e.mu.Unlock()
		w.WriteHeader(204)
	}))
	t.Cleanup(func() {
		if e.hanging.Load() {
			close(e.hang)
		}
		e.srv.Close()
		if n := e.bad.Load(); n > 0 {
			t.Errorf("%d requests with a bad signature", n)
		}
	})
	return e
}

func (e *endpoint) ids() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.arrived...)
}

type bundle struct {
	db     *pgtest.DB
	ep     *endpoint
	fanout *sink.Fanout
}

func setup(t *testing.T, timeout time.Duration) *bundle {
	return setupWith(t, timeout, 0)
}

// checkoutRegistry has one saga started by every order.placed event, so a
// test sees sagas keep starting while a sink is down.
func checkoutRegistry() *saga.Registry {
	reg := saga.NewRegistry()
	reg.MustRegister(saga.Definition{Name: "placed", Version: 1, Triggers: []saga.Trigger{{EventType: "order.placed"}},
		Steps: []saga.Step{{Name: "noop", Do: func(context.Context, *saga.StepTx) error { return nil }}}})
	return reg
}

func setupWith(t *testing.T, timeout time.Duration, maxParked int) *bundle {
	t.Helper()
	return setupOn(t, pgtest.NewDB(t), timeout, maxParked)
}

// setupOn runs the stream, the fan-out (one webhook sink, "hook") and the
// correlator on db; configure, if any, adjusts the fan-out's config.
func setupOn(t *testing.T, db *pgtest.DB, timeout time.Duration, maxParked int, configure ...func(*sink.FanoutConfig)) *bundle {
	t.Helper()
	ctx := context.Background()
	ep := newEndpoint(t)
	wh, err := webhook.New(webhook.Config{URL: ep.srv.URL, Secret: secret, Timeout: timeout, Concurrency: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { wh.Close() })
	fc := sink.FanoutConfig{Pool: db.Pool, DrainInterval: 100 * time.Millisecond, MaxBackoff: 500 * time.Millisecond,
		Destinations: []sink.Destination{{Spec: sink.Spec{Name: "hook", MaxParked: maxParked, Webhook: &sink.WebhookSpec{URL: ep.srv.URL}}, Sink: wh}}}
	for _, c := range configure {
		c(&fc)
	}
	f, err := sink.NewFanout(ctx, fc)
	if err != nil {
		t.Fatal(err)
	}
	corr, err := correlator.New(db.Pool, &correlator.Config{Registry: checkoutRegistry(), DisableNotify: true, InBatchTx: f.WriteParked})
	if err != nil {
		t.Fatal(err)
	}
	stream, err := cdc.NewStream(cdc.Config{DatabaseURL: db.URL, Slot: db.Slot, Publication: db.Publication,
		StatusInterval: 100 * time.Millisecond, HeartbeatInterval: 300 * time.Millisecond,
		LoadCheckpoint: func(ctx context.Context) (pglogrepl.LSN, bool, error) {
			if err := f.Resync(ctx); err != nil {
				return 0, false, err
			}
			return corr.LoadCheckpoint(ctx, db.Slot)
		},
	}, f.Sink(corr))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); f.Run(runCtx) }()
	go func() {
		defer wg.Done()
		if err := stream.Run(runCtx); err != nil && runCtx.Err() == nil {
			t.Errorf("stream: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })
	testkit.WaitFor(t, 30*time.Second, "the first checkpoint", func() bool {
		return count(t, db, `SELECT count(*) FROM relay_checkpoints WHERE slot_name = $1`, db.Slot) == 1
	})
	return &bundle{db: db, ep: ep, fanout: f}
}

func count(t *testing.T, db *pgtest.DB, q string, args ...any) int {
	t.Helper()
	var n int
	if err := db.Pool.QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// write commits n events over aggs aggregates, one transaction each, and
// returns their ids in commit order and the WAL position after the last.
func write(t *testing.T, db *pgtest.DB, from, n, aggs int) ([]string, pglogrepl.LSN) {
	t.Helper()
	ctx := context.Background()
	var ids []string
	for i := from; i < from+n; i++ {
		tx, err := db.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		m := []outbox.Message{{AggregateType: "order", AggregateID: fmt.Sprintf("o-%d", i%aggs), EventType: "order.placed", Payload: map[string]int{"n": i}}}
		if err := outbox.Write(ctx, tx, m...); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, m[0].ID.String())
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var s string
	if err := db.Pool.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&s); err != nil {
		t.Fatal(err)
	}
	lsn, _ := pglogrepl.ParseLSN(s)
	return ids, lsn
}

func confirmedFlush(t *testing.T, db *pgtest.DB) pglogrepl.LSN {
	t.Helper()
	var s *string
	if err := db.Pool.QueryRow(context.Background(), `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, db.Slot).Scan(&s); err != nil || s == nil {
		t.Fatalf("read slot: %v", err)
	}
	lsn, _ := pglogrepl.ParseLSN(*s)
	return lsn
}

func parkedIDs(t *testing.T, db *pgtest.DB) map[string]bool {
	rows, err := db.Pool.Query(context.Background(), `SELECT event_id FROM relay_sink_parked WHERE sink = 'hook'`)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for rows.Next() {
		var id string
		rows.Scan(&id)
		out[id] = true
	}
	return out
}

// TestSinkDownParksSlotAdvancesThenDrainsInOrder: with the endpoint down
// the slot still advances, and at every point it has passed, each event is
// delivered or parked; when the endpoint is back the parked events drain
// and the first deliveries are in commit order per aggregate.
func TestSinkDownParksSlotAdvancesThenDrainsInOrder(t *testing.T) {
	t.Parallel()
	b := setup(t, 2*time.Second)
	up, _ := write(t, b.db, 0, 10, 3)
	testkit.WaitFor(t, 30*time.Second, "direct deliveries", func() bool { return len(b.ep.ids()) >= 10 })

	b.ep.status.Store(503)
	down, lsn := write(t, b.db, 10, 30, 3)
	testkit.WaitFor(t, 30*time.Second, "the slot to pass the events written while the sink is down", func() bool {
		return confirmedFlush(t, b.db) >= lsn
	})
	// The slot passed them: every one must be delivered or parked now.
	parked := parkedIDs(t, b.db)
	delivered := map[string]bool{}
	for _, id := range b.ep.ids() {
		delivered[id] = true
	}
	for _, id := range down {
		if !parked[id] && !delivered[id] {
			t.Fatalf("the slot passed event %s, which is neither delivered nor parked", id)
		}
	}
	if len(parked) == 0 {
		t.Fatal("nothing parked while the endpoint answered 503")
	}
	if n := count(t, b.db, `SELECT count(*) FROM saga_instances WHERE saga_name = 'placed'`); n != 40 {
		t.Fatalf("%d sagas started while the sink was down, want 40: a failing sink must not stop sagas", n)
	}
	st, err := sink.List(context.Background(), b.db.Pool)
	if err != nil || len(st) != 1 || st[0].Parked == 0 || st[0].OldestParkedSeconds == nil {
		t.Fatalf("sink status %+v, %v", st, err)
	}
	b.ep.status.Store(0)
	more, _ := write(t, b.db, 40, 10, 3) // while draining
	all := append(append(append([]string(nil), up...), down...), more...)
	testkit.WaitFor(t, 60*time.Second, "the parked events to drain", func() bool {
		return count(t, b.db, `SELECT count(*) FROM relay_sink_parked`) == 0 && len(firstSeen(b.ep.ids())) >= len(all)
	})
	pos := firstSeen(b.ep.ids())
	last := map[int]int{}
	for i, id := range all {
		p, ok := pos[id]
		if !ok {
			t.Fatalf("event %s never delivered", id)
		}
		if prev, seen := last[i%3]; seen && p < prev {
			t.Fatalf("aggregate o-%d: event %d first delivered before an earlier one", i%3, i)
		}
		last[i%3] = p
	}
	// The count of deliveries commits with the stream's batch, after the
	// endpoint has the events: wait for it rather than read it once.
	testkit.WaitFor(t, 30*time.Second, "the sink's status to count every delivery", func() bool {
		st, _ = sink.List(context.Background(), b.db.Pool)
		return len(st) > 0 && st[0].Delivered >= int64(len(all)) && st[0].State == sink.StateUp
	})
	t.Logf("%d events, %d parked while down, %d deliveries for %d ids", len(all), len(parked), len(b.ep.ids()), len(pos))
}

func firstSeen(ids []string) map[string]int {
	pos := map[string]int{}
	for i, id := range ids {
		if _, ok := pos[id]; !ok {
			pos[id] = i
		}
	}
	return pos
}

// TestSlotHeldWhileDeliveryIsInFlight: an event the endpoint has neither
// acknowledged nor refused is not parked yet, so the slot must not pass it.
func TestSlotHeldWhileDeliveryIsInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t, 30*time.Second)
	b.ep.hanging.Store(true)
	before := confirmedFlush(t, b.db)
	ids, lsn := write(t, b.db, 0, 1, 1)
	time.Sleep(2 * time.Second)
	if now := confirmedFlush(t, b.db); now >= lsn {
		t.Fatalf("confirmed_flush_lsn %s passed event %s (written before %s) while its delivery hangs (was %s)", now, ids[0], lsn, before)
	}
	if n := count(t, b.db, `SELECT count(*) FROM relay_sink_parked`); n != 0 {
		t.Fatalf("%d parked while the delivery is in flight", n)
	}
	b.ep.hanging.Store(false)
	close(b.ep.hang)
	testkit.WaitFor(t, 30*time.Second, "the slot to pass the delivered event", func() bool { return confirmedFlush(t, b.db) >= lsn })
	if got := b.ep.ids(); len(got) != 1 || got[0] != ids[0] {
		t.Fatalf("delivered %v, want [%s]", got, ids[0])
	}
}

// TestGoneDisablesUntilRetry: 410 disables the sink; events park; `relay
// sinks retry` (RequestRetry) re-enables it and the parked events drain.
func TestGoneDisablesUntilRetry(t *testing.T) {
	t.Parallel()
	b := setup(t, 2*time.Second)
	b.ep.status.Store(410)
	ids, lsn := write(t, b.db, 0, 5, 2)
	testkit.WaitFor(t, 30*time.Second, "the slot to pass", func() bool { return confirmedFlush(t, b.db) >= lsn })
	testkit.WaitFor(t, 10*time.Second, "the disabled state", func() bool {
		st, _ := sink.List(context.Background(), b.db.Pool)
		return len(st) == 1 && st[0].State == sink.StateDisabled
	})
	b.ep.status.Store(0)
	time.Sleep(time.Second)
	if n := len(b.ep.ids()); n != 0 {
		t.Fatalf("a disabled sink delivered %d events", n)
	}
	if _, err := sink.RequestRetry(context.Background(), b.db.Pool, "nope"); err == nil {
		t.Fatal("retry of an unknown sink succeeded")
	}
	if n, err := sink.RequestRetry(context.Background(), b.db.Pool, "hook"); err != nil || n != int64(len(ids)) {
		t.Fatalf("retry: %d, %v", n, err)
	}
	testkit.WaitFor(t, 30*time.Second, "the drain after retry", func() bool { return len(firstSeen(b.ep.ids())) == len(ids) })
	raw, _ := json.Marshal(b.ep.ids())
	t.Logf("delivered after retry: %s", raw)
}

// TestMaxParkedIsBackpressure: at max_parked the stream waits instead of
// parking more or dropping: the slot stops short of the unparked events,
// and everything is delivered in order once the endpoint is back.
func TestMaxParkedIsBackpressure(t *testing.T) {
	t.Parallel()
	b := setupWith(t, time.Second, 5)
	b.ep.status.Store(503)
	ids, lsn := write(t, b.db, 0, 20, 2)
	// The stream merges queued transactions into one batch: a batch that
	// would pass the cap waits whole, so fewer than 5 may be parked.
	testkit.WaitFor(t, 30*time.Second, "parked events", func() bool {
		return count(t, b.db, `SELECT count(*) FROM relay_sink_parked`) >= 1
	})
	time.Sleep(2 * time.Second)
	if n := count(t, b.db, `SELECT count(*) FROM relay_sink_parked`); n > 5 {
		t.Fatalf("%d parked with max_parked 5", n)
	}
	if now := confirmedFlush(t, b.db); now >= lsn {
		t.Fatalf("the slot passed every event (%s >= %s) while the sink was at max_parked", now, lsn)
	}
	b.ep.status.Store(0)
	testkit.WaitFor(t, 60*time.Second, "every event delivered", func() bool { return len(firstSeen(b.ep.ids())) == len(ids) })
	pos := firstSeen(b.ep.ids())
	last := map[int]int{}
	for i, id := range ids {
		if prev, ok := last[i%2]; ok && pos[id] < prev {
			t.Fatalf("aggregate o-%d out of order at event %d", i%2, i)
		}
		last[i%2] = pos[id]
	}
	testkit.WaitFor(t, 30*time.Second, "the slot to pass every event", func() bool { return confirmedFlush(t, b.db) >= lsn })
}
