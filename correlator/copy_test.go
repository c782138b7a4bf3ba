package correlator_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/compensa/compensa/correlator"
	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/test/pgtest"
)

// copyBundle is a correlator whose pool records the statements it sends in
// batches, with two sagas on one trigger: one with a deadline, one without.
type copyBundle struct {
	*testBundle
	rec  *sqlRecorder
	pool *pgxpool.Pool
	corr *correlator.Correlator
}

func setupCopy(t *testing.T, traced bool) *copyBundle {
	t.Helper()
	db := pgtest.NewDB(t)
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	rec := &sqlRecorder{}
	cfg.ConnConfig.Tracer = rec
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	reg := saga.NewRegistry()
	reg.MustRegister(def("brief_enrichment", 1, 90*time.Minute+1500*time.Microsecond, "research_brief.created"),
		def("brief_audit", 3, 0, "research_brief.created"))
	ccfg := &correlator.Config{Registry: reg}
	if traced {
		ccfg.TracerProvider = sdktrace.NewTracerProvider(sdktrace.WithSyncer(tracetest.NewInMemoryExporter()))
	}
	corr, err := correlator.New(pool, ccfg)
	if err != nil {
		t.Fatal(err)
	}
	return &copyBundle{testBundle: &testBundle{db: db, lsn: 0x5000000}, rec: rec, pool: pool, corr: corr}
}

// triggers returns n new triggers; every third carries a workspace id, a
// correlation id and an aggregate id, the others none.
func triggers(n int) []outbox.Event {
	evs := make([]outbox.Event, n)
	for i := range evs {
		evs[i] = trigger(uuid.New())
		if i%3 == 0 {
			evs[i].Payload = json.RawMessage(fmt.Sprintf(`{"brief_id":%q,"workspace_id":%q,"n":%d}`, uuid.New(), uuid.New(), i))
			evs[i].CorrelationID = uuid.NullUUID{UUID: uuid.New(), Valid: true}
			evs[i].AggregateID = fmt.Sprintf("brief-%d", i)
			evs[i].Headers = json.RawMessage(`{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}`)
		}
	}
	return evs
}

// A batch of at least CopyStarts starts sends them with COPY, not with the
// INSERT: streamed while the batch is planned when it holds that many
// events (here over three chunks), encoded at once when fewer events start
// that many sagas. Each instance holds what the INSERT would have stored:
// the event's fields, the payload as context, next_attempt_at at the
// transaction's now() and the deadline counted from it to the microsecond,
// the start span's traceparent; the status counts see them. A smaller batch
// still inserts.
func TestALargeBatchStartsByCopyWithTheInsertsFields(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		events int
		traced bool
	}{{2*correlator.CopyStarts + 17, false}, {2*correlator.CopyStarts + 17, true}, {correlator.CopyStarts / 2, false}} {
		traced := tc.traced
		t.Run(fmt.Sprintf("events=%d,traced=%v", tc.events, traced), func(t *testing.T) {
			t.Parallel()
			b := setupCopy(t, traced)
			ctx := context.Background()
			large := triggers(tc.events)
			if err := b.corr.HandleBatch(ctx, b.batch(large...)); err != nil {
				t.Fatal(err)
			}
			if got := b.rec.starts(); len(got) != 0 {
				t.Fatalf("a batch of %d triggers sent INSERT starts (guarded=%v), want COPY", len(large), got)
			}
			small := triggers(3)
			if err := b.corr.HandleBatch(ctx, b.batch(small...)); err != nil {
				t.Fatal(err)
			}
			if got := b.rec.starts(); fmt.Sprint(got) != "[false]" {
				t.Fatalf("a batch of 3 triggers sent starts guarded=%v, want one plain INSERT", got)
			}
			if s := b.corr.Stats(); s.SagasStarted != uint64(2*(len(large)+3)) || s.DuplicateStarts != 0 {
				t.Fatalf("stats %+v, want %d started", s, 2*(len(large)+3))
			}
			for _, ev := range append(large, small...) {
				for _, name := range []string{"brief_enrichment", "brief_audit"} {
					var ok bool
					var trace *string
					err := b.db.Pool.QueryRow(ctx, `
SELECT tenant_id = $2 AND saga_version = CASE saga_name WHEN 'brief_enrichment' THEN 1 ELSE 3 END
   AND workspace_id IS NOT DISTINCT FROM ($3::jsonb->>'workspace_id')::uuid
   AND correlation_id IS NOT DISTINCT FROM $4
   AND trigger_aggregate_id IS NOT DISTINCT FROM nullif($5, '')
   AND context = $3::jsonb
   AND status = 'RUNNING' AND current_step = 0 AND attempt = 0 AND current_version = 0
   AND next_attempt_at = created_at
   AND timeout_at IS NOT DISTINCT FROM CASE saga_name WHEN 'brief_enrichment'
                                       THEN created_at + interval '90 minutes 1500 microseconds' END,
       traceparent
FROM saga_instances WHERE trigger_event_id = $1 AND saga_name = $6`,
						ev.ID, ev.TenantID, string(ev.Payload), ev.CorrelationID, ev.AggregateID, name).Scan(&ok, &trace)
					if err != nil {
						t.Fatalf("instance of %s for trigger %s: %v", name, ev.ID, err)
					}
					if !ok {
						t.Fatalf("instance of %s for trigger %s does not hold the event's fields", name, ev.ID)
					}
					if traced != (trace != nil && strings.HasPrefix(*trace, "00-")) {
						t.Fatalf("traced=%v: instance traceparent %v", traced, trace)
					}
					if traced && len(ev.Headers) > 0 && !strings.Contains(*trace, "4bf92f3577b34da6a3ce929d0e0e4736") {
						t.Fatalf("instance traceparent %s is not in the producer's trace", *trace)
					}
				}
			}
			if n := b.count(t, `SELECT coalesce(sum(delta), 0)::int FROM saga_status_deltas WHERE status = 'RUNNING'`); n != 2*(len(large)+3) {
				t.Fatalf("status counts: %d running, want %d", n, 2*(len(large)+3))
			}
		})
	}
}

