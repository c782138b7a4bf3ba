package saga_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/test/testkit"
)

func TestRunnerHappyPath(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	def := typedDef("happy", effectStep("reserve"), effectStep("charge"), effectStep("ship"))
	// The last step also sets an output, to be found in saga_steps.
	ship := def.Steps[2].Do
	def.Steps[2].Do = func(ctx context.Context, x *saga.StepTx) error {
		x.Output = []byte(`{"tracking":"T-1"}`)
		return ship(ctx, x)
	}
	r.reg.MustRegister(def)
	var h hookLog
	r.run(nil, nil, &saga.RunnerConfig{Hooks: h.hooks()})
	id := r.start(def, trail{}, 0)

	inst := r.wait(id, saga.StatusCompleted, 20*time.Second)
	st, err := saga.DecodeState[trail](inst.Context)
	if err != nil {
		t.Fatal(err)
	}
	if !equal(st.Visited, []string{"reserve", "charge", "ship"}) {
		t.Fatalf("state = %+v: each step must see the state the previous one saved", st)
	}
	if n := r.count(`SELECT count(*) FROM effects WHERE instance_id = $1`, id); n != 3 {
		t.Fatalf("%d effects, want 3 (each step once)", n)
	}
	if n := r.count(`SELECT count(DISTINCT step) FROM effects WHERE instance_id = $1 AND attempt = 1`, id); n != 3 {
		t.Fatalf("%d distinct first-attempt effects, want 3", n)
	}
	recs := r.steps(id)
	if len(recs) != 3 {
		t.Fatalf("%d step records, want 3", len(recs))
	}
	for i, rec := range recs {
		if rec.Status != saga.StepCompleted || rec.Attempts != 1 || rec.Name != def.Steps[i].Name || rec.CompletedAt == nil {
			t.Fatalf("step record %d = %+v, want %s COMPLETED after 1 attempt", i, rec, def.Steps[i].Name)
		}
	}
	if !strings.Contains(string(recs[2].Output), "T-1") {
		t.Fatalf("ship's output = %s, want the tracking number", recs[2].Output)
	}
	want := []string{"step_completed:0", "step_completed:1", "step_completed:2", "completed:-1"}
	got := r.kinds(id)
	if len(got) != 4 || !equal(got[:3], want[:3]) || !strings.HasPrefix(got[3], "completed:") {
		t.Fatalf("history %v, want %v", got, want)
	}
	if n := h.count(saga.OutcomeCompleted); n != 3 {
		t.Fatalf("OnStep saw %d completed steps, want 3", n)
	}
	h.mu.Lock()
	ends := h.ends
	h.mu.Unlock()
	if len(ends) != 1 || ends[0].Status != saga.StatusCompleted || ends[0].InstanceID != id {
		t.Fatalf("OnTerminal saw %+v", ends)
	}
}

func TestRunnerRetryThenSuccessRespectsBackoff(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	const base = 150 * time.Millisecond
	var mu sync.Mutex
	var starts []time.Time
	flaky := effectStep("flaky")
	inner := flaky.Do
	flaky.Retry = saga.RetryPolicy{MaxAttempts: 5, Base: base, Factor: 2, Jitter: -1}
	flaky.Do = func(ctx context.Context, s *trail, x *saga.StepTx) error {
		mu.Lock()
		starts = append(starts, time.Now())
		mu.Unlock()
		if err := inner(ctx, s, x); err != nil {
			return err
		}
		if x.Attempt < 3 {
			return fmt.Errorf("dependency unavailable (attempt %d)", x.Attempt)
		}
		return nil
	}
	def := typedDef("retry", effectStep("first"), flaky, effectStep("last"))
	r.reg.MustRegister(def)
	var h hookLog
	r.run(nil, nil, &saga.RunnerConfig{Hooks: h.hooks()})
	id := r.start(def, trail{}, 0)
	r.wait(id, saga.StatusCompleted, 20*time.Second)

	mu.Lock()
	defer mu.Unlock()
	if len(starts) != 3 {
		t.Fatalf("flaky ran %d times, want 3", len(starts))
	}
	// Attempt n+1 starts no earlier than the backoff after attempt n:
	// base, then base×2.
	for i, want := range []time.Duration{base, 2 * base} {
		gap := starts[i+1].Sub(starts[i])
		if gap < want-2*time.Millisecond || gap > want+2*time.Second {
			t.Fatalf("gap before attempt %d = %s, want about %s", i+2, gap, want)
		}
	}
	// The failed attempts' writes were rolled back: one effect, from
	// attempt 3.
	if n := r.count(`SELECT count(*) FROM effects WHERE instance_id = $1 AND step = 'flaky'`, id); n != 1 {
		t.Fatalf("%d flaky effects, want 1", n)
	}
	if n := r.count(`SELECT count(*) FROM effects WHERE instance_id = $1 AND step = 'flaky' AND attempt = 3`, id); n != 1 {
		t.Fatal("the committed flaky effect is not attempt 3's")
	}
	rec := r.steps(id)[1]
	if rec.Status != saga.StepCompleted || rec.Attempts != 3 {
		t.Fatalf("flaky record = %+v, want COMPLETED with 3 attempts", rec)
	}
	if got := h.outcomes("flaky", false); !equal(got, []saga.Outcome{saga.OutcomeRetry, saga.OutcomeRetry, saga.OutcomeCompleted}) {
		t.Fatalf("flaky outcomes %v", got)
	}
}

