package saga_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/compensa/compensa/saga"
)

// An attempt that acts outside its transaction (a call to a carrier) and
// loses its lease before its step_failed can commit leaves no event of its
// own: the step it left open is what the next claim finds, and the next
// holder records it (step_interrupted), so that a compensation that starts
// later undoes the step although no event of the attempt says it acted.

// interruptedShip is a saga whose third step calls a carrier outside its
// transaction on its first attempt and then hangs past its lease, deaf to
// its context; its later attempts are refused by the carrier without
// shipping. entered is closed once the first attempt has called out;
// release lets it return.
func interruptedShip(r *rig, name string) (def saga.Definition, entered, release chan struct{}) {
	entered, release = make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	ship := saga.TypedStep[trail]{
		Name:       "ship",
		Compensate: compensateInto("ship"),
		Do: func(ctx context.Context, s *trail, x *saga.StepTx) error {
			if calls.Add(1) > 1 {
				return saga.Permanent(errors.New("carrier refused the parcel: nothing shipped"))
			}
			// The carrier's side effect: committed whatever happens to
			// the step's transaction.
			if _, err := r.db.Pool.Exec(context.Background(), `INSERT INTO effects (instance_id, step, attempt, runner)
				VALUES ($1, 'ship', $2, 'carrier')`, x.Instance.ID, x.Attempt); err != nil {
				return err
			}
			close(entered)
			<-release
			return saga.MayHaveActed(errors.New("carrier: no answer"))
		},
	}
	return typedDef(name, effectStep("reserve"), effectStep("charge"), ship), entered, release
}

// runZombie runs a runner whose heartbeats never reach the database (a
// process cut off or paused): its lease runs out while its step hangs.
func runZombie(r *rig, hooks saga.Hooks) {
	r.run(r.pool(4), zombie{r.journal}, &saga.RunnerConfig{Workers: 1, LeaseDuration: 500 * time.Millisecond, Hooks: hooks})
}

func TestRunnerCompensatesAStepWhoseAttemptLostItsLease(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	def, entered, release := interruptedShip(r, "lostship")
	r.reg.MustRegister(def)
	var stale hookLog
	runZombie(r, stale.hooks())
	id := r.start(def, trail{}, 0)
	<-entered

	// Another process claims the instance once the lease ran out; the
	// carrier refuses its attempt, which did not act: compensation starts,
	// and must start at ship, whose first attempt called the carrier.
	r.run(r.pool(4), nil, nil)
	r.wait(id, saga.StatusCompensated, 20*time.Second)
	close(release)

	if got := r.compOrder(id); !equal(got, []string{"ship", "charge", "reserve"}) {
		t.Fatalf("compensated %v, want [ship charge reserve]: the interrupted attempt called the carrier\n%s", got, r.history(id))
	}
	kinds := r.kinds(id)
	at := slices.Index(kinds, "step_interrupted:2")
	if at < 0 || at > slices.Index(kinds, "step_failed:2") {
		t.Fatalf("history %v: step_interrupted:2 must come first, before the next attempt's step_failed", kinds)
	}
	// The stale attempt's step_failed is refused by the fence.
	deadline := time.Now().Add(10 * time.Second)
	for stale.count(saga.OutcomeLeaseLost) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the stale attempt was not refused; its outcomes: %v", stale.outcomes("ship", false))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := strings.Count(strings.Join(r.kinds(id), " "), "step_failed:2"); n != 1 {
		t.Fatalf("%d step_failed of ship, want the second attempt's only: %v", n, r.kinds(id))
	}
}