// A large batch holding triggers started before (a resync reading outbox
// rows again) is refused by the unique index in the COPY as in the INSERT,
// and starts again guarded: one instance per trigger and saga, the
// duplicates counted.
func TestALargeBatchWithTriggersStartedBeforeStartsThemOnce(t *testing.T) {
	t.Parallel()
	b := setupCopy(t, false)
	ctx := context.Background()
	first := triggers(correlator.CopyStarts)
	if err := b.corr.HandleBatch(ctx, b.batch(first...)); err != nil {
		t.Fatal(err)
	}
	b.rec.starts()
	// The triggers started before come first, so that PostgreSQL refuses
	// the COPY while the rest of the batch is still being planned.
	again := append(append([]outbox.Event{}, first[:10]...), triggers(2*correlator.CopyStarts)...)
	if err := b.corr.HandleBatch(ctx, b.batch(again...)); err != nil {
		t.Fatal(err)
	}
	if got := b.rec.starts(); fmt.Sprint(got) != "[true]" {
		t.Fatalf("after the refused COPY the batch sent starts guarded=%v, want one guarded INSERT", got)
	}
	if s := b.corr.Stats(); s.SagasStarted != uint64(2*3*correlator.CopyStarts) || s.DuplicateStarts != 20 || s.EventsSeen != uint64(3*correlator.CopyStarts+10) {
		t.Fatalf("stats %+v, want %d started, 20 duplicates, %d events seen", s, 2*3*correlator.CopyStarts, 3*correlator.CopyStarts+10)
	}
	if n := b.count(t, `SELECT count(*) FROM (SELECT 1 FROM saga_instances GROUP BY trigger_event_id, saga_name HAVING count(*) > 1) d`); n != 0 {
		t.Fatalf("%d triggers started a saga twice", n)
	}
	if n := b.count(t, `SELECT count(*) FROM saga_instances`); n != 2*3*correlator.CopyStarts {
		t.Fatalf("%d instances, want %d", n, 2*3*correlator.CopyStarts)
	}
}

