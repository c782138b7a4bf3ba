package admin_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/admin"
	"github.com/compensa/compensa/saga/pgjournal"
)

// live is a bundle with the real PostgreSQL journal, tables the test steps
// log their committed effects to, and an Admin that can act.
type live struct {
	*testBundle
	journal saga.Journal
	logs    *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func setupLive(t *testing.T, defs ...saga.Definition) *live {
	t.Helper()
	b := setup(t)
	if len(defs) > 0 {
		b.reg = saga.NewRegistry()
		b.reg.MustRegister(defs...)
	}
	j, err := pgjournal.New(b.db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	l := &live{testBundle: b, journal: j, logs: &syncBuffer{}}
	l.adm, err = admin.New(admin.Config{Pool: b.db.Pool, Journal: l.journal, Registry: b.reg})
	if err != nil {
		t.Fatal(err)
	}
	// Step effects and compensations, in commit order: a row exists exactly
	// when its step's transaction committed.
	b.exec(t, `CREATE TABLE effects (id bigserial PRIMARY KEY, instance_id uuid NOT NULL, step text NOT NULL, compensation bool NOT NULL)`)
	t.Cleanup(func() {
		if t.Failed() {
			t.Log("runner logs:\n" + l.logs.String())
		}
	})
	return l
}

// logEffect returns a step function that records its effect in the step's
// transaction.
func logEffect(step string, compensation bool) func(context.Context, *saga.StepTx) error {
	return func(ctx context.Context, x *saga.StepTx) error {
		_, err := x.Tx.Exec(ctx, `INSERT INTO effects (instance_id, step, compensation) VALUES ($1, $2, $3)`, x.Instance.ID, step, compensation)
		return err
	}
}

func (l *live) effects(t *testing.T, id uuid.UUID) []string {
	t.Helper()
	rows, err := l.db.Pool.Query(context.Background(), `SELECT step, compensation FROM effects WHERE instance_id = $1 ORDER BY id`, id)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		var c bool
		if err := rows.Scan(&s, &c); err != nil {
			t.Fatal(err)
		}
		if c {
			s = "undo " + s
		}
		out = append(out, s)
	}
	return out
}

// runner starts a runner and returns its stop function (also called when
// the test ends).
func (l *live) runner(t *testing.T) func() {
	t.Helper()
	r, err := saga.NewRunner(l.journal, l.db.Pool, l.reg, &saga.RunnerConfig{
		Workers: 2, PollInterval: 10 * time.Millisecond, MaxPollInterval: 50 * time.Millisecond,
		LeaseDuration: 10 * time.Second, Logger: slog.New(slog.NewTextHandler(l.logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if err := r.Stop(ctx); err != nil {
				t.Errorf("runner Stop: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func (l *live) start(t *testing.T, name string, version int) uuid.UUID {
	t.Helper()
	inst := saga.Instance{ID: uuid.New(), TenantID: tenantA, SagaName: name, SagaVersion: version,
		Status: saga.StatusRunning, TriggerEventID: uuid.New(), Context: json.RawMessage(`{}`)}
	if err := l.journal.Enqueue(context.Background(), inst); err != nil {
		t.Fatal(err)
	}
	return inst.ID
}

// waitFor polls the instance until ok holds.
func (l *live) waitFor(t *testing.T, id uuid.UUID, what string, ok func(saga.Instance) bool) saga.Instance {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		inst, err := l.journal.Get(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if ok(inst) {
			return inst
		}
		if time.Now().After(deadline) {
			t.Fatalf("instance %s never became %s: %s at step %d attempt %d, last error %q\n%s",
				id, what, inst.Status, inst.CurrentStep, inst.Attempt, inst.LastError, l.history(t, id))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (l *live) history(t *testing.T, id uuid.UUID) string {
	t.Helper()
	evs, err := l.journal.Load(context.Background(), id)
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, e := range evs {
		fmt.Fprintf(&b, "  v%d %s step=%d reason=%q actor=%q error=%q\n", e.Version, e.Kind, e.Step, e.Reason, e.Actor, e.Error)
	}
	return b.String()
}

func (l *live) events(t *testing.T, id uuid.UUID) []saga.RecordedEvent {
	t.Helper()
	evs, err := l.journal.Load(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

func kindsAfter(evs []saga.RecordedEvent, version int64) []string {
	var out []string
	for _, e := range evs {
		if e.Version > version {
			out = append(out, fmt.Sprintf("%s:%d", e.Kind, e.Step))
		}
	}
	return out
}

// TestRetryFailedRunsFailedCompensationThenTheRest: a compensation that
// exhausted its attempts leaves the instance FAILED with nothing marked
// compensated. Retry puts it back at that compensation without marking
// anything; the runner then runs that compensation first and the one below
// it next, in reverse order, and the instance ends COMPENSATED.
func TestRetryFailedRunsFailedCompensationThenTheRest(t *testing.T) {
	t.Parallel()
	var refundDown atomic.Bool
	refundDown.Store(true)
	def := saga.Definition{Name: "order", Version: 1, Triggers: []saga.Trigger{{EventType: "order.placed"}},
		Steps: []saga.Step{
			{Name: "reserve", Do: logEffect("reserve", false), Compensate: logEffect("reserve", true)},
			{Name: "charge", Do: logEffect("charge", false),
				Compensate: func(ctx context.Context, x *saga.StepTx) error {
					if refundDown.Load() {
						return errors.New("refund service unavailable")
					}
					return logEffect("charge", true)(ctx, x)
				},
				CompensationRetry: saga.RetryPolicy{MaxAttempts: 2, Base: 10 * time.Millisecond, Jitter: -1}},
			{Name: "ship", Do: func(context.Context, *saga.StepTx) error {
				return saga.Permanent(errors.New("no courier serves this address"))
			}},
		}}
	l := setupLive(t, def)
	ctx := context.Background()
	stop := l.runner(t)
	id := l.start(t, "order", 1)
	l.waitFor(t, id, "FAILED", func(i saga.Instance) bool { return i.Status == saga.StatusFailed })
	stop()

	if got := l.effects(t, id); strings.Join(got, ",") != "reserve,charge" {
		t.Fatalf("effects before the retry: %v, want reserve,charge and no compensation", got)
	}
	d, err := l.adm.Show(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if d.Instance.StuckReason != admin.StuckFailed || d.Instance.CurrentStep != 1 {
		t.Fatalf("FAILED instance: stuck %q at step %d, want failed at 1 (charge)", d.Instance.StuckReason, d.Instance.CurrentStep)
	}
	if d.Steps[1].CompensationAttempts != 2 {
		t.Errorf("charge's compensation attempts %d, want 2", d.Steps[1].CompensationAttempts)
	}
	versionBefore := d.Instance.Version

	res, err := l.adm.Retry(ctx, id, "refund service is back", "test:alice")
	if err != nil {
		t.Fatal(err)
	}
	if res.AlreadyRequested || res.Instance.Status != saga.StatusCompensating || res.Instance.CurrentStep != 1 || res.Instance.Attempt != 0 {
		t.Fatalf("after retry: %+v", res)
	}
	// The journal-level effect, before any runner acts: COMPENSATING at the
	// failed compensation, its attempts reset, nothing marked compensated.
	d, err = l.adm.Show(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range d.Steps {
		if s.Status == saga.StepCompensated {
			t.Errorf("step %d (%s) is COMPENSATED before its compensation ran", s.Sequence, s.Name)
		}
	}
	if d.Steps[1].CompensationAttempts != 0 || d.Steps[1].Status != saga.StepCompleted {
		t.Errorf("charge after retry: %+v", d.Steps[1])
	}
	last := d.Events[len(d.Events)-1]
	var payload saga.Event
	if err := json.Unmarshal(last.Payload, &payload); err != nil {
		t.Fatal(err)
	}
	if last.Kind != saga.EventRetryRequested || payload.Reason != "refund service is back" || payload.Actor != "test:alice" || last.CreatedAt.IsZero() {
		t.Errorf("journal entry of the retry: %+v %s", last, last.Payload)
	}
	stuck, err := l.adm.List(ctx, admin.Filter{Stuck: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(stuck.Items) != 0 {
		t.Errorf("a retried instance is still listed as stuck: %+v", stuck.Items)
	}

	// Asking again while the retry is pending changes nothing.
	again, err := l.adm.Retry(ctx, id, "clicked twice", "test:bob")
	if err != nil {
		t.Fatal(err)
	}
	if !again.AlreadyRequested || again.Instance.Status != res.Instance.Status || again.Instance.CurrentStep != res.Instance.CurrentStep {
		t.Errorf("second retry: %+v", again)
	}
	if n := len(l.events(t, id)); int64(n) != versionBefore+1 {
		t.Errorf("%d events after two retries, want %d (one retry_requested)", n, versionBefore+1)
	}
	if _, err := l.adm.Cancel(ctx, id, "", "test:bob"); !errors.Is(err, saga.ErrConflict) {
		t.Errorf("cancel of a compensating instance: %v, want ErrConflict", err)
	}

	refundDown.Store(false)
	l.runner(t)
	l.waitFor(t, id, "COMPENSATED", func(i saga.Instance) bool { return i.Status == saga.StatusCompensated })
	if got := l.effects(t, id); strings.Join(got, ",") != "reserve,charge,undo charge,undo reserve" {
		t.Errorf("effects: %v, want the failed compensation (charge) first, then reserve", got)
	}
	after := kindsAfter(l.events(t, id), versionBefore)
	want := []string{"retry_requested:-1", "step_compensated:1", "step_compensated:0", "compensated:-1"}
	if strings.Join(after, " ") != strings.Join(want, " ") {
		t.Errorf("journal after the retry: %v, want %v", after, want)
	}
}

// TestRetryStuckRunningRerunsCurrentStep: an instance whose next attempt is
// long overdue with no runner is stuck; retry makes its current step run
// now; the next step does not run first and no step runs twice.
func TestRetryStuckRunningRerunsCurrentStep(t *testing.T) {
	t.Parallel()
	var paymentsDown atomic.Bool
	paymentsDown.Store(true)
	def := saga.Definition{Name: "payment", Version: 1, Triggers: []saga.Trigger{{EventType: "payment.requested"}},
		Steps: []saga.Step{
			{Name: "authorize", Do: logEffect("authorize", false)},
			{Name: "capture", Do: func(ctx context.Context, x *saga.StepTx) error {
				if paymentsDown.Load() {
					return errors.New("payment gateway timeout")
				}
				return logEffect("capture", false)(ctx, x)
			}, Retry: saga.RetryPolicy{MaxAttempts: 5, Base: time.Hour, Jitter: -1}},
			{Name: "receipt", Do: logEffect("receipt", false)},
		}}
	l := setupLive(t, def)
	ctx := context.Background()
	stop := l.runner(t)
	id := l.start(t, "payment", 1)
	l.waitFor(t, id, "failed once at capture", func(i saga.Instance) bool { return i.CurrentStep == 1 && i.Attempt == 1 })
	stop()

	// The relay was down for a while: the next attempt is overdue.
	l.exec(t, `UPDATE saga_instances SET next_attempt_at = now() - interval '10 minutes' WHERE id = $1`, id)
	stuck, err := l.adm.List(ctx, admin.Filter{Stuck: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(stuck.Items) != 1 || stuck.Items[0].StuckReason != admin.StuckOverdue || stuck.Items[0].CurrentStepName != "capture" {
		t.Fatalf("stuck list: %+v", stuck.Items)
	}
	before := len(l.events(t, id))

	paymentsDown.Store(false)
	res, err := l.adm.Retry(ctx, id, "gateway recovered", "test:carol")
	if err != nil {
		t.Fatal(err)
	}
	if res.Instance.Status != saga.StatusRunning || res.Instance.CurrentStep != 1 || res.Instance.Attempt != 0 || res.Instance.StuckReason != "" {
		t.Fatalf("after retry: %+v", res.Instance)
	}
	steps, err := l.journal.Steps(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if len(steps) != 2 || steps[1].Attempts != 0 || steps[1].Status == saga.StepCompleted {
		t.Errorf("capture after retry: %+v", steps)
	}

	l.runner(t)
	l.waitFor(t, id, "COMPLETED", func(i saga.Instance) bool { return i.Status == saga.StatusCompleted })
	if got := l.effects(t, id); strings.Join(got, ",") != "authorize,capture,receipt" {
		t.Errorf("effects: %v, want authorize,capture,receipt (capture re-run before receipt, nothing twice)", got)
	}
	after := kindsAfter(l.events(t, id), int64(before))
	want := []string{"retry_requested:-1", "step_completed:1", "step_completed:2", "completed:-1"}
	if strings.Join(after, " ") != strings.Join(want, " ") {
		t.Errorf("journal after the retry: %v, want %v", after, want)
	}
}

// TestActionRules covers the refusals and the idempotence of Retry and
// Cancel against the real journal, without a runner.
func TestActionRules(t *testing.T) {
	t.Parallel()
	l := setupLive(t)
	ctx := context.Background()

	// Finished instances.
	done := l.start(t, "order", 1)
	c, err := l.journal.ClaimPending(ctx, 10, time.Minute)
	if err != nil || len(c) != 1 {
		t.Fatalf("claim: %v %v", c, err)
	}
	if ok, err := l.journal.MarkTerminal(ctx, done, c[0].LeaseID.UUID, saga.StatusCompleted, ""); !ok || err != nil {
		t.Fatalf("MarkTerminal: %v %v", ok, err)
	}
	if _, err := l.adm.Retry(ctx, done, "why not", "test"); !errors.Is(err, saga.ErrConflict) || !strings.Contains(err.Error(), "COMPLETED") {
		t.Errorf("retry of a COMPLETED instance: %v", err)
	}
	if _, err := l.adm.Cancel(ctx, done, "", "test"); !errors.Is(err, saga.ErrConflict) {
		t.Errorf("cancel of a COMPLETED instance: %v", err)
	}

	// A runner holds this one: not stuck, retry refused; cancel revokes the
	// lease.
	leased := l.start(t, "order", 1)
	claimed, err := l.journal.ClaimPending(ctx, 10, time.Minute)
	if err != nil || len(claimed) != 1 {
		t.Fatalf("claim: %v %v", claimed, err)
	}
	if _, err := l.adm.Retry(ctx, leased, "push", "test"); !errors.Is(err, saga.ErrConflict) || !strings.Contains(err.Error(), "being worked on") {
		t.Errorf("retry under a live lease: %v, want ErrConflict", err)
	}
	res, err := l.adm.Cancel(ctx, leased, "customer withdrew", "test:dave")
	if err != nil {
		t.Fatal(err)
	}
	if res.AlreadyRequested || res.Instance.Status != saga.StatusCompensating || res.Instance.LeaseExpiresAt != nil {
		t.Errorf("cancel: %+v", res.Instance)
	}
	again, err := l.adm.Cancel(ctx, leased, "again", "test:dave")
	if err != nil || !again.AlreadyRequested {
		t.Errorf("second cancel: %+v %v", again, err)
	}
	evs := l.events(t, leased)
	if len(evs) != 1 || evs[0].Kind != saga.EventCancelRequested || evs[0].Actor != "test:dave" || evs[0].Reason != "customer withdrew" {
		t.Errorf("journal after cancels: %s", l.history(t, leased))
	}
	// The old holder's lease is gone: its writes are fenced out.
	if _, err := l.journal.Append(ctx, leased, claimed[0].LeaseID.UUID, saga.Event{Kind: saga.EventStepCompleted, Step: 0, StepName: "reserve"}); !errors.Is(err, saga.ErrLeaseLost) {
		t.Errorf("append by the revoked holder: %v, want ErrLeaseLost", err)
	}

	// Unregistered version, unknown id, other tenant, bad input.
	orphan := l.start(t, "order", 9)
	if _, err := l.adm.Retry(ctx, orphan, "push", "test"); !errors.Is(err, saga.ErrConflict) || !strings.Contains(err.Error(), "no relay can run") {
		t.Errorf("retry of an unregistered version: %v", err)
	}
	if _, err := l.adm.Retry(ctx, uuid.New(), "push", "test"); !errors.Is(err, saga.ErrNotFound) {
		t.Errorf("retry of an unknown id: %v", err)
	}
	running := l.start(t, "order", 1)
	if _, err := l.adm.ForTenant(tenantB).Cancel(ctx, running, "", "test"); !errors.Is(err, saga.ErrNotFound) {
		t.Errorf("cancel across tenants: %v, want ErrNotFound", err)
	}
	if _, err := l.adm.ForTenant(tenantB).Retry(ctx, running, "x", "test"); !errors.Is(err, saga.ErrNotFound) {
		t.Errorf("retry across tenants: %v, want ErrNotFound", err)
	}
	if _, err := l.adm.Retry(ctx, running, "  ", "test"); !errors.Is(err, saga.ErrInvalid) {
		t.Errorf("empty reason: %v", err)
	}
	if _, err := l.adm.Retry(ctx, running, "x", ""); !errors.Is(err, saga.ErrInvalid) {
		t.Errorf("empty actor: %v", err)
	}
	if _, err := l.adm.Retry(ctx, running, strings.Repeat("x", admin.MaxReasonLen+1), "test"); !errors.Is(err, saga.ErrInvalid) {
		t.Errorf("long reason: %v", err)
	}
	if n := len(l.events(t, running)); n != 0 {
		t.Errorf("refused requests wrote %d events", n)
	}
}

// TestConcurrentRetriesJournalOnce: operators clicking at once write one
// retry_requested; the others get AlreadyRequested.
func TestConcurrentRetriesJournalOnce(t *testing.T) {
	t.Parallel()
	l := setupLive(t)
	ctx := context.Background()
	id := l.start(t, "order", 1)
	// Drive the instance to FAILED through the journal: reserve done, its
	// compensation failed, given up.
	c, err := l.journal.ClaimPending(ctx, 1, time.Minute)
	if err != nil || len(c) != 1 {
		t.Fatalf("claim: %v %v", c, err)
	}
	lease := c[0].LeaseID.UUID
	for _, ev := range []saga.Event{
		{Kind: saga.EventStepCompleted, Step: 0, StepName: "reserve"},
		{Kind: saga.EventCompensationStarted, Step: 0, Reason: "charge refused"},
		{Kind: saga.EventCompensationFailed, Step: 0, StepName: "reserve", Error: "warehouse down"},
	} {
		if _, err := l.journal.Append(ctx, id, lease, ev); err != nil {
			t.Fatalf("append %s: %v", ev.Kind, err)
		}
	}
	if ok, err := l.journal.MarkTerminal(ctx, id, lease, saga.StatusFailed, "warehouse down"); !ok || err != nil {
		t.Fatalf("MarkTerminal FAILED: %v %v", ok, err)
	}
	before := len(l.events(t, id))

	const n = 8
	var wg sync.WaitGroup
	var fresh, already atomic.Int32
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := l.adm.Retry(ctx, id, "warehouse back", fmt.Sprintf("test:%d", i))
			if err != nil {
				t.Errorf("retry %d: %v", i, err)
				return
			}
			if res.AlreadyRequested {
				already.Add(1)
			} else {
				fresh.Add(1)
			}
			if res.Instance.Status != saga.StatusCompensating || res.Instance.CurrentStep != 0 {
				t.Errorf("retry %d answered %s at step %d", i, res.Instance.Status, res.Instance.CurrentStep)
			}
		}()
	}
	wg.Wait()
	if fresh.Load() != 1 || already.Load() != n-1 {
		t.Errorf("%d retries journaled, %d answered as already requested; want 1 and %d", fresh.Load(), already.Load(), n-1)
	}
	if got := len(l.events(t, id)); got != before+1 {
		t.Errorf("%d events, want %d", got, before+1)
	}
}