func TestRunnerPermanentFailureCompensatesInReverse(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	var thirdCompensated atomic.Bool
	third := effectStep("notify")
	inner := third.Do
	third.Do = func(ctx context.Context, s *trail, x *saga.StepTx) error {
		if err := inner(ctx, s, x); err != nil {
			return err
		}
		return saga.Permanent(errors.New("recipient rejected"))
	}
	third.Compensate = func(context.Context, trail, *saga.StepTx) error {
		thirdCompensated.Store(true)
		return nil
	}
	def := typedDef("perm", effectStep("reserve"), effectStep("charge"), third)
	r.reg.MustRegister(def)
	r.run(nil, nil, nil)
	id := r.start(def, trail{}, 0)
	inst := r.wait(id, saga.StatusCompensated, 20*time.Second)

	if got := r.compOrder(id); !equal(got, []string{"charge", "reserve"}) {
		t.Fatalf("compensated %v, want [charge reserve]", got)
	}
	if thirdCompensated.Load() {
		t.Fatal("the failed step was compensated: its Do returned an error, its transaction rolled back, it did not act")
	}
	if !strings.Contains(inst.CompensationReason, "recipient rejected") {
		t.Fatalf("compensation reason %q does not say why", inst.CompensationReason)
	}
	recs := r.steps(id)
	want := []saga.StepStatus{saga.StepCompensated, saga.StepCompensated, saga.StepFailed}
	for i, rec := range recs {
		if rec.Status != want[i] {
			t.Fatalf("step %d is %s, want %s", i, rec.Status, want[i])
		}
	}
	if recs[2].Attempts != 1 || !strings.Contains(recs[2].LastError, "recipient rejected") {
		t.Fatalf("failed step record %+v: a permanent error is not retried", recs[2])
	}
	got := r.kinds(id)
	wantKinds := []string{"step_completed:0", "step_completed:1", "step_failed:2", "compensation_started:1",
		"step_compensated:1", "step_compensated:0"}
	if len(got) != 7 || !equal(got[:6], wantKinds) || !strings.HasPrefix(got[6], "compensated:") {
		t.Fatalf("history %v, want %v then compensated", got, wantKinds)
	}
}

func TestRunnerCompensationRetriesThenSucceeds(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	reserve := effectStep("reserve")
	reserve.CompensationRetry = saga.RetryPolicy{MaxAttempts: 5, Base: 20 * time.Millisecond, Jitter: -1}
	undo := reserve.Compensate
	reserve.Compensate = func(ctx context.Context, s trail, x *saga.StepTx) error {
		if err := undo(ctx, s, x); err != nil {
			return err
		}
		if x.Attempt <= 2 {
			return fmt.Errorf("inventory service down (attempt %d)", x.Attempt)
		}
		return nil
	}
	fail := saga.TypedStep[trail]{Name: "charge", Do: func(context.Context, *trail, *saga.StepTx) error {
		return saga.Permanent(errors.New("card declined"))
	}}
	def := typedDef("comp-retry", reserve, fail)
	r.reg.MustRegister(def)
	var h hookLog
	r.run(nil, nil, &saga.RunnerConfig{Hooks: h.hooks()})
	id := r.start(def, trail{}, 0)
	r.wait(id, saga.StatusCompensated, 20*time.Second)

	// The failed attempts rolled back their comp_log rows: one remains.
	if got := r.compOrder(id); !equal(got, []string{"reserve"}) {
		t.Fatalf("comp_log %v, want one committed compensation", got)
	}
	if n := r.count(`SELECT attempt FROM comp_log WHERE instance_id = $1`, id); n != 3 {
		t.Fatalf("the committed compensation was attempt %d, want 3", n)
	}
	rec := r.steps(id)[0]
	if rec.Status != saga.StepCompensated || rec.CompensationAttempts != 3 {
		t.Fatalf("reserve record %+v: want COMPENSATED after 3 compensation attempts (2 failed, 1 succeeded)", rec)
	}
	if got := h.outcomes("reserve", true); !equal(got, []saga.Outcome{saga.OutcomeRetry, saga.OutcomeRetry, saga.OutcomeCompleted}) {
		t.Fatalf("compensation outcomes %v", got)
	}
	if n := strings.Count(strings.Join(r.kinds(id), " "), "compensation_failed:0"); n != 2 {
		t.Fatalf("%d compensation_failed events, want 2", n)
	}
}

func TestRunnerCompensationFailingForGoodEndsFailed(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	charge := effectStep("charge")
	charge.CompensationRetry = saga.RetryPolicy{MaxAttempts: 3, Base: 10 * time.Millisecond, Jitter: -1}
	charge.Compensate = func(context.Context, trail, *saga.StepTx) error {
		return errors.New("refund API rejects the request")
	}
	fail := saga.TypedStep[trail]{Name: "ship", Do: func(context.Context, *trail, *saga.StepTx) error {
		return saga.Permanent(errors.New("address invalid"))
	}}
	def := typedDef("comp-fail", effectStep("reserve"), charge, fail)
	r.reg.MustRegister(def)
	var h hookLog
	r.run(nil, nil, &saga.RunnerConfig{Hooks: h.hooks()})
	id := r.start(def, trail{}, 0)
	inst := r.wait(id, saga.StatusFailed, 20*time.Second)

	if !strings.Contains(inst.LastError, "refund API rejects") || !strings.Contains(inst.LastError, "charge") {
		t.Fatalf("last_error %q does not say which compensation failed and why", inst.LastError)
	}
	if got := r.compOrder(id); len(got) != 0 {
		t.Fatalf("compensations committed: %v; reserve's must not run after charge's failed for good", got)
	}
	recs := r.steps(id)
	if recs[0].Status != saga.StepCompleted || recs[0].CompensatedAt != nil {
		t.Fatalf("reserve %+v: marked compensated though its compensation never ran", recs[0])
	}
	if recs[1].Status != saga.StepCompleted || recs[1].CompensationAttempts != 3 {
		t.Fatalf("charge %+v: want COMPLETED (not compensated) with 3 compensation attempts", recs[1])
	}
	if got := h.outcomes("reserve", true); len(got) != 0 {
		t.Fatalf("reserve's compensation ran: %v", got)
	}
	if inst.LeaseID.Valid {
		t.Fatal("a FAILED instance still holds a lease")
	}
}

func TestRunnerDeadline(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	// Instance A waits for a reply that never comes (reply timeout: an
	// hour); instance B retries a step with an hour of backoff. Both must
	// compensate when their one-second deadline passes, not an hour later.
	ask := saga.TypedStep[trail]{
		Name: "ask", ReplyTimeout: time.Hour,
		Do: func(ctx context.Context, s *trail, x *saga.StepTx) error {
			return x.EmitCommand(ctx, outbox.Message{EventType: "quote.requested"})
		},
		Compensate: compensateInto("ask"),
	}
	slow := saga.TypedStep[trail]{
		Name:  "slow",
		Retry: saga.RetryPolicy{Base: time.Hour, Max: time.Hour},
		Do: func(context.Context, *trail, *saga.StepTx) error {
			return errors.New("not yet")
		},
		Compensate: compensateInto("slow"),
	}
	defA := typedDef("deadline-a", effectStep("book"), ask)
	defB := typedDef("deadline-b", effectStep("book"), slow)
	r.reg.MustRegister(defA, defB)
	r.run(nil, nil, nil)
	began := time.Now()
	a := r.start(defA, trail{}, time.Second)
	b := r.start(defB, trail{}, time.Second)

	instA := r.wait(a, saga.StatusTimedOut, 20*time.Second)
	r.wait(b, saga.StatusTimedOut, 20*time.Second)
	if took := time.Since(began); took < time.Second {
		t.Fatalf("timed out after %s, before the deadline", took)
	}
	if instA.CompensationReason != saga.ReasonDeadline {
		t.Fatalf("compensation reason %q, want %q", instA.CompensationReason, saga.ReasonDeadline)
	}
	// A's waiting step sent its command: it may have acted, so it is
	// compensated, then book.
	if got := r.compOrder(a); !equal(got, []string{"ask", "book"}) {
		t.Fatalf("A compensated %v, want [ask book]", got)
	}
	// B's step never committed anything: only book is compensated.
	if got := r.compOrder(b); !equal(got, []string{"book"}) {
		t.Fatalf("B compensated %v, want [book]", got)
	}
}

