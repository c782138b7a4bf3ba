package sinks

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/compensa/compensa/sink"
	"github.com/compensa/compensa/sink/webhook"
	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/testkit"
)

// refusingSink refuses the first event of each aggregate it is handed (and
// holds back the rest): every head of a drain page fails at once.
type refusingSink struct{ calls atomic.Int32 }

func (s *refusingSink) Deliver(_ context.Context, evs []*sink.Event) []error {
	s.calls.Add(1)
	return sink.HoldBack(evs, func(_ int, ev *sink.Event) error {
		return sink.EventError(errors.New("refused " + ev.ID))
	})
}

func (s *refusingSink) Close() error { return nil }

// deferTracer counts the statements that defer parked events.
type deferTracer struct{ n atomic.Int32 }

func (d *deferTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, q pgx.TraceQueryStartData) context.Context {
	if strings.Contains(q.SQL, "UPDATE relay_sink_parked") && strings.Contains(q.SQL, "attempts") {
		d.n.Add(1)
	}
	return ctx
}

func (d *deferTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestDrainerDefersAPageInOneStatement: when the heads of many aggregates
// fail in one drain round, they are deferred by one statement, each with
// its own reason and backoff, and the rows behind them are left as they are.
func TestDrainerDefersAPageInOneStatement(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	const aggs, per = 30, 3
	for i := range aggs * per {
		agg := fmt.Sprintf("o-%d", i%aggs)
		id := fmt.Sprintf("e-%03d", i)
		body := fmt.Sprintf(`{"id":%q,"event_type":"order.placed","aggregate_type":"order","aggregate_id":%q,"payload":{}}`, id, agg)
		if _, err := db.Pool.Exec(ctx, `INSERT INTO relay_sink_parked (sink, event_id, aggregate_key, event, reason) VALUES ('refuser', $1, $2, $3, 'seed')`,
			id, strconv.Quote("order")+"/"+strconv.Quote(agg), body); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	tr := &deferTracer{}
	cfg.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	rs := &refusingSink{}
	f, err := sink.NewFanout(ctx, sink.FanoutConfig{Pool: pool, DrainInterval: 50 * time.Millisecond, MaxBackoff: 30 * time.Second,
		Destinations: []sink.Destination{{Spec: sink.Spec{Name: "refuser", Webhook: &sink.WebhookSpec{URL: "http://127.0.0.1:1/"}}, Sink: rs}}})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); f.Run(runCtx) }()
	testkit.WaitFor(t, 20*time.Second, "a drain round", func() bool {
		return count(t, db, `SELECT count(*) FROM relay_sink_parked WHERE attempts > 0`) == aggs
	})
	cancel()
	wg.Wait()
	if calls, n := rs.calls.Load(), tr.n.Load(); calls < 1 || n != calls {
		t.Fatalf("%d deferring statements for %d drain rounds of %d failed heads each, want one per round", n, calls, aggs)
	}
	// Heads: deferred with their own reason and a backoff; the rest: as parked.
	if n := count(t, db, `SELECT count(*) FROM relay_sink_parked WHERE attempts > 0
		AND reason = 'refused ' || event_id AND next_attempt_at > now() AND event_id < 'e-030'`); n != aggs {
		t.Fatalf("%d of %d heads deferred with their own reason and backoff", n, aggs)
	}
	if n := count(t, db, `SELECT count(*) FROM relay_sink_parked WHERE attempts = 0 AND reason = 'seed' AND event_id >= 'e-030'`); n != aggs*(per-1) {
		t.Fatalf("%d of the %d rows behind the heads left as they were", n, aggs*(per-1))
	}
}

// TestUnreadableParkedRowHoldsOnlyItsAggregate: a parked row that cannot be
// read (altered by hand) is deferred with the reason and holds back the
// later rows of its aggregate; the sink's other aggregates drain.
func TestUnreadableParkedRowHoldsOnlyItsAggregate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	ep := newEndpoint(t)
	wh, err := webhook.New(webhook.Config{URL: ep.srv.URL, Secret: secret, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer wh.Close()
	rows := []struct{ id, agg, body string }{
		{"bad-1", "o-1", `"not an event"`},
		{"o1-2", "o-1", `{"id":"o1-2","event_type":"order.placed","payload":{}}`},
		{"o2-1", "o-2", `{"id":"o2-1","event_type":"order.placed","payload":{}}`},
		{"o2-2", "o-2", `{"id":"o2-2","event_type":"order.placed","payload":{}}`},
	}
	for _, r := range rows {
		if _, err := db.Pool.Exec(ctx, `INSERT INTO relay_sink_parked (sink, event_id, aggregate_key, event, reason) VALUES ('hook', $1, $2, $3, 'seed')`,
			r.id, strconv.Quote("order")+"/"+strconv.Quote(r.agg), r.body); err != nil {
			t.Fatal(err)
		}
	}
	f, err := sink.NewFanout(ctx, sink.FanoutConfig{Pool: db.Pool, DrainInterval: 50 * time.Millisecond, MaxBackoff: 30 * time.Second,
		Destinations: []sink.Destination{{Spec: sink.Spec{Name: "hook", Webhook: &sink.WebhookSpec{URL: ep.srv.URL}}, Sink: wh}}})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); f.Run(runCtx) }()
	defer func() { cancel(); wg.Wait() }()
	testkit.WaitFor(t, 20*time.Second, "the readable aggregate to drain", func() bool {
		return count(t, db, `SELECT count(*) FROM relay_sink_parked WHERE aggregate_key LIKE '%o-2%'`) == 0
	})
	if n := count(t, db, `SELECT count(*) FROM relay_sink_parked WHERE event_id = 'bad-1' AND attempts > 0
		AND reason LIKE 'the parked row cannot be read%' AND next_attempt_at > now()`); n != 1 {
		t.Fatal("the unreadable row is not deferred with its reason")
	}
	if got := ep.ids(); len(got) != 2 || got[0] != "o2-1" || got[1] != "o2-2" {
		t.Fatalf("delivered %v, want the other aggregate's two events only", got)
	}
}
