package briefs_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/compensa/compensa/cdc"
	"github.com/compensa/compensa/correlator"
	"github.com/compensa/compensa/internal/briefs"
	"github.com/compensa/compensa/internal/httpapi"
	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/pgjournal"
	"github.com/compensa/compensa/test/pgtest"
)

// These tests run the saga through the real relay, in process: the cdc
// stream reads the outbox inserts out of the WAL, the correlator starts the
// instances, the runner runs the steps on the PostgreSQL journal. Nothing
// calls a step directly.

type relayBundle struct {
	ctx     context.Context
	pool    *pgxpool.Pool
	journal saga.Journal
	runner  *saga.Runner
	api     *httptest.Server
	tenant  uuid.UUID
}

// startRelay runs a relay with the given definitions (default: the real
// brief_enrichment).
func startRelay(t *testing.T, defs ...saga.Definition) *relayBundle {
	t.Helper()
	if len(defs) == 0 {
		defs = []saga.Definition{briefs.Definition()}
	}
	db := pgtest.NewDB(t)
	ctx := context.Background()
	// The harness's pool is sized for a test's own queries; the runner's
	// workers, its claims and the correlator need more.
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)

	reg := saga.NewRegistry()
	if err := reg.Register(defs...); err != nil {
		t.Fatal(err)
	}
	journal, err := pgjournal.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	runner, err := saga.NewRunner(journal, pool, reg, &saga.RunnerConfig{
		Workers: 6, PollInterval: 20 * time.Millisecond, MaxPollInterval: 200 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	corr, err := correlator.New(pool, &correlator.Config{Registry: reg, Wake: runner.Wake})
	if err != nil {
		t.Fatal(err)
	}
	stream, err := cdc.NewStream(cdc.Config{
		DatabaseURL: db.URL, Slot: db.Slot, Publication: db.Publication,
		StatusInterval: 200 * time.Millisecond, HeartbeatInterval: time.Second,
		LoadCheckpoint: func(ctx context.Context) (pglogrepl.LSN, bool, error) {
			return corr.LoadCheckpoint(ctx, db.Slot)
		},
	}, corr)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	if err := runner.Start(runCtx); err != nil {
		cancel()
		t.Fatal(err)
	}
	streamDone := make(chan error, 1)
	go func() { streamDone <- stream.Run(runCtx) }()
	t.Cleanup(func() {
		cancel()
		stopCtx, stop := context.WithTimeout(context.Background(), 30*time.Second)
		defer stop()
		select {
		case err := <-streamDone:
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("stream: %v", err)
			}
		case <-stopCtx.Done():
			t.Error("stream did not stop")
		}
		if err := runner.Stop(stopCtx); err != nil {
			t.Errorf("runner stop: %v", err)
		}
	})
	mon, err := httpapi.New(httpapi.Config{Pool: pool, Journal: journal, Registry: reg, APIToken: apiToken})
	if err != nil {
		t.Fatal(err)
	}
	api := httptest.NewServer(mon)
	t.Cleanup(api.Close)
	return &relayBundle{ctx: ctx, pool: pool, journal: journal, runner: runner, api: api, tenant: uuid.New()}
}

const apiToken = "brief-test-token"

// retry asks the monitor's API to retry an instance, as an operator would.
func (b *relayBundle) retry(t *testing.T, inst uuid.UUID, reason string) {
	t.Helper()
	body, _ := json.Marshal(map[string]string{"reason": reason})
	req, _ := http.NewRequestWithContext(b.ctx, http.MethodPost, b.api.URL+"/v1/sagas/"+inst.String()+"/retry", strings.NewReader(string(body)))
	req.Header.Set("Authorization", "Bearer "+apiToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := b.api.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		var msg map[string]any
		json.NewDecoder(resp.Body).Decode(&msg)
		t.Fatalf("POST retry: %s %v", resp.Status, msg)
	}
}

