package correlator_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/compensa/compensa/cdc"
	"github.com/compensa/compensa/correlator"
	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/testkit"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

type testBundle struct {
	db    *pgtest.DB
	reg   *saga.Registry
	corr  *correlator.Correlator
	woken atomic.Int64
	lsn   uint64
}

type briefState struct {
	BriefID string `json:"brief_id"`
}

func decodeBrief(p json.RawMessage) error {
	var s briefState
	dec := json.NewDecoder(strings.NewReader(string(p)))
	if err := dec.Decode(&s); err != nil {
		return err
	}
	if _, err := uuid.Parse(s.BriefID); err != nil {
		return fmt.Errorf("brief_id: %q is not a UUID", s.BriefID)
	}
	return nil
}

func def(name string, version int, deadline time.Duration, triggers ...string) saga.Definition {
	d := saga.Definition{Name: name, Version: version, Deadline: deadline,
		Steps: []saga.Step{{Name: "only", Do: func(context.Context, *saga.StepTx) error { return nil }}}, DecodeState: decodeBrief}
	for _, t := range triggers {
		d.Triggers = append(d.Triggers, saga.Trigger{EventType: t})
	}
	return d
}

func setup(t *testing.T, defs ...saga.Definition) *testBundle {
	t.Helper()
	b := &testBundle{db: pgtest.NewDB(t), reg: saga.NewRegistry(), lsn: 0x1000000}
	if len(defs) == 0 {
		defs = []saga.Definition{def("brief_enrichment", 1, 0, "research_brief.created")}
	}
	b.reg.MustRegister(defs...)
	var err error
	b.corr, err = correlator.New(b.db.Pool, &correlator.Config{Registry: b.reg, Wake: func() { b.woken.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// batch wraps events as one source transaction at the next LSN.
func (b *testBundle) batch(evs ...outbox.Event) cdc.Batch {
	b.lsn += 0x100
	for i := range evs {
		evs[i].LSN = b.lsn
	}
	return cdc.Batch{Slot: "test_slot", Events: evs, CommitLSN: pglogrepl.LSN(b.lsn), EndLSN: pglogrepl.LSN(b.lsn + 0x28), CommitTime: time.Now()}
}

func trigger(tenant uuid.UUID) outbox.Event {
	id := uuid.New()
	return outbox.Event{ID: id, RawID: id.String(), TenantID: tenant, EventType: "research_brief.created",
		Payload: json.RawMessage(fmt.Sprintf(`{"brief_id":%q}`, uuid.New()))}
}

func (b *testBundle) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := b.db.Pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func TestTriggerStartsOneInstanceWithEventFields(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	tenant, ws, corr := uuid.New(), uuid.New(), uuid.New()
	ev := trigger(tenant)
	ev.Payload = json.RawMessage(fmt.Sprintf(`{"brief_id":%q,"workspace_id":%q}`, uuid.New(), ws))
	ev.CorrelationID = uuid.NullUUID{UUID: corr, Valid: true}
	ev.AggregateID = "brief-42"
	if err := b.corr.HandleBatch(ctx, b.batch(ev)); err != nil {
		t.Fatal(err)
	}
	var (
		gotTenant, gotTrigger uuid.UUID
		gotWS, gotCorr        uuid.NullUUID
		status, name          string
		version               int
		context_              []byte
		aggregate             *string
	)
	err := b.db.Pool.QueryRow(ctx, `SELECT tenant_id, workspace_id, trigger_event_id, correlation_id, status::text, saga_name, saga_version, context, trigger_aggregate_id
		FROM saga_instances`).Scan(&gotTenant, &gotWS, &gotTrigger, &gotCorr, &status, &name, &version, &context_, &aggregate)
	if err != nil {
		t.Fatal(err)
	}
	if gotTenant != tenant || gotWS.UUID != ws || gotTrigger != ev.ID || gotCorr.UUID != corr {
		t.Fatalf("instance fields: tenant %v ws %v trigger %v corr %v", gotTenant, gotWS, gotTrigger, gotCorr)
	}
	// The trigger's aggregate id is kept for search (the outbox row may go).
	if aggregate == nil || *aggregate != "brief-42" {
		t.Fatalf("trigger_aggregate_id %v, want brief-42", aggregate)
	}
	if status != "RUNNING" || name != "brief_enrichment" || version != 1 {
		t.Fatalf("status %s saga %s v%d", status, name, version)
	}
	var want, got map[string]any
	json.Unmarshal(ev.Payload, &want)
	json.Unmarshal(context_, &got)
	if fmt.Sprint(want) != fmt.Sprint(got) {
		t.Fatalf("context = %s, want the payload %s", context_, ev.Payload)
	}
	if b.woken.Load() != 1 {
		t.Fatalf("runner woken %d times, want 1", b.woken.Load())
	}
}

func TestEventWithoutTenantStartsUnderNilTenant(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if err := b.corr.HandleBatch(context.Background(), b.batch(trigger(outbox.NilTenant))); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT count(*) FROM saga_instances WHERE tenant_id = '00000000-0000-0000-0000-000000000000'`); n != 1 {
		t.Fatalf("instances under the nil tenant = %d, want 1", n)
	}
}

func TestReplayedBatchStartsNothingAndDeliversNothingTwice(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	waiting, corr := b.waitingInstance(t)
	reply := outbox.Event{ID: uuid.New(), EventType: "payment.authorized", Payload: json.RawMessage(`{"ok":true}`),
		CorrelationID: uuid.NullUUID{UUID: corr, Valid: true}}
	batch := b.batch(trigger(uuid.New()), trigger(uuid.New()), reply)
	if err := b.corr.HandleBatch(ctx, batch); err != nil {
		t.Fatal(err)
	}
	before := b.corr.Stats()
	if before.SagasStarted != 2 || before.RepliesDelivered != 1 {
		t.Fatalf("first delivery: %+v", before)
	}
	// The same batch again: a crash after commit, before the acknowledgement.
	if err := b.corr.HandleBatch(ctx, batch); err != nil {
		t.Fatal(err)
	}
	after := b.corr.Stats()
	if after.SagasStarted != 2 || after.RepliesDelivered != 1 || after.BatchesReplayed != 1 {
		t.Fatalf("after replay: %+v", after)
	}
	if n := b.count(t, `SELECT count(*) FROM saga_instances`); n != 3 {
		t.Fatalf("instances = %d, want 3 (2 started + the waiting one)", n)
	}
	if n := b.count(t, `SELECT count(*) FROM saga_events WHERE instance_id = $1 AND kind = 'reply_received'`, waiting); n != 1 {
		t.Fatalf("reply journaled %d times, want 1", n)
	}
	// Even a replay that slips past the checkpoint (a new batch at a higher
	// LSN carrying the same events) starts nothing and delivers nothing: the
	// unique index and the inbox are the second guard.
	again := b.batch(batch.Events...)
	if err := b.corr.HandleBatch(ctx, again); err != nil {
		t.Fatal(err)
	}
	if s := b.corr.Stats(); s.SagasStarted != 2 || s.DuplicateStarts != 2 || s.RepliesDelivered != 1 {
		t.Fatalf("after re-delivery at a new LSN: %+v", s)
	}
	if n := b.count(t, `SELECT count(*) FROM saga_instances`); n != 3 {
		t.Fatalf("instances = %d, want 3", n)
	}
}

// waitingInstance inserts an instance whose current step waits for a reply.
// waitingInstance is an instance of the nil tenant waiting on a reply (the
// replies of these tests carry no tenant).
func (b *testBundle) waitingInstance(t *testing.T) (uuid.UUID, uuid.UUID) {
	t.Helper()
	return b.waitingInstanceOf(t, outbox.NilTenant)
}

func (b *testBundle) waitingInstanceOf(t *testing.T, tenant uuid.UUID) (uuid.UUID, uuid.UUID) {
	t.Helper()
	id, corr := uuid.New(), uuid.New()
	_, err := b.db.Pool.Exec(context.Background(), `INSERT INTO saga_instances
		(id, tenant_id, saga_name, saga_version, trigger_event_id, current_step, awaiting_correlation_id, awaiting_until, next_attempt_at, lease_id, lease_expires_at)
		VALUES ($1, $2, 'brief_enrichment', 1, $3, 1, $4, now() + interval '1 hour', now() + interval '1 hour', gen_random_uuid(), now() + interval '1 hour')`,
		id, tenant, uuid.New(), corr)
	if err != nil {
		t.Fatal(err)
	}
	return id, corr
}

func TestMixedTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	waiting, corr := b.waitingInstance(t)
	good1, good2 := trigger(uuid.New()), trigger(uuid.New())
	unknown := outbox.Event{ID: uuid.New(), EventType: "invoice.printed", Payload: json.RawMessage(`{}`)}
	reply := outbox.Event{ID: uuid.New(), EventType: "enrichment.done", Payload: json.RawMessage(`{"ok":true,"sources":3}`),
		CorrelationID: uuid.NullUUID{UUID: corr, Valid: true}}
	late := outbox.Event{ID: uuid.New(), EventType: "enrichment.done", Payload: json.RawMessage(`{"ok":true}`),
		CorrelationID: uuid.NullUUID{UUID: uuid.New(), Valid: true}}
	badShape := trigger(uuid.New())
	badShape.Payload = json.RawMessage(`{"brief_id": 42}`)
	missing := trigger(uuid.New())
	missing.Payload = json.RawMessage(`{"title":"no id"}`)
	notJSON := trigger(uuid.New())
	notJSON.Poison = "payload column holds text that is not JSON: invalid character 'h' looking for beginning of value"
	notJSON.Payload = nil
	nul := trigger(uuid.New())
	nul.Payload = json.RawMessage(`{"brief_id":"x\u0000"}`)

	batch := b.batch(good1, unknown, badShape, reply, missing, late, notJSON, good2, nul)
	if err := b.corr.HandleBatch(ctx, batch); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT count(*) FROM saga_instances WHERE trigger_event_id = ANY($1)`, []uuid.UUID{good1.ID, good2.ID}); n != 2 {
		t.Fatalf("good triggers started %d instances, want 2", n)
	}
	if n := b.count(t, `SELECT count(*) FROM saga_instances WHERE trigger_event_id = ANY($1)`,
		[]uuid.UUID{badShape.ID, missing.ID, notJSON.ID, nul.ID, unknown.ID}); n != 0 {
		t.Fatalf("poison or unknown events started %d instances", n)
	}
	var gotReply []byte
	var awaiting uuid.NullUUID
	if err := b.db.Pool.QueryRow(ctx, `SELECT reply, awaiting_correlation_id FROM saga_instances WHERE id = $1`, waiting).Scan(&gotReply, &awaiting); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(gotReply), `"sources": 3`) || awaiting.Valid {
		t.Fatalf("reply not delivered: reply=%s awaiting=%v", gotReply, awaiting)
	}
	rows, err := b.db.Pool.Query(ctx, `SELECT event_id, reason, lsn::text FROM relay_dead_letters ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	reasons := map[string]string{}
	for rows.Next() {
		var id, reason, lsn string
		rows.Scan(&id, &reason, &lsn)
		reasons[id] = reason
		if lsn == "" || lsn == "0/0" {
			t.Errorf("dead letter %s has no LSN", id)
		}
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	wantParked := map[string]string{
		badShape.RawID: "brief_id", missing.RawID: "brief_id", notJSON.RawID: "not JSON", nul.RawID: `\u0000`,
	}
	if len(reasons) != len(wantParked) {
		t.Fatalf("parked %v, want %d events", reasons, len(wantParked))
	}
	for id, frag := range wantParked {
		if !strings.Contains(reasons[id], frag) {
			t.Errorf("reason for %s = %q, want it to mention %q", id, reasons[id], frag)
		}
	}
	cp, ok, err := b.corr.LoadCheckpoint(ctx, "test_slot")
	if err != nil || !ok || cp != batch.EndLSN {
		t.Fatalf("checkpoint = %v %v %v, want %v", cp, ok, err, batch.EndLSN)
	}
	s := b.corr.Stats()
	if s.EventsSeen != 9 || s.SagasStarted != 2 || s.RepliesDelivered != 1 || s.LateReplies != 1 || s.EventsParked != 4 {
		t.Fatalf("stats %+v", s)
	}
}

func TestNewestVersionStartsNewTriggers(t *testing.T) {
	t.Parallel()
	b := setup(t,
		def("brief_enrichment", 1, 0, "research_brief.created"),
		def("brief_enrichment", 2, time.Hour, "research_brief.created", "research_brief.reopened"),
		def("audit", 1, 0, "research_brief.created"),
	)
	ctx := context.Background()
	reopened := trigger(uuid.New())
	reopened.EventType = "research_brief.reopened"
	if err := b.corr.HandleBatch(ctx, b.batch(trigger(uuid.New()), reopened)); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT count(*) FROM saga_instances WHERE saga_name = 'brief_enrichment' AND saga_version = 2 AND timeout_at > now()`); n != 2 {
		t.Fatalf("v2 instances with a deadline = %d, want 2", n)
	}
	if n := b.count(t, `SELECT count(*) FROM saga_instances WHERE saga_name = 'brief_enrichment' AND saga_version = 1`); n != 0 {
		t.Fatalf("v1 instances = %d, want 0", n)
	}
	if n := b.count(t, `SELECT count(*) FROM saga_instances WHERE saga_name = 'audit'`); n != 1 {
		t.Fatalf("one event triggering two sagas: audit instances = %d, want 1", n)
	}
}

func TestAggregateTypeAndTenantMatch(t *testing.T) {
	t.Parallel()
	tenant := uuid.New()
	d := def("scoped", 1, 0)
	d.Triggers = []saga.Trigger{{EventType: "research_brief.created", AggregateType: "brief", TenantID: tenant}}
	b := setup(t, d)
	ctx := context.Background()
	match := trigger(tenant)
	match.AggregateType = "brief"
	otherTenant := trigger(uuid.New())
	otherTenant.AggregateType = "brief"
	otherAgg := trigger(tenant)
	otherAgg.AggregateType = "memo"
	if err := b.corr.HandleBatch(ctx, b.batch(match, otherTenant, otherAgg)); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT count(*) FROM saga_instances WHERE trigger_event_id = $1`, match.ID); n != 1 {
		t.Fatal("matching event did not start")
	}
	if n := b.count(t, `SELECT count(*) FROM saga_instances`); n != 1 {
		t.Fatalf("instances = %d, want 1", n)
	}
}

func TestPartialBatchesDoNotCheckpointUntilTheLast(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	first := b.batch(trigger(uuid.New()))
	first.Partial = true
	if err := b.corr.HandleBatch(ctx, first); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := b.corr.LoadCheckpoint(ctx, "test_slot"); ok {
		t.Fatal("a partial batch wrote the checkpoint")
	}
	last := cdc.Batch{Slot: first.Slot, Events: []outbox.Event{trigger(uuid.New())}, CommitLSN: first.CommitLSN, EndLSN: first.EndLSN}
	if err := b.corr.HandleBatch(ctx, last); err != nil {
		t.Fatal(err)
	}
	if cp, ok, _ := b.corr.LoadCheckpoint(ctx, "test_slot"); !ok || cp != first.EndLSN {
		t.Fatalf("checkpoint %v %v after the last part", cp, ok)
	}
	// Replaying the first part after the whole transaction committed is skipped.
	if err := b.corr.HandleBatch(ctx, first); err != nil {
		t.Fatal(err)
	}
	if s := b.corr.Stats(); s.BatchesReplayed != 1 || s.SagasStarted != 2 {
		t.Fatalf("stats %+v", s)
	}
}

// statementCounter counts the statements sent on a pool's connections.
type statementCounter struct{ n atomic.Int64 }

func (s *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	s.n.Add(1)
	return ctx
}
func (s *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (s *statementCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (s *statementCounter) TraceBatchQuery(_ context.Context, _ *pgx.Conn, _ pgx.TraceBatchQueryData) {
	s.n.Add(1)
}
func (s *statementCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func TestHundredThousandTriggersCostBoundedStatements(t *testing.T) {
	testkit.SkipShort(t, "correlates 100,000 triggers")
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	counter := &statementCounter{}
	cfg.ConnConfig.Tracer = counter
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	reg := saga.NewRegistry()
	reg.MustRegister(def("brief_enrichment", 1, 0, "research_brief.created"))
	corr, err := correlator.New(pool, &correlator.Config{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	b := &testBundle{db: db, lsn: 0x2000000}
	const total = 100_000
	single := 2_000 // transactions of one row
	if testing.Short() {
		single = 500
	}
	maxPerBatch := int64(0)
	handle := func(batch cdc.Batch) {
		before := counter.n.Load()
		if err := corr.HandleBatch(ctx, batch); err != nil {
			t.Fatal(err)
		}
		// BEGIN, checkpoint, start, notify, COMMIT.
		if n := counter.n.Load() - before; n > maxPerBatch {
			maxPerBatch = n
		}
	}
	for i := 0; i < single; i++ {
		handle(b.batch(trigger(uuid.New())))
	}
	for sent := single; sent < total; sent += 1000 {
		evs := make([]outbox.Event, 0, 1000)
		for j := 0; j < 1000 && sent+j < total; j++ {
			evs = append(evs, trigger(uuid.New()))
		}
		handle(b.batch(evs...))
	}
	if maxPerBatch > 6 {
		t.Fatalf("a batch cost %d statements, want a constant ≤ 6", maxPerBatch)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM saga_instances`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != total {
		t.Fatalf("instances = %d, want %d", n, total)
	}
	t.Logf("max statements per batch: %d", maxPerBatch)
}

func TestDeadLetterRetryOnceCauseIsFixed(t *testing.T) {
	t.Parallel()
	strict := def("brief_enrichment", 1, 0, "research_brief.created")
	b := setup(t, strict)
	ctx := context.Background()
	ev := trigger(uuid.New())
	ev.Payload = json.RawMessage(`{"brief_id":"not-a-uuid"}`)
	ev.Raw = map[string]any{"id": ev.RawID, "event_type": ev.EventType, "payload": string(ev.Payload),
		"tenant_id": ev.TenantID.String()}
	if err := b.corr.HandleBatch(ctx, b.batch(ev)); err != nil {
		t.Fatal(err)
	}
	list, err := b.corr.ListDeadLetters(ctx, true, 10)
	if err != nil || len(list) != 1 {
		t.Fatalf("list = %v, %v", list, err)
	}
	// Still poison: stays parked, retry counted.
	if _, err := b.corr.RetryDeadLetter(ctx, list[0].ID); !errors.Is(err, correlator.ErrStillPoison) {
		t.Fatalf("retry of a still-bad event: %v", err)
	}
	// The cause is fixed: a new version accepts any brief_id.
	lenient := def("brief_enrichment", 2, 0, "research_brief.created")
	lenient.DecodeState = nil
	reg := saga.NewRegistry()
	reg.MustRegister(strict, lenient)
	fixed, err := correlator.New(b.db.Pool, &correlator.Config{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	d, err := fixed.RetryDeadLetter(ctx, list[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	if d.RetriedAt == nil || d.RetryCount != 2 {
		t.Fatalf("after retry: %+v", d)
	}
	if n := b.count(t, `SELECT count(*) FROM saga_instances WHERE trigger_event_id = $1 AND saga_version = 2`, ev.ID); n != 1 {
		t.Fatalf("re-driven event started %d instances, want 1", n)
	}
	if _, err := fixed.RetryDeadLetter(ctx, 999999); !errors.Is(err, correlator.ErrDeadLetterNotFound) {
		t.Fatalf("unknown id: %v", err)
	}
}