func TestRunnerStepTimeoutCountsAndCompensates(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	hang := saga.TypedStep[trail]{
		Name:    "call-partner",
		Timeout: 100 * time.Millisecond,
		Retry:   saga.RetryPolicy{MaxAttempts: 2, Base: 10 * time.Millisecond, Jitter: -1},
		Do: func(ctx context.Context, s *trail, x *saga.StepTx) error {
			<-ctx.Done() // the partner never answers
			return ctx.Err()
		},
		Compensate: compensateInto("call-partner"),
	}
	def := typedDef("timeout", effectStep("prepare"), hang)
	r.reg.MustRegister(def)
	var h hookLog
	r.run(nil, nil, &saga.RunnerConfig{Hooks: h.hooks()})
	id := r.start(def, trail{}, 0)
	r.wait(id, saga.StatusCompensated, 20*time.Second)

	if got := r.compOrder(id); !equal(got, []string{"call-partner", "prepare"}) {
		t.Fatalf("compensated %v: a timed-out step may have acted and must be compensated first", got)
	}
	rec := r.steps(id)[1]
	if rec.Attempts != 2 || rec.Status != saga.StepCompensated {
		t.Fatalf("timed-out step %+v, want 2 attempts and COMPENSATED", rec)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	timedOut := 0
	for _, e := range h.steps {
		if e.StepName == "call-partner" && !e.Compensation && e.TimedOut {
			timedOut++
		}
	}
	if timedOut != 2 {
		t.Fatalf("%d attempts reported as timed out, want 2", timedOut)
	}
}

func TestRunnerReplies(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	ask := saga.TypedStep[trail]{
		Name: "search", ReplyTimeout: 30 * time.Second,
		Retry: saga.RetryPolicy{MaxAttempts: 3, Base: 10 * time.Millisecond, Jitter: -1},
		Do: func(ctx context.Context, s *trail, x *saga.StepTx) error {
			return x.EmitCommand(ctx, outbox.Message{EventType: "search.requested", Payload: map[string]any{"attempt": x.Attempt}})
		},
		OnReply: func(ctx context.Context, s *trail, rep saga.Reply, x *saga.StepTx) error {
			var body struct{ Hits int }
			if err := json.Unmarshal(rep.Payload, &body); err != nil {
				return err
			}
			s.Hits = body.Hits
			return nil
		},
		Compensate: compensateInto("search"),
	}
	def := typedDef("reply", ask, effectStep("use"))
	r.reg.MustRegister(def)
	r.run(nil, nil, nil)
	id := r.start(def, trail{}, 0)

	// The correlator's part, by hand: find the command, deliver a reply
	// correlated by its id.
	cmd1 := r.waitCommand(id, 1)
	if _, err := r.journal.DeliverReply(context.Background(), cmd1, []byte(`{"error":"index busy"}`), "test"); err != nil {
		t.Fatal(err)
	}
	cmd2 := r.waitCommand(id, 2)
	if cmd2 == cmd1 {
		t.Fatal("the retry reused the first command's id")
	}
	if _, err := r.journal.DeliverReply(context.Background(), cmd2, []byte(`{"ok":true,"hits":3}`), "test"); err != nil {
		t.Fatal(err)
	}
	inst := r.wait(id, saga.StatusCompleted, 20*time.Second)
	st, _ := saga.DecodeState[trail](inst.Context)
	if st.Hits != 3 || !equal(st.Visited, []string{"use"}) {
		t.Fatalf("state %+v: OnReply's changes must be saved for the next step", st)
	}
	rec := r.steps(id)[0]
	if rec.Attempts != 2 || !strings.Contains(string(rec.Output), `"hits"`) {
		t.Fatalf("search record %+v: want 2 attempts and the reply as output", rec)
	}
	// A command never carries its own id as its correlation id: the
	// correlator would take it for the reply.
	if n := r.count(`SELECT count(*) FROM outbox WHERE correlation_id = id`); n != 0 {
		t.Fatalf("%d commands correlated with themselves", n)
	}
}

func TestRunnerReplyTimeoutCompensatesTheWaitingStep(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	ask := saga.TypedStep[trail]{
		Name: "ask", ReplyTimeout: 300 * time.Millisecond,
		Retry: saga.RetryPolicy{MaxAttempts: 1},
		Do: func(ctx context.Context, s *trail, x *saga.StepTx) error {
			return x.EmitCommand(ctx, outbox.Message{EventType: "quote.requested"})
		},
	}
	var cancelled atomic.Value
	ask.Compensate = func(ctx context.Context, st trail, x *saga.StepTx) error {
		cancelled.Store(x.CommandID) // the command to cancel
		return compensateInto("ask")(ctx, st, x)
	}
	def := typedDef("reply-timeout", effectStep("book"), ask)
	r.reg.MustRegister(def)
	r.run(nil, nil, nil)
	id := r.start(def, trail{}, 0)
	r.wait(id, saga.StatusCompensated, 20*time.Second)
	if got := r.compOrder(id); !equal(got, []string{"ask", "book"}) {
		t.Fatalf("compensated %v, want [ask book]", got)
	}
	var cmd uuid.UUID
	if err := r.db.Pool.QueryRow(context.Background(), `SELECT id FROM outbox WHERE event_type = 'quote.requested'`).Scan(&cmd); err != nil {
		t.Fatal(err)
	}
	if got, _ := cancelled.Load().(uuid.UUID); got != cmd {
		t.Fatalf("Compensate saw CommandID %s, want the command sent %s", got, cmd)
	}
	if !strings.Contains(strings.Join(r.kinds(id), " "), "step_awaiting:1") {
		t.Fatalf("history %v lacks the wait", r.kinds(id))
	}
}

// waitCommand waits for the n-th command the instance emitted and returns
// its id, once the instance waits on it.
func (r *rig) waitCommand(id uuid.UUID, n int) uuid.UUID {
	r.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		var cmd uuid.UUID
		err := r.db.Pool.QueryRow(context.Background(), `
			SELECT o.id FROM outbox o JOIN saga_instances si ON si.awaiting_correlation_id = o.id
			WHERE si.id = $1 AND (SELECT count(*) FROM outbox WHERE causation_id = si.trigger_event_id) = $2`, id, n).Scan(&cmd)
		if err == nil {
			return cmd
		}
		time.Sleep(15 * time.Millisecond)
	}
	r.t.Fatalf("instance %s never waited on command %d\n%s", id, n, r.history(id))
	return uuid.Nil
}