// A person's cancel revokes the lease of the attempt that called out: the
// compensation it starts undoes that step too.
func TestRunnerCancelCompensatesTheAttemptItCutShort(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	def, entered, release := interruptedShip(r, "cancelship")
	r.reg.MustRegister(def)
	runZombie(r, saga.Hooks{})
	id := r.start(def, trail{}, 0)
	<-entered
	if err := r.journal.RequestCancel(context.Background(), id, "customer withdrew", "ops"); err != nil {
		t.Fatal(err)
	}
	r.run(r.pool(4), nil, nil)
	r.wait(id, saga.StatusCompensated, 20*time.Second)
	close(release)
	if got := r.compOrder(id); !equal(got, []string{"ship", "charge", "reserve"}) {
		t.Fatalf("compensated %v, want [ship charge reserve]: the cancelled attempt called the carrier\n%s", got, r.history(id))
	}
}

// A runner stopped hard in the middle of an attempt gives the lease back
// with the step left open: the attempt may have called out, and the next
// claim records it.
func TestRunnerHardStopLeavesTheAttemptOpen(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	entered := make(chan struct{})
	var once sync.Once
	var calls atomic.Int32
	block := effectStep("block")
	inner := block.Do
	block.Do = func(ctx context.Context, s *trail, x *saga.StepTx) error {
		if calls.Add(1) == 1 {
			once.Do(func() { close(entered) })
			<-ctx.Done()
			return ctx.Err()
		}
		return inner(ctx, s, x)
	}
	def := typedDef("hardopen", block)
	r.reg.MustRegister(def)
	run, err := saga.NewRunner(r.journal, r.db.Pool, r.reg, r.cfg(nil))
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
		t.Fatalf("Stop = %v, want the deadline", err)
	}
	r.run(nil, nil, nil)
	r.wait(id, saga.StatusCompleted, 20*time.Second)
	if got := r.kinds(id); !equal(got, []string{"step_interrupted:0", "step_completed:0", "completed:-1"}) {
		t.Fatalf("history %v, want the aborted attempt recorded as interrupted first", got)
	}
}

// A graceful stop gives every lease back between attempts: nothing was
// cut short, and the next runner records no interruption.
func TestRunnerGracefulStopLeavesNothingOpen(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	slow := effectStep("a")
	inner := slow.Do
	slow.Do = func(ctx context.Context, s *trail, x *saga.StepTx) error {
		time.Sleep(2 * time.Millisecond)
		return inner(ctx, s, x)
	}
	def := typedDef("calm", slow, effectStep("b"), effectStep("c"))
	r.reg.MustRegister(def)
	r.startMany(def, 60)
	run, err := saga.NewRunner(r.journal, r.db.Pool, r.reg, r.cfg(&saga.RunnerConfig{Workers: 4}))
	if err != nil {
		t.Fatal(err)
	}
	if err := run.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	for r.count(`SELECT count(*) FROM effects`) < 30 {
		time.Sleep(5 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := run.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if c := r.count(`SELECT count(*) FROM saga_instances WHERE open_step IS NOT NULL`); c != 0 {
		t.Fatalf("%d instances left with an open step after a graceful stop", c)
	}
	r.run(nil, nil, nil)
	r.waitAll(60 * time.Second)
	if c := r.count(`SELECT count(*) FROM saga_events WHERE kind = 'step_interrupted'`); c != 0 {
		t.Fatalf("%d interruptions recorded after a graceful stop", c)
	}
}

// Instances claimed together and run as a group record what their claim
// found open, each before its first step.
func TestRunnerGroupRecordsInterruptedStepsFirst(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	def := typedDef("groupopen", effectStep("a"), effectStep("b"))
	r.reg.MustRegister(def)
	ids := r.startMany(def, 8)
	// Their previous holder crashed in step a.
	r.exec(`UPDATE saga_instances SET open_step = 0`)
	r.run(nil, nil, &saga.RunnerConfig{Workers: 1, GroupCommit: 8, ClaimBatch: 8})
	r.waitAll(30 * time.Second)
	for _, id := range ids {
		if got := r.kinds(id); !equal(got, []string{"step_interrupted:0", "step_completed:0", "step_completed:1", "completed:-1"}) {
			t.Fatalf("instance %s: history %v", id, got)
		}
	}
}
