package e2e

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/compensa/compensa/cdc"
	"github.com/compensa/compensa/correlator"
	"github.com/compensa/compensa/internal/briefs"
	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/testkit"
)

// statementTracer counts statements per connection use, batches included.
// The check that the triggers' transactions are visible is counted apart:
// the correlator repeats it while a transaction it read from the stream is
// still finishing its commit, a wait whose length depends on the machine's
// load, not on the batch.
type statementTracer struct{ n, visibility atomic.Int64 }

func (s *statementTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	s.n.Add(1)
	if strings.Contains(d.SQL, "pg_visible_in_snapshot") {
		s.visibility.Add(1)
	}
	return ctx
}
func (s *statementTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (s *statementTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (s *statementTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {
	s.n.Add(1)
}
func (s *statementTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// countingSink measures the statements the correlator sends per batch.
type countingSink struct {
	corr    *correlator.Correlator
	tracer  *statementTracer
	batches atomic.Int64
	maxStmt atomic.Int64
}

func (c *countingSink) HandleBatch(ctx context.Context, b cdc.Batch) error {
	before, checks := c.tracer.n.Load(), c.tracer.visibility.Load()
	if err := c.corr.HandleBatch(ctx, b); err != nil {
		return err
	}
	// The visibility check counts once, however often it was repeated.
	n := c.tracer.n.Load() - before - max(0, c.tracer.visibility.Load()-checks-1)
	for {
		m := c.maxStmt.Load()
		if n <= m || c.maxStmt.CompareAndSwap(m, n) {
			break
		}
	}
	c.batches.Add(1)
	return nil
}

// 100,000 trigger events, streamed through the real replication stream in
// transactions of 1 and of 1,000 rows, start exactly 100,000 instances, and
// every batch costs the same handful of statements however many events it
// carries.
func TestHundredThousandStreamedTriggers(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := context.Background()
	const single, perTx, txs = 50_000, 1_000, 50

	// Producers: a procedure commits one row per transaction, fast enough
	// that the test measures the relay, not the client.
	if _, err := db.Pool.Exec(ctx, `
		CREATE PROCEDURE produce(n int, per_tx int) LANGUAGE plpgsql AS $$
		BEGIN
		  FOR i IN 1..n LOOP
		    INSERT INTO outbox (id, event_type, payload)
		    SELECT gen_random_uuid(), 'research_brief.created', jsonb_build_object('brief_id', gen_random_uuid())
		    FROM generate_series(1, per_tx);
		    COMMIT;
		  END LOOP;
		END $$`); err != nil {
		t.Fatal(err)
	}

	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	tracer := &statementTracer{}
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	reg := saga.NewRegistry()
	if err := briefs.Register(reg); err != nil {
		t.Fatal(err)
	}
	corr, err := correlator.New(pool, &correlator.Config{Registry: reg, DisableNotify: true})
	if err != nil {
		t.Fatal(err)
	}
	sink := &countingSink{corr: corr, tracer: tracer}
	stream, err := cdc.NewStream(cdc.Config{DatabaseURL: db.URL, Slot: db.Slot, Publication: db.Publication,
		StatusInterval: 200 * time.Millisecond, HeartbeatInterval: time.Second}, sink)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- stream.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil && runCtx.Err() == nil {
			t.Error(err)
		}
	}()
	testkit.WaitFor(t, 30*time.Second, "the stream's first checkpoint", func() bool {
		return count(t, db, `SELECT count(*) FROM relay_checkpoints WHERE slot_name = $1`, db.Slot) == 1
	})

	began := time.Now()
	if _, err := db.Pool.Exec(ctx, `CALL produce($1, 1)`, single); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `CALL produce($1, $2)`, txs, perTx); err != nil {
		t.Fatal(err)
	}
	const total = single + perTx*txs
	testkit.WaitFor(t, 4*time.Minute, "100,000 instances", func() bool {
		return count(t, db, `SELECT count(*) FROM saga_instances`) >= total
	})
	took := time.Since(began)
	if n := count(t, db, `SELECT count(*) FROM saga_instances`); n != total {
		t.Fatalf("instances = %d, want exactly %d", n, total)
	}
	if n := count(t, db, `SELECT count(*) FROM (SELECT trigger_event_id FROM saga_instances GROUP BY 1 HAVING count(*) > 1) d`); n != 0 {
		t.Fatalf("%d triggers started more than one instance", n)
	}
	// BEGIN, checkpoint, starts, COMMIT (+ a notify when enabled).
	if m := sink.maxStmt.Load(); m > 5 {
		t.Fatalf("a batch cost %d statements; the cost must not grow with the batch", m)
	}
	t.Logf("%d events in %d batches, at most %d statements per batch, %.0f events/s end to end",
		total, sink.batches.Load(), sink.maxStmt.Load(), float64(total)/took.Seconds())
}