func TestRunnerOutboxRowsExistExactlyWhenTheirStepCommitted(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	emit := func(name string, failFirst bool, timeout time.Duration) saga.TypedStep[trail] {
		return saga.TypedStep[trail]{
			Name: name, Timeout: timeout,
			Retry: saga.RetryPolicy{MaxAttempts: 3, Base: 10 * time.Millisecond, Jitter: -1},
			Do: func(ctx context.Context, s *trail, x *saga.StepTx) error {
				if err := x.Emit(ctx, outbox.Message{EventType: name + ".done", Payload: map[string]any{"attempt": x.Attempt}}); err != nil {
					return err
				}
				if failFirst && x.Attempt == 1 {
					if timeout > 0 {
						<-ctx.Done()
						return ctx.Err()
					}
					return errors.New("failed after emitting")
				}
				return nil
			},
		}
	}
	def := typedDef("emit", emit("plain", false, 0), emit("flaky", true, 0), emit("slow", true, 100*time.Millisecond))
	r.reg.MustRegister(def)
	r.run(nil, nil, nil)
	id := r.start(def, trail{}, 0)
	inst := r.wait(id, saga.StatusCompleted, 20*time.Second)

	for _, step := range []string{"plain", "flaky", "slow"} {
		if n := r.count(`SELECT count(*) FROM outbox WHERE event_type = $1`, step+".done"); n != 1 {
			t.Fatalf("%d %s.done rows, want exactly 1 (the committed attempt's)", n, step)
		}
	}
	if n := r.count(`SELECT count(*) FROM outbox WHERE payload->>'attempt' = '1' AND event_type <> 'plain.done'`); n != 0 {
		t.Fatalf("%d rows from rolled-back attempts", n)
	}
	// Defaults come from the instance.
	if n := r.count(`SELECT count(*) FROM outbox WHERE tenant_id = $1 AND causation_id = $2 AND correlation_id = $3`,
		inst.TenantID, inst.TriggerEventID, inst.CorrelationID.UUID); n != 3 {
		t.Fatalf("%d rows carry the instance's tenant, trigger and correlation id, want 3", n)
	}
}

func TestRunnerTwoProcessesThousandSagasEffectsOnce(t *testing.T) {
	testkit.SkipShort(t, "runs a thousand sagas in two runners")
	t.Parallel()
	r := newRig(t)
	def := typedDef("bulk", effectStep("a"), effectStep("b"), effectStep("c"))
	r.reg.MustRegister(def)
	const n = 1000
	r.startMany(def, n)
	p1, p2 := r.pool(10), r.pool(10)
	var h1, h2 hookLog
	began := time.Now()
	r.run(p1, nil, &saga.RunnerConfig{Workers: 8, Hooks: h1.hooks()})
	r.run(p2, nil, &saga.RunnerConfig{Workers: 8, Hooks: h2.hooks()})
	r.waitAll(60 * time.Second)
	took := time.Since(began)

	if c := r.count(`SELECT count(*) FROM saga_instances WHERE status = 'COMPLETED'`); c != n {
		t.Fatalf("%d of %d completed", c, n)
	}
	if c := r.count(`SELECT count(*) FROM effects`); c != 3*n {
		t.Fatalf("%d effects, want %d: every step's effects exactly once", c, 3*n)
	}
	if c := r.count(`SELECT count(*) FROM (SELECT DISTINCT instance_id, step FROM effects) d`); c != 3*n {
		t.Fatalf("%d distinct (instance, step) effects, want %d", c, 3*n)
	}
	c1, c2 := h1.count(saga.OutcomeCompleted), h2.count(saga.OutcomeCompleted)
	if c1+c2 != 3*n || c1 == 0 || c2 == 0 {
		t.Fatalf("runners committed %d + %d steps, want %d shared by both", c1, c2, 3*n)
	}
	t.Logf("2 runners × 8 workers: %d sagas × 3 steps in %s (%.0f steps/s; split %d/%d)",
		n, took.Round(time.Millisecond), float64(3*n)/took.Seconds(), c1, c2)
}

// zombie is a journal whose heartbeats claim success without reaching the
// database: a worker paused or cut off while its lease runs out, that does
// not know it. Everything else goes to the real journal, so its commit meets
// the real fence.
type zombie struct{ saga.Journal }

func (zombie) Heartbeat(context.Context, uuid.UUID, uuid.UUID, time.Duration) (bool, error) {
	return true, nil
}

