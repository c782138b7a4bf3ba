package correlator_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/compensa/compensa/correlator"
	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/test/pgtest"
)

// Exactly-once starts rest on the schema, not on the correlator's SQL: after
// migration 0007 one unique index (trigger_event_id, saga_name) must refuse a
// second instance of a saga for one trigger event, in the same version or in
// another, from any writer, while other sagas triggered by the same event
// still start.
func TestTheSchemaRefusesASecondStartOfOneTrigger(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	trig := uuid.New()
	insert := func(name string, version int) error {
		_, err := b.db.Pool.Exec(ctx, `INSERT INTO saga_instances (tenant_id, saga_name, saga_version, trigger_event_id)
			VALUES ($1, $2, $3, $4)`, uuid.Nil, name, version, trig)
		return err
	}
	if err := insert("brief_enrichment", 1); err != nil {
		t.Fatal(err)
	}
	for _, version := range []int{1, 2} {
		err := insert("brief_enrichment", version)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "23505" {
			t.Fatalf("second start of the trigger in version %d: err %v, want a unique violation", version, err)
		}
	}
	if err := insert("audit", 1); err != nil {
		t.Fatalf("another saga on the same trigger: %v", err)
	}
	if n := b.count(t, `SELECT count(*) FROM saga_instances WHERE trigger_event_id = $1`, trig); n != 2 {
		t.Fatalf("%d instances for the trigger, want 2 (one per saga)", n)
	}
}

// sqlRecorder keeps the text of every statement sent in a batch.
type sqlRecorder struct {
	mu  sync.Mutex
	sql []string
}

func (s *sqlRecorder) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (s *sqlRecorder) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (s *sqlRecorder) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (s *sqlRecorder) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sql = append(s.sql, d.SQL)
}
func (s *sqlRecorder) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// starts returns, in order, whether each start sent since the last call was
// guarded (ON CONFLICT DO NOTHING).
func (s *sqlRecorder) starts() []bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []bool
	for _, q := range s.sql {
		if strings.Contains(q, "INSERT INTO saga_instances") {
			out = append(out, strings.Contains(q, "ON CONFLICT DO NOTHING"))
		}
	}
	s.sql = nil
	return out
}

// A batch inserts its starts plainly; one that holds a trigger started
// before, or the same trigger twice, is refused by the unique index and
// starts again guarded: every trigger then has exactly one instance per
// saga, keyed sagas included, the duplicates are counted, and the next
// batches stay guarded for a while before going back to plain inserts.
func TestTriggerStartedBeforeStartsNothingAgain(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	rec := &sqlRecorder{}
	cfg.ConnConfig.Tracer = rec
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	keyed := def("brief_audit", 1, 0, "research_brief.created")
	keyed.Concurrency = &saga.Concurrency{Limit: 1, Key: func(ev outbox.Event) (string, error) { return "k", nil }}
	reg := saga.NewRegistry()
	reg.MustRegister(def("brief_enrichment", 1, 0, "research_brief.created"), keyed)
	corr, err := correlator.New(pool, &correlator.Config{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	b := &testBundle{db: db, lsn: 0x3000000}
	handle := func(evs ...outbox.Event) {
		t.Helper()
		if err := corr.HandleBatch(ctx, b.batch(evs...)); err != nil {
			t.Fatal(err)
		}
	}
	t1, t2, t3 := trigger(uuid.New()), trigger(uuid.New()), trigger(uuid.New())
	handle(t1, t2)
	if got := rec.starts(); fmt.Sprint(got) != "[false]" {
		t.Fatalf("a batch of new triggers sent starts guarded=%v, want one plain start", got)
	}
	// t1 again (started above, at a new LSN: past the checkpoint), and t3
	// twice in one batch.
	handle(t1, t3, t3)
	if got := rec.starts(); fmt.Sprint(got) != "[false true]" {
		t.Fatalf("a batch with a trigger started before sent starts guarded=%v, want plain then guarded", got)
	}
	s := corr.Stats()
	if s.SagasStarted != 6 || s.DuplicateStarts != 4 {
		t.Fatalf("stats %+v: want 6 started (3 triggers × 2 sagas) and 4 duplicates (t1 and the second t3, × 2 sagas)", s)
	}
	for _, ev := range []outbox.Event{t1, t2, t3} {
		if n := b.count(t, `SELECT count(*) FROM saga_instances WHERE trigger_event_id = $1`, ev.ID); n != 2 {
			t.Fatalf("trigger %s has %d instances, want one per saga", ev.ID, n)
		}
	}
	for i := range correlator.GuardedBatches {
		handle(trigger(uuid.New()))
		if got := rec.starts(); fmt.Sprint(got) != "[true]" {
			t.Fatalf("batch %d after the refused one sent starts guarded=%v, want guarded", i+1, got)
		}
	}
	handle(trigger(uuid.New()))
	if got := rec.starts(); fmt.Sprint(got) != "[false]" {
		t.Fatalf("after %d guarded batches the start was guarded=%v, want plain again", correlator.GuardedBatches, got)
	}
	if n := b.count(t, `SELECT count(*) FROM saga_instances`); n != 2*(3+correlator.GuardedBatches+1) {
		t.Fatalf("%d instances, want %d", n, 2*(3+correlator.GuardedBatches+1))
	}
	// The keyed saga's instances keep their place in the stream, in the
	// refused batch's guarded retry too.
	if n := b.count(t, `SELECT count(*) FROM saga_instances WHERE saga_name = 'brief_audit' AND concurrency_key LIKE '%/k' AND concurrency_lsn IS NOT NULL`); n != 3+correlator.GuardedBatches+1 {
		t.Fatalf("%d keyed instances with their place, want %d", n, 3+correlator.GuardedBatches+1)
	}
}