// create commits a brief and its trigger in one application transaction.
func (b *relayBundle) create(t *testing.T, title, body string) uuid.UUID {
	t.Helper()
	var id uuid.UUID
	err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		var err error
		id, err = briefs.Create(b.ctx, tx, b.tenant, title, body)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func (b *relayBundle) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(b.ctx, sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// instanceOf returns the saga instance started by the brief's trigger.
func (b *relayBundle) instanceOf(t *testing.T, brief uuid.UUID) (uuid.UUID, saga.Status) {
	t.Helper()
	var id uuid.UUID
	var st string
	err := b.pool.QueryRow(b.ctx, `SELECT i.id, i.status::text FROM saga_instances i
		JOIN outbox o ON o.id = i.trigger_event_id
		WHERE o.event_type = $1 AND o.aggregate_id = $2::text`, briefs.EventCreated, brief).Scan(&id, &st)
	if err != nil {
		t.Fatalf("instance of brief %s: %v", brief, err)
	}
	return id, saga.Status(st)
}

// waitEnded waits until n instances of the saga have ended.
func (b *relayBundle) waitEnded(t *testing.T, n int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		got := b.count(t, `SELECT count(*) FROM saga_instances
			WHERE status IN ('COMPLETED','COMPENSATED','FAILED','TIMED_OUT')`)
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			var dump string
			b.pool.QueryRow(b.ctx, `SELECT coalesce(string_agg(status::text || ' step ' || current_step || ' ' || coalesce(last_error, ''), E'\n'), 'none')
				FROM saga_instances WHERE status NOT IN ('COMPLETED','COMPENSATED','FAILED','TIMED_OUT')`).Scan(&dump)
			t.Fatalf("only %d of %d sagas ended within %s; the others:\n%s", got, n, within, dump)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitStatus waits until the instance has the status.
func (b *relayBundle) waitStatus(t *testing.T, inst uuid.UUID, want saga.Status, within time.Duration) saga.Instance {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		got, err := b.journal.Get(b.ctx, inst)
		if err != nil {
			t.Fatal(err)
		}
		if got.Status == want {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("instance %s is %s (%s), want %s", inst, got.Status, got.LastError, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// compensations returns the journal's compensation events of an instance, in
// order, as "kind:step_name".
func (b *relayBundle) compensations(t *testing.T, inst uuid.UUID) []string {
	t.Helper()
	evs, err := b.journal.Load(b.ctx, inst)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range evs {
		switch e.Kind {
		case saga.EventStepCompensated, saga.EventCompensationSkipped, saga.EventCompensationFailed:
			out = append(out, fmt.Sprintf("%s:%s", e.Kind, stepName(e.Step)))
		}
	}
	return out
}

func stepName(i int) string {
	names := briefs.Definition().StepNames()
	if i < 0 || i >= len(names) {
		return fmt.Sprint(i)
	}
	return names[i]
}

type briefRow struct {
	status     string
	enrichment []byte
	sources    int
	enriched   int // research_brief.enriched outbox rows
	reverted   int // research_brief.enrichment_reverted outbox rows
}

func (b *relayBundle) brief(t *testing.T, id uuid.UUID) briefRow {
	t.Helper()
	var r briefRow
	err := b.pool.QueryRow(b.ctx, `SELECT status::text, enrichment,
		(SELECT count(*) FROM brief_sources WHERE brief_id = $1),
		(SELECT count(*) FROM outbox WHERE event_type = $2 AND aggregate_id = $1::text),
		(SELECT count(*) FROM outbox WHERE event_type = $3 AND aggregate_id = $1::text)
		FROM research_briefs WHERE id = $1`, id, briefs.EventEnriched, briefs.EventEnrichmentReverted).
		Scan(&r.status, &r.enrichment, &r.sources, &r.enriched, &r.reverted)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestFiftyBriefsFiveFailScore(t *testing.T) {
	t.Parallel()
	b := startRelay(t)
	var ok, failing []uuid.UUID
	for i := range 50 {
		title, body := briefs.Sample(i)
		if i%10 == 3 {
			failing = append(failing, b.create(t, briefs.FailScoreMarker+" "+title, body))
			continue
		}
		ok = append(ok, b.create(t, title, body))
	}
	b.waitEnded(t, 50, 90*time.Second)

	if n := b.count(t, `SELECT count(*) FROM saga_instances WHERE saga_name = $1`, briefs.SagaName); n != 50 {
		t.Fatalf("%d instances, want 50", n)
	}
	for _, id := range ok {
		r := b.brief(t, id)
		if r.status != briefs.StatusEnriched || r.sources == 0 || r.sources > briefs.MaxSources || r.enriched != 1 || r.reverted != 0 {
			t.Fatalf("brief %s: %+v, want ENRICHED with 1..5 sources and exactly one %s row", id, r, briefs.EventEnriched)
		}
		var e briefs.Enrichment
		if err := json.Unmarshal(r.enrichment, &e); err != nil || e.SourceCount != r.sources || e.TotalWords == 0 || e.ReadingMinutes == 0 || len(e.TopKeywords) == 0 {
			t.Fatalf("brief %s enrichment %s (%v)", id, r.enrichment, err)
		}
		inst, st := b.instanceOf(t, id)
		if st != saga.StatusCompleted {
			t.Fatalf("brief %s: instance %s is %s", id, inst, st)
		}
		// The emitted event names the brief and its sources, best first,
		// and is tied to the saga's trigger.
		var payload []byte
		var cause uuid.UUID
		var tenant uuid.UUID
		b.pool.QueryRow(b.ctx, `SELECT payload, causation_id, tenant_id FROM outbox WHERE event_type = $1 AND aggregate_id = $2::text`,
			briefs.EventEnriched, id).Scan(&payload, &cause, &tenant)
		var p briefs.EnrichedPayload
		if err := json.Unmarshal(payload, &p); err != nil || p.BriefID != id || len(p.Sources) != r.sources {
			t.Fatalf("brief %s: enriched payload %s (%v)", id, payload, err)
		}
		if n := b.count(t, `SELECT count(*) FROM brief_sources WHERE brief_id = $1 AND document_id = $2 AND rank = 1`, id, p.Sources[0]); n != 1 {
			t.Fatalf("brief %s: first source in the event is not rank 1", id)
		}
		if tenant != b.tenant {
			t.Fatalf("brief %s: event tenant %s, want %s", id, tenant, b.tenant)
		}
		if n := b.count(t, `SELECT count(*) FROM saga_instances WHERE id = $1 AND trigger_event_id = $2`, inst, cause); n != 1 {
			t.Fatalf("brief %s: event's causation id %s is not the saga's trigger", id, cause)
		}
	}
	for _, id := range failing {
		r := b.brief(t, id)
		if r.status != briefs.StatusDraft || r.sources != 0 || r.enrichment != nil || r.enriched != 0 || r.reverted != 0 {
			t.Fatalf("failed brief %s: %+v, want DRAFT, no sources, no enrichment, no event", id, r)
		}
		inst, st := b.instanceOf(t, id)
		if st != saga.StatusCompensated {
			t.Fatalf("failed brief %s: instance is %s, want COMPENSATED", id, st)
		}
		got := strings.Join(b.compensations(t, inst), " ")
		// score_brief failed without acting, publish_brief never ran:
		// neither is compensated.
		want := "step_compensated:attach_sources step_compensated:claim_brief"
		if got != want {
			t.Fatalf("failed brief %s: compensations %q, want %q", id, got, want)
		}
		var lastErr string
		b.pool.QueryRow(b.ctx, `SELECT coalesce(compensation_reason, '') FROM saga_instances WHERE id = $1`, inst).Scan(&lastErr)
		if !strings.Contains(lastErr, briefs.StepScore) || !strings.Contains(lastErr, briefs.FailScoreMarker) {
			t.Fatalf("failed brief %s: compensation reason %q should name score_brief and the marker", id, lastErr)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM outbox WHERE event_type = $1`, briefs.EventEnriched); n != 45 {
		t.Fatalf("%d %s rows, want 45", n, briefs.EventEnriched)
	}
}

func TestStuckCompensationFailsThenRetryCompensates(t *testing.T) {
	t.Parallel()
	b := startRelay(t)
	id := b.create(t, briefs.FailScoreMarker+briefs.FailUnattachMarker+" Rooftop solar for a school", "inverters and photovoltaic panels")
	b.waitEnded(t, 1, 60*time.Second)
	inst, _ := b.instanceOf(t, id)
	got := b.waitStatus(t, inst, saga.StatusFailed, time.Second)
	if !strings.Contains(got.LastError, briefs.FailUnattachMarker) {
		t.Fatalf("last_error %q should say why", got.LastError)
	}
	// The compensation was tried as often as its policy allows, and claim_brief's
	// compensation never ran: nothing is marked compensated that did not run.
	steps, err := b.journal.Steps(b.ctx, inst)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range steps {
		if s.Name == briefs.StepAttach && s.CompensationAttempts != briefs.CompensationRetry.MaxAttempts {
			t.Fatalf("attach_sources compensation attempts %d, want %d", s.CompensationAttempts, briefs.CompensationRetry.MaxAttempts)
		}
		if s.Status == saga.StepStatus("COMPENSATED") {
			t.Fatalf("step %s marked COMPENSATED in a FAILED saga", s.Name)
		}
	}
	r := b.brief(t, id)
	if r.status != briefs.StatusEnriching || r.sources == 0 {
		t.Fatalf("brief of the FAILED saga: %+v, want still ENRICHING with its sources", r)
	}
	if comp := b.compensations(t, inst); len(comp) != briefs.CompensationRetry.MaxAttempts || comp[0] != "compensation_failed:attach_sources" {
		t.Fatalf("journal compensations %v, want %d failed attempts of attach_sources", comp, briefs.CompensationRetry.MaxAttempts)
	}

	// The operator edits the title, then retries through the API: the
	// compensation reads the title when it runs, and resumes where it stood.
	if _, err := b.pool.Exec(b.ctx, `UPDATE research_briefs SET title = replace(title, $2, '') WHERE id = $1`, id, briefs.FailUnattachMarker); err != nil {
		t.Fatal(err)
	}
	b.retry(t, inst, "removed [fail-unattach] from the title")
	b.runner.Wake()
	b.waitStatus(t, inst, saga.StatusCompensated, 30*time.Second)
	r = b.brief(t, id)
	if r.status != briefs.StatusDraft || r.sources != 0 || r.enrichment != nil || r.enriched != 0 || r.reverted != 0 {
		t.Fatalf("brief after the retry: %+v, want DRAFT with nothing attached", r)
	}
	comp := b.compensations(t, inst)
	tail := strings.Join(comp[len(comp)-2:], " ")
	if tail != "step_compensated:attach_sources step_compensated:claim_brief" {
		t.Fatalf("compensations after the retry %v", comp)
	}
	evs, _ := b.journal.Load(b.ctx, inst)
	retried := false
	for _, e := range evs {
		if e.Kind == saga.EventRetryRequested && strings.Contains(e.Reason, "removed") {
			retried = true
		}
	}
	if !retried {
		t.Fatal("the journal does not record the retry request")
	}
}

func TestBadTriggerIsParkedAndStartsNothing(t *testing.T) {
	t.Parallel()
	b := startRelay(t)
	payloads := []string{`{}`, `{"brief_id": "not-a-uuid"}`}
	for _, p := range payloads {
		err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
			return outbox.Write(b.ctx, tx, outbox.Message{EventType: briefs.EventCreated, Payload: json.RawMessage(p)})
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	// A good brief after them shows the stream went on.
	good := b.create(t, "Saving coral reefs", "coral nurseries")
	b.waitEnded(t, 1, 60*time.Second)
	if _, st := b.instanceOf(t, good); st != saga.StatusCompleted {
		t.Fatalf("good brief's saga is %s", st)
	}
	if n := b.count(t, `SELECT count(*) FROM saga_instances`); n != 1 {
		t.Fatalf("%d instances, want only the good brief's", n)
	}
	if n := b.count(t, `SELECT count(*) FROM relay_dead_letters WHERE event_type = $1 AND reason LIKE '%brief_id%'`, briefs.EventCreated); n != len(payloads) {
		t.Fatalf("%d parked events naming brief_id, want %d", n, len(payloads))
	}
}

func TestSecondTriggerForAnEnrichedBriefChangesNothing(t *testing.T) {
	t.Parallel()
	b := startRelay(t)
	id := b.create(t, "Heat pumps in old houses", "radiator sizing and home insulation")
	b.waitEnded(t, 1, 60*time.Second)
	before := b.brief(t, id)
	// Another application bug sends the trigger again, as a new event.
	err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		return outbox.Write(b.ctx, tx, outbox.Message{TenantID: b.tenant, EventType: briefs.EventCreated,
			AggregateType: briefs.AggregateType, AggregateID: "again-" + id.String(), Payload: briefs.CreatedPayload{BriefID: id}})
	})
	if err != nil {
		t.Fatal(err)
	}
	b.waitEnded(t, 2, 60*time.Second)
	var st, reason string
	b.pool.QueryRow(b.ctx, `SELECT i.status::text, coalesce(i.compensation_reason, '') FROM saga_instances i JOIN outbox o ON o.id = i.trigger_event_id
		WHERE o.aggregate_id = $1`, "again-"+id.String()).Scan(&st, &reason)
	if st != string(saga.StatusCompensated) || !strings.Contains(reason, "ENRICHED") {
		t.Fatalf("second saga %s (%q), want COMPENSATED because the brief is not DRAFT", st, reason)
	}
	after := b.brief(t, id)
	if after.status != briefs.StatusEnriched || after.sources != before.sources || after.enriched != 1 || after.reverted != 0 {
		t.Fatalf("brief after the second saga: %+v, before %+v", after, before)
	}
}

// publish_brief is the last step, so nothing after it can fail in
// brief_enrichment itself: a variant with one more step that fails for good
// makes the runner compensate all four, publish_brief's included.
func TestEveryCompensationThroughTheRunner(t *testing.T) {
	t.Parallel()
	def := briefs.Definition()
	def.Name = "brief_enrichment_then_fail"
	def.Steps = append(def.Steps, saga.Step{Name: "explode", Do: func(context.Context, *saga.StepTx) error {
		return saga.Permanent(errors.New("explode: fails for good"))
	}})
	b := startRelay(t, def)
	id := b.create(t, "Moving freight by rail", "intermodal containers and freight corridors")
	b.waitEnded(t, 1, 60*time.Second)
	inst, st := b.instanceOf(t, id)
	if st != saga.StatusCompensated {
		t.Fatalf("instance is %s, want COMPENSATED", st)
	}
	got := strings.Join(b.compensations(t, inst), " ")
	want := "step_compensated:publish_brief step_compensated:score_brief step_compensated:attach_sources step_compensated:claim_brief"
	if got != want {
		t.Fatalf("compensations %q, want %q", got, want)
	}
	r := b.brief(t, id)
	if r.status != briefs.StatusDraft || r.sources != 0 || r.enrichment != nil || r.enriched != 1 || r.reverted != 1 {
		t.Fatalf("brief %+v, want DRAFT, nothing attached, one enriched and one reverted event", r)
	}
	// The reverted event follows the enriched one and names the brief.
	var payload []byte
	var later bool
	err := b.pool.QueryRow(b.ctx, `SELECT r.payload, r.created_at >= e.created_at FROM outbox r, outbox e
		WHERE r.event_type = $1 AND e.event_type = $2 AND r.aggregate_id = $3::text AND e.aggregate_id = $3::text`,
		briefs.EventEnrichmentReverted, briefs.EventEnriched, id).Scan(&payload, &later)
	if err != nil || !later || !strings.Contains(string(payload), id.String()) {
		t.Fatalf("reverted event %s later=%v (%v)", payload, later, err)
	}
}