func TestRunnerStaleWorkerCommitIsRejectedByTheFence(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	entered := make(chan struct{})
	release := make(chan struct{})
	var calls atomic.Int32
	slow := effectStep("slow")
	inner := slow.Do
	slow.Do = func(ctx context.Context, s *trail, x *saga.StepTx) error {
		if err := inner(ctx, s, x); err != nil {
			return err
		}
		if err := x.Emit(ctx, outbox.Message{EventType: "slow.done", Payload: map[string]any{"call": calls.Load() + 1}}); err != nil {
			return err
		}
		if calls.Add(1) == 1 {
			close(entered)
			<-release // blocks past its lease, deaf to ctx
		}
		return nil
	}
	def := typedDef("takeover", slow, effectStep("after"))
	r.reg.MustRegister(def)

	var stale hookLog
	pa := r.pool(4)
	r.run(pa, zombie{r.journal}, &saga.RunnerConfig{Workers: 1, LeaseDuration: 500 * time.Millisecond, Hooks: stale.hooks()})
	id := r.start(def, trail{}, 0)
	<-entered

	// Another process takes the instance over once the lease expired, and
	// finishes the saga while the first worker is still blocked.
	pb := r.pool(4)
	r.run(pb, nil, nil)
	r.wait(id, saga.StatusCompleted, 20*time.Second)
	close(release)

	deadline := time.Now().Add(10 * time.Second)
	for stale.count(saga.OutcomeLeaseLost) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the stale worker's commit was not rejected; its outcomes: %v", stale.outcomes("slow", false))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := stale.outcomes("slow", false); !equal(got, []saga.Outcome{saga.OutcomeLeaseLost}) {
		t.Fatalf("stale worker outcomes %v, want [lease_lost]", got)
	}
	if c := r.count(`SELECT count(*) FROM effects WHERE instance_id = $1 AND step = 'slow'`, id); c != 1 {
		t.Fatalf("%d effects of the step, want 1", c)
	}
	if c := r.count(`SELECT count(*) FROM outbox WHERE event_type = 'slow.done'`); c != 1 {
		t.Fatalf("%d outbox rows of the step, want 1", c)
	}
	if c := r.count(`SELECT count(*) FROM outbox WHERE event_type = 'slow.done' AND payload->>'call' = '1'`); c != 0 {
		t.Fatal("the stale worker's outbox row was committed")
	}
	if n := strings.Count(strings.Join(r.kinds(id), " "), "step_completed:0"); n != 1 {
		t.Fatalf("step 0 completed %d times in the journal", n)
	}
}