// A value PostgreSQL refuses in a large batch fails the COPY as it fails
// the INSERT: its event is parked and the rest start.
func TestALargeBatchParksTheEventPostgreSQLRefuses(t *testing.T) {
	restore := correlator.SkipPayloadChecks()
	defer restore()
	b := setupCopy(t, false)
	ctx := context.Background()
	evs := triggers(correlator.CopyStarts)
	bad := &evs[correlator.CopyStarts/2]
	bad.Payload = json.RawMessage(fmt.Sprintf(`{"brief_id":%q,"note":"\u0000"}`, uuid.New()))
	if err := b.corr.HandleBatch(ctx, b.batch(evs...)); err != nil {
		t.Fatalf("the batch failed instead of parking the refused event: %v", err)
	}
	if n := b.count(t, `SELECT count(*) FROM saga_instances`); n != 2*(correlator.CopyStarts-1) {
		t.Fatalf("%d instances, want %d (every trigger but the refused one, × 2 sagas)", n, 2*(correlator.CopyStarts-1))
	}
	if n := b.count(t, `SELECT count(*) FROM relay_dead_letters WHERE event_id = $1`, bad.RawID); n != 1 {
		t.Fatal("the refused event is not parked")
	}
}

// A registry with a keyed saga keeps the INSERT for large batches too: COPY
// does not carry the concurrency columns, and every keyed instance keeps
// its key and its place in the stream.
func TestALargeBatchOfAKeyedSagaInserts(t *testing.T) {
	t.Parallel()
	b := setupCopy(t, false)
	reg := saga.NewRegistry()
	keyed := def("brief_audit", 1, 0, "research_brief.created")
	keyed.Concurrency = &saga.Concurrency{Limit: 1, Key: func(ev outbox.Event) (string, error) { return "k", nil }}
	reg.MustRegister(keyed)
	corr, err := correlator.New(b.pool, &correlator.Config{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	evs := triggers(correlator.CopyStarts + 1)
	if err := corr.HandleBatch(context.Background(), b.batch(evs...)); err != nil {
		t.Fatal(err)
	}
	if got := b.rec.starts(); fmt.Sprint(got) != "[false]" {
		t.Fatalf("a large keyed batch sent starts guarded=%v, want one plain INSERT", got)
	}
	if n := b.count(t, `SELECT count(*) FROM saga_instances WHERE concurrency_key LIKE '%/k' AND concurrency_lsn IS NOT NULL`); n != len(evs) {
		t.Fatalf("%d keyed instances with their place, want %d", n, len(evs))
	}
}

// A large batch of events that mostly trigger nothing (other services'
// events) keeps the INSERT for its few starts; one with CopyStarts triggers
// among other events streams them, and the others are ignored as before.
func TestALargeBatchStreamsOnlyWithManyTriggers(t *testing.T) {
	t.Parallel()
	b := setupCopy(t, false)
	ctx := context.Background()
	other := func(n int) []outbox.Event {
		evs := make([]outbox.Event, n)
		for i := range evs {
			evs[i] = outbox.Event{ID: uuid.New(), TenantID: uuid.New(), EventType: "invoice.sent", Payload: json.RawMessage(`{}`)}
		}
		return evs
	}
	few := append(other(2*correlator.CopyStarts), triggers(10)...)
	if err := b.corr.HandleBatch(ctx, b.batch(few...)); err != nil {
		t.Fatal(err)
	}
	if got := b.rec.starts(); fmt.Sprint(got) != "[false]" {
		t.Fatalf("a large batch with 10 triggers sent starts guarded=%v, want one plain INSERT", got)
	}
	many := append(append(other(100), triggers(correlator.CopyStarts)...), other(100)...)
	if err := b.corr.HandleBatch(ctx, b.batch(many...)); err != nil {
		t.Fatal(err)
	}
	if got := b.rec.starts(); len(got) != 0 {
		t.Fatalf("a batch with %d triggers sent INSERT starts (guarded=%v), want COPY", correlator.CopyStarts, got)
	}
	s := b.corr.Stats()
	if want := uint64(2 * (10 + correlator.CopyStarts)); s.SagasStarted != want || s.OutcomeIgnored != uint64(2*correlator.CopyStarts+200) {
		t.Fatalf("stats %+v, want %d started and %d ignored", s, want, 2*correlator.CopyStarts+200)
	}
	if n := b.count(t, `SELECT count(*) FROM saga_instances`); n != 2*(10+correlator.CopyStarts) {
		t.Fatalf("%d instances, want %d", n, 2*(10+correlator.CopyStarts))
	}
}