func TestRunnerGracefulStopUnderLoad(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	pause := func(s saga.TypedStep[trail]) saga.TypedStep[trail] {
		inner := s.Do
		s.Do = func(ctx context.Context, st *trail, x *saga.StepTx) error {
			time.Sleep(3 * time.Millisecond)
			return inner(ctx, st, x)
		}
		return s
	}
	def := typedDef("stop", pause(effectStep("a")), pause(effectStep("b")), pause(effectStep("c")))
	r.reg.MustRegister(def)
	const n = 200
	r.startMany(def, n)
	lease := 5 * time.Second
	p := r.pool(10)
	run, err := saga.NewRunner(r.journal, p, r.reg, r.cfg(&saga.RunnerConfig{Workers: 8, LeaseDuration: lease}))
	if err != nil {
		t.Fatal(err)
	}
	if err := run.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	for r.count(`SELECT count(*) FROM effects`) < 100 {
		time.Sleep(5 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := run.Stop(ctx); err != nil {
		t.Fatalf("graceful Stop: %v", err)
	}
	done := r.count(`SELECT count(*) FROM effects`)
	if done >= 3*n {
		t.Fatalf("all %d steps ran before the stop: the test stopped nothing", done)
	}
	// No lease outlives the stop: every one was released.
	if c := r.count(`SELECT count(*) FROM saga_instances WHERE lease_expires_at >= clock_timestamp()`); c != 0 {
		t.Fatalf("%d leases still live after Stop", c)
	}
	if c := r.count(`SELECT count(*) FROM effects`); c != done {
		t.Fatalf("a step committed after Stop returned (%d → %d)", done, c)
	}

	// A new runner finishes everything: no step lost, none doubled.
	r.run(nil, nil, &saga.RunnerConfig{Workers: 8})
	r.waitAll(60 * time.Second)
	if c := r.count(`SELECT count(*) FROM effects`); c != 3*n {
		t.Fatalf("%d effects, want %d", c, 3*n)
	}
	if c := r.count(`SELECT count(*) FROM (SELECT DISTINCT instance_id, step FROM effects) d`); c != 3*n {
		t.Fatalf("%d distinct effects, want %d", c, 3*n)
	}
	t.Logf("stopped after %d of %d steps", done, 3*n)
}

func TestRunnerHardStopAbortsWithoutCountingAnAttempt(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	entered := make(chan struct{})
	var once sync.Once
	block := saga.TypedStep[trail]{Name: "block", Do: func(ctx context.Context, s *trail, x *saga.StepTx) error {
		once.Do(func() { close(entered) })
		<-ctx.Done()
		return ctx.Err()
	}}
	def := typedDef("hard", block)
	r.reg.MustRegister(def)
	var h hookLog
	run, err := saga.NewRunner(r.journal, r.db.Pool, r.reg, r.cfg(&saga.RunnerConfig{Hooks: h.hooks()}))
	if err != nil {
		t.Fatal(err)
	}
	if err := run.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	id := r.start(def, trail{}, 0)
	<-entered
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := run.Stop(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop = %v, want the deadline: the step only ends when cancelled", err)
	}
	if got := h.outcomes("block", false); !equal(got, []saga.Outcome{saga.OutcomeAborted}) {
		t.Fatalf("outcomes %v, want [aborted]", got)
	}
	inst, err := r.journal.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if inst.Attempt != 0 || inst.Status != saga.StatusRunning || len(r.kinds(id)) != 0 {
		t.Fatalf("instance %+v, history %v: an aborted step is not an attempt", inst, r.kinds(id))
	}
	if c := r.count(`SELECT count(*) FROM saga_instances WHERE id = $1 AND lease_expires_at >= clock_timestamp()`, id); c != 0 {
		t.Fatal("the aborted instance's lease was not released")
	}
}

func TestRunnerUnregisteredVersionIsLeftAloneAndReported(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	v1 := typedDef("pinned", effectStep("only"))
	r.reg.MustRegister(v1)
	v2 := v1
	v2.Version = 2
	var h hookLog
	r.run(nil, nil, &saga.RunnerConfig{Hooks: h.hooks()})
	orphan := r.start(v2, trail{}, 0)
	ok := r.start(v1, trail{}, 0)
	r.wait(ok, saga.StatusCompleted, 20*time.Second)

	deadline := time.Now().Add(10 * time.Second)
	for {
		h.mu.Lock()
		stuck := append([]string(nil), h.stuck...)
		h.mu.Unlock()
		if len(stuck) > 0 {
			if !strings.Contains(stuck[0], "pinned@v2") || !strings.Contains(stuck[0], "not registered") {
				t.Fatalf("stuck reason %q does not name the version", stuck[0])
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the orphan instance was not reported")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Left alone: no event, no step; and not claimed in a hot loop (its
	// lease is kept until it expires).
	time.Sleep(300 * time.Millisecond)
	inst, err := r.journal.Get(context.Background(), orphan)
	if err != nil {
		t.Fatal(err)
	}
	if inst.Status != saga.StatusRunning || inst.CurrentStep != 0 || len(r.kinds(orphan)) != 0 {
		t.Fatalf("orphan %+v was touched: %v", inst, r.kinds(orphan))
	}
	h.mu.Lock()
	reports := len(h.stuck)
	h.mu.Unlock()
	if reports > 2 {
		t.Fatalf("the orphan was claimed %d times in 300ms: a hot loop", reports)
	}
}

func TestRunnerWakesWithinMilliseconds(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	entered := make(chan time.Time, 4)
	first := saga.TypedStep[trail]{Name: "first", Do: func(context.Context, *trail, *saga.StepTx) error {
		entered <- time.Now()
		return nil
	}}
	def := typedDef("wake", first)
	r.reg.MustRegister(def)
	// Polls far apart: only a wake-up can explain a quick start.
	slow := &saga.RunnerConfig{PollInterval: 30 * time.Second, MaxPollInterval: 30 * time.Second}
	r.run(nil, nil, slow)
	time.Sleep(100 * time.Millisecond) // the first, empty claim is over

	// Across processes: NOTIFY in the transaction that starts the saga.
	ctx := context.Background()
	tx, err := r.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO saga_instances (tenant_id, saga_name, saga_version, trigger_event_id) VALUES ($1, 'wake', 1, gen_random_uuid())`, r.tenant); err != nil {
		t.Fatal(err)
	}
	if err := saga.NotifyRunners(ctx, tx); err != nil {
		t.Fatal(err)
	}
	committed := time.Now()
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case at := <-entered:
		lat := at.Sub(committed)
		if lat > 2*time.Second {
			t.Fatalf("first step started %s after the commit", lat)
		}
		t.Logf("NOTIFY → first step: %s", lat.Round(100*time.Microsecond))
	case <-time.After(5 * time.Second):
		t.Fatal("the runner did not wake on NOTIFY")
	}

	// In process: Wake.
	r2 := newRig(t)
	r2.reg.MustRegister(def)
	run := r2.run(nil, nil, &saga.RunnerConfig{PollInterval: 30 * time.Second, MaxPollInterval: 30 * time.Second, DisableListen: true})
	time.Sleep(100 * time.Millisecond)
	r2.start(def, trail{}, 0)
	woke := time.Now()
	run.Wake()
	select {
	case at := <-entered:
		t.Logf("Wake → first step: %s", at.Sub(woke).Round(100*time.Microsecond))
	case <-time.After(5 * time.Second):
		t.Fatal("the runner did not wake on Wake")
	}
}

// TestRunnerWakeWhileWorkersAreBusy: a start woken while a step runs is
// claimed by an idle worker at once, and, when every worker is busy, as soon
// as one is free: never at the next poll.
func TestRunnerWakeWhileWorkersAreBusy(t *testing.T) {
	t.Parallel()
	for _, workers := range []int{1, 2} {
		t.Run(fmt.Sprintf("workers=%d", workers), func(t *testing.T) {
			t.Parallel()
			r := newRig(t)
			release := make(chan struct{})
			entered := make(chan uuid.UUID, 4)
			var holder sync.Once
			var held uuid.UUID
			first := saga.TypedStep[trail]{Name: "first", Do: func(_ context.Context, _ *trail, x *saga.StepTx) error {
				holder.Do(func() { held = x.Instance.ID })
				entered <- x.Instance.ID
				if x.Instance.ID == held {
					<-release
				}
				return nil
			}}
			def := typedDef("busy", first, effectStep("second"))
			r.reg.MustRegister(def)
			// Polls far apart: only a wake-up can explain a quick claim.
			run := r.run(nil, nil, &saga.RunnerConfig{Workers: workers, PollInterval: 30 * time.Second,
				MaxPollInterval: 30 * time.Second, DisableListen: true})
			a := r.start(def, trail{}, 0)
			run.Wake()
			if got := <-entered; got != a {
				t.Fatalf("first step of %s, want %s", got, a)
			}
			b := r.start(def, trail{}, 0)
			run.Wake()
			if workers > 1 {
				// An idle worker takes it while a's step still runs.
				select {
				case got := <-entered:
					if got != b {
						t.Fatalf("first step of %s, want %s", got, b)
					}
				case <-time.After(5 * time.Second):
					t.Fatal("a start woken while a step runs waited for the poll")
				}
				close(release)
			} else {
				time.Sleep(50 * time.Millisecond) // the wake-up meets a busy runner
				freed := time.Now()
				close(release)
				select {
				case got := <-entered:
					if got != b {
						t.Fatalf("first step of %s, want %s", got, b)
					}
					t.Logf("worker free → next start's first step: %s", time.Since(freed).Round(100*time.Microsecond))
				case <-time.After(5 * time.Second):
					t.Fatal("a start woken while every worker was busy waited for the poll once a worker was free")
				}
			}
			r.wait(a, saga.StatusCompleted, 10*time.Second)
			r.wait(b, saga.StatusCompleted, 10*time.Second)
		})
	}
}

func TestRunnerConfigValidation(t *testing.T) {
	t.Parallel()
	reg := saga.NewRegistry()
	cases := []struct {
		cfg   saga.RunnerConfig
		field string
	}{
		{saga.RunnerConfig{Workers: -1}, "Workers"},
		{saga.RunnerConfig{ClaimBatch: -2}, "ClaimBatch"},
		{saga.RunnerConfig{LeaseDuration: time.Millisecond}, "LeaseDuration"},
		{saga.RunnerConfig{PollInterval: time.Second, MaxPollInterval: time.Millisecond}, "MaxPollInterval"},
		{saga.RunnerConfig{OutboxTable: "a.b.c"}, "OutboxTable"},
		{saga.RunnerConfig{CompensationTimeout: -time.Second}, "CompensationTimeout"},
	}
	rg := newRig(t)
	db, j := rg.db, rg.journal
	for _, tc := range cases {
		_, err := saga.NewRunner(j, db.Pool, reg, &tc.cfg)
		if !errors.Is(err, saga.ErrInvalid) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%+v: got %v, want ErrInvalid naming %s", tc.cfg, err, tc.field)
		}
	}
	c := (*saga.RunnerConfig)(nil).WithDefaults()
	if c.Workers != 8 || c.GroupCommit != 8 || c.ClaimBatch != 64 || c.LeaseDuration != 30*time.Second || c.OutboxTable != "outbox" || c.WakeChannel != saga.WakeChannel {
		t.Fatalf("defaults %+v", c)
	}
	if _, err := saga.NewRunner(nil, db.Pool, reg, nil); !errors.Is(err, saga.ErrInvalid) {
		t.Fatalf("nil journal: %v", err)
	}
}

func TestRunnerHeartbeatKeepsTheLeaseOfALongStep(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	const lease = 600 * time.Millisecond
	long := effectStep("long")
	inner := long.Do
	long.Do = func(ctx context.Context, s *trail, x *saga.StepTx) error {
		select {
		case <-time.After(2 * lease): // well past the lease: only heartbeats keep it
		case <-ctx.Done():
			return ctx.Err()
		}
		return inner(ctx, s, x)
	}
	def := typedDef("long", long)
	r.reg.MustRegister(def)
	// Two runners compete: neither may take the instance from the other
	// while its holder heartbeats.
	var h1, h2 hookLog
	r.run(r.pool(4), nil, &saga.RunnerConfig{LeaseDuration: lease, Hooks: h1.hooks()})
	r.run(r.pool(4), nil, &saga.RunnerConfig{LeaseDuration: lease, Hooks: h2.hooks()})
	id := r.start(def, trail{}, 0)
	r.wait(id, saga.StatusCompleted, 20*time.Second)
	if lost := h1.count(saga.OutcomeLeaseLost) + h2.count(saga.OutcomeLeaseLost); lost != 0 {
		t.Fatalf("%d lease losses: the heartbeat did not keep the lease", lost)
	}
	if c := r.count(`SELECT count(*) FROM effects WHERE instance_id = $1`, id); c != 1 {
		t.Fatalf("%d effects, want 1", c)
	}
	if rec := r.steps(id)[0]; rec.Attempts != 1 {
		t.Fatalf("long step took %d attempts, want 1", rec.Attempts)
	}
}

func TestRunnerRefusedHeartbeatStopsTheStep(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	entered := make(chan struct{})
	var once sync.Once
	wait := saga.TypedStep[trail]{Name: "wait", Do: func(ctx context.Context, s *trail, x *saga.StepTx) error {
		if _, err := x.Tx.Exec(ctx, `INSERT INTO effects (instance_id, step, attempt) VALUES ($1, 'wait', $2)`, x.Instance.ID, x.Attempt); err != nil {
			return err
		}
		once.Do(func() { close(entered) })
		<-ctx.Done()
		return ctx.Err()
	}}
	def := typedDef("refused", wait)
	r.reg.MustRegister(def)
	var h hookLog
	r.run(nil, nil, &saga.RunnerConfig{LeaseDuration: 600 * time.Millisecond, Hooks: h.hooks()})
	id := r.start(def, trail{}, 0)
	<-entered
	// Someone else holds the instance now (as after an expiry and a claim
	// elsewhere): the next heartbeat is refused.
	r.exec(`UPDATE saga_instances SET lease_id = gen_random_uuid(), lease_expires_at = clock_timestamp() + interval '1 hour' WHERE id = $1`, id)
	deadline := time.Now().Add(10 * time.Second)
	for h.count(saga.OutcomeLeaseLost) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the worker did not stop after its heartbeat was refused")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := r.kinds(id); len(got) != 0 {
		t.Fatalf("the worker wrote %v after losing its lease", got)
	}
	if c := r.count(`SELECT count(*) FROM effects`); c != 0 {
		t.Fatalf("%d effects committed by a worker without a lease", c)
	}
}

func TestRunnerManualRetryResumesAFailedCompensation(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	var refundWorks atomic.Bool
	charge := effectStep("charge")
	undo := charge.Compensate
	charge.CompensationRetry = saga.RetryPolicy{MaxAttempts: 1}
	charge.Compensate = func(ctx context.Context, s trail, x *saga.StepTx) error {
		if !refundWorks.Load() {
			return errors.New("refund API down")
		}
		return undo(ctx, s, x)
	}
	fail := saga.TypedStep[trail]{Name: "ship", Do: func(context.Context, *trail, *saga.StepTx) error {
		return saga.Permanent(errors.New("no carrier"))
	}}
	def := typedDef("manual", effectStep("reserve"), charge, fail)
	r.reg.MustRegister(def)
	r.run(nil, nil, nil)
	id := r.start(def, trail{}, 0)
	r.wait(id, saga.StatusFailed, 20*time.Second)

	refundWorks.Store(true)
	if err := r.journal.RequestRetry(context.Background(), id, "refund API is back", "ops"); err != nil {
		t.Fatal(err)
	}
	r.wait(id, saga.StatusCompensated, 20*time.Second)
	// Resumed where it stood: charge, then reserve; nothing skipped.
	if got := r.compOrder(id); !equal(got, []string{"charge", "reserve"}) {
		t.Fatalf("compensated %v, want [charge reserve]", got)
	}
}

func TestRunnerCancelCompensatesFromWhereTheInstanceStands(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	later := saga.TypedStep[trail]{
		Name:  "later",
		Retry: saga.RetryPolicy{Base: time.Hour, Max: time.Hour},
		Do: func(context.Context, *trail, *saga.StepTx) error {
			return errors.New("not ready")
		},
		Compensate: compensateInto("later"),
	}
	def := typedDef("cancel", effectStep("first"), later)
	r.reg.MustRegister(def)
	r.run(nil, nil, nil)
	id := r.start(def, trail{}, 0)
	deadline := time.Now().Add(15 * time.Second)
	for !strings.Contains(strings.Join(r.kinds(id), " "), "step_failed:1") {
		if time.Now().After(deadline) {
			t.Fatalf("step 1 never failed: %v", r.kinds(id))
		}
		time.Sleep(15 * time.Millisecond)
	}
	if err := r.journal.RequestCancel(context.Background(), id, "customer withdrew", "ops"); err != nil {
		t.Fatal(err)
	}
	inst := r.wait(id, saga.StatusCompensated, 20*time.Second)
	if got := r.compOrder(id); !equal(got, []string{"first"}) {
		t.Fatalf("compensated %v, want [first]: 'later' never acted", got)
	}
	if !strings.Contains(inst.CompensationReason, "customer withdrew") {
		t.Fatalf("reason %q", inst.CompensationReason)
	}
}

func TestRunnerStepMistakes(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	// A panic fails the attempt, not the process.
	panicky := effectStep("panicky")
	inner := panicky.Do
	panicky.Retry = saga.RetryPolicy{MaxAttempts: 3, Base: 10 * time.Millisecond, Jitter: -1}
	panicky.Do = func(ctx context.Context, s *trail, x *saga.StepTx) error {
		if x.Attempt == 1 {
			panic("nil map somewhere")
		}
		return inner(ctx, s, x)
	}
	// A waiting step that sends no command can never be answered: a
	// permanent failure, not a wait until the reply timeout.
	silent := saga.TypedStep[trail]{Name: "silent", ReplyTimeout: time.Hour,
		Do: func(context.Context, *trail, *saga.StepTx) error { return nil }}
	// A step that does not wait cannot send a command.
	var cmdErr atomic.Value
	eager := saga.TypedStep[trail]{Name: "eager", Do: func(ctx context.Context, s *trail, x *saga.StepTx) error {
		cmdErr.Store(x.EmitCommand(ctx, outbox.Message{EventType: "x"}))
		return nil
	}}
	okDef := typedDef("panics", panicky, eager)
	badDef := typedDef("silent", effectStep("before"), silent)
	r.reg.MustRegister(okDef, badDef)
	r.run(nil, nil, nil)
	a := r.start(okDef, trail{}, 0)
	b := r.start(badDef, trail{}, 0)
	r.wait(a, saga.StatusCompleted, 20*time.Second)
	if rec := r.steps(a)[0]; rec.Attempts != 2 || !strings.Contains(rec.LastError, "panicked") {
		t.Fatalf("panicky %+v: want 2 attempts and the panic as last error", rec)
	}
	if err, _ := cmdErr.Load().(error); !errors.Is(err, saga.ErrInvalid) {
		t.Fatalf("EmitCommand in a step without ReplyTimeout: %v, want ErrInvalid", err)
	}
	inst := r.wait(b, saga.StatusCompensated, 20*time.Second)
	if !strings.Contains(inst.CompensationReason, "EmitCommand") {
		t.Fatalf("reason %q does not tell the author what is missing", inst.CompensationReason)
	}
}

func TestRunnerListenSurvivesALostConnection(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	entered := make(chan struct{}, 4)
	first := saga.TypedStep[trail]{Name: "first", Do: func(context.Context, *trail, *saga.StepTx) error {
		entered <- struct{}{}
		return nil
	}}
	def := typedDef("relisten", first)
	r.reg.MustRegister(def)
	r.run(nil, nil, &saga.RunnerConfig{PollInterval: 30 * time.Second, MaxPollInterval: 30 * time.Second})
	time.Sleep(100 * time.Millisecond)
	// Kill the LISTEN session, as a failover or an idle-session killer would.
	if n := r.count(`SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND query LIKE 'LISTEN%' AND pid <> pg_backend_pid()`); n != 1 {
		t.Fatalf("terminated %d LISTEN sessions, want 1", n)
	}
	// The reconnection wakes the runner once (notifications may have been
	// lost); drain that, then check that NOTIFY works again.
	time.Sleep(500 * time.Millisecond)
	r.start(def, trail{}, 0)
	deadline := time.After(10 * time.Second)
	for {
		if err := saga.NotifyRunners(context.Background(), r.db.Pool); err != nil {
			t.Fatal(err)
		}
		select {
		case <-entered:
			return
		case <-deadline:
			t.Fatal("no wake-up after the LISTEN connection was lost")
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func TestRunnerStartStopStress(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	def := typedDef("churn", effectStep("a"), effectStep("b"))
	r.reg.MustRegister(def)
	const n = 60
	r.startMany(def, n)
	for i := range 12 {
		run, err := saga.NewRunner(r.journal, r.db.Pool, r.reg, r.cfg(&saga.RunnerConfig{Workers: 4}))
		if err != nil {
			t.Fatal(err)
		}
		if err := run.Stop(context.Background()); err != nil {
			t.Fatalf("Stop before Start: %v", err)
		}
		if err := run.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := run.Start(context.Background()); !errors.Is(err, saga.ErrInvalid) {
			t.Fatalf("second Start: %v, want ErrInvalid", err)
		}
		time.Sleep(time.Duration(i%4) * 15 * time.Millisecond)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := run.Stop(ctx); err != nil {
			t.Fatalf("cycle %d: Stop: %v", i, err)
		}
		if err := run.Stop(ctx); err != nil {
			t.Fatalf("cycle %d: second Stop: %v", i, err)
		}
		cancel()
	}
	r.run(nil, nil, nil)
	r.waitAll(30 * time.Second)
	if c := r.count(`SELECT count(*) FROM (SELECT DISTINCT instance_id, step FROM effects) d`); c != 2*n || r.count(`SELECT count(*) FROM effects`) != 2*n {
		t.Fatalf("effects %d distinct of %d, want %d once each", c, r.count(`SELECT count(*) FROM effects`), 2*n)
	}
}

// A retry's delay is journaled (and logged, and shown) rounded to the
// millisecond, jitter and all: "retry in 195ms", never 194.600885ms.
func TestRetryDelaysAreJournaledInWholeMilliseconds(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	flaky := effectStep("flaky")
	inner := flaky.Do
	flaky.Retry = saga.RetryPolicy{MaxAttempts: 4, Base: 20 * time.Millisecond, Factor: 1.7}
	flaky.Do = func(ctx context.Context, s *trail, x *saga.StepTx) error {
		if err := inner(ctx, s, x); err != nil {
			return err
		}
		if x.Attempt < 4 {
			return fmt.Errorf("dependency unavailable (attempt %d)", x.Attempt)
		}
		return nil
	}
	def := typedDef("rounded", flaky)
	r.reg.MustRegister(def)
	r.run(nil, nil, nil)
	id := r.start(def, trail{}, 0)
	r.wait(id, saga.StatusCompleted, 20*time.Second)
	if n := r.count(`SELECT count(*) FROM saga_events WHERE instance_id = $1 AND (payload->>'retry_in')::bigint > 0`, id); n != 3 {
		t.Fatalf("%d journaled retries, want 3", n)
	}
	if n := r.count(`SELECT count(*) FROM saga_events WHERE instance_id = $1 AND (payload->>'retry_in')::bigint % 1000000 <> 0`, id); n != 0 {
		t.Errorf("%d retries journaled with a delay that is not whole milliseconds", n)
	}
	for _, c := range []struct{ in, want time.Duration }{
		{194600885 * time.Nanosecond, 195 * time.Millisecond},
		{1500 * time.Millisecond, 1500 * time.Millisecond},
		{1234567 * time.Nanosecond, time.Millisecond},
		{345678 * time.Nanosecond, 346 * time.Microsecond},
	} {
		if got := saga.RoundDelay(c.in); got != c.want {
			t.Errorf("RoundDelay(%s) = %s, want %s", c.in, got, c.want)
		}
	}
}
