package journaltest

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/compensa/compensa/saga"
)

// The open step (Instance.OpenStep): what a claim hands over, what a claim
// reports as interrupted (Instance.InterruptedStep), and what each write
// does to it.

// releaser is implemented by journals that give a lease back (the runner
// uses it when present).
type releaser interface {
	Release(ctx context.Context, id, lease uuid.UUID) (bool, error)
}

// stepText renders an optional step for messages.
func stepText(p *int) string {
	if p == nil {
		return "none"
	}
	return fmt.Sprint(*p)
}

func wantOpen(t *testing.T, what string, got saga.Instance, open, interrupted *int) {
	t.Helper()
	if !samePtr(got.OpenStep, open) || !samePtr(got.InterruptedStep, interrupted) {
		t.Fatalf("%s: open step %s, interrupted %s; want %s and %s", what,
			stepText(got.OpenStep), stepText(got.InterruptedStep), stepText(open), stepText(interrupted))
	}
}

func samePtr(a, b *int) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

func step(n int) *int { return &n }

// expire moves the clock past inst's lease, as a holder that crashed or
// stalled leaves it.
func expire(h Harness, inst saga.Instance) {
	h.Clock.Set(inst.LeaseExpiresAt.Add(time.Microsecond))
}

// testClaimOpensTheCurrentStep: a claim hands the current step over as
// open; Get shows it, and reports no interruption (that is a claim's).
func testClaimOpensTheCurrentStep(t *testing.T, h Harness) {
	inst := started(t, h)
	wantOpen(t, "claimed", inst, step(0), nil)
	wantOpen(t, "read back", get(t, h.Journal, inst.ID), step(0), nil)
	appendOK(t, h.Journal, inst, saga.Event{Kind: saga.EventStepCompleted, Step: 0})
	wantOpen(t, "after step_completed", get(t, h.Journal, inst.ID), step(1), nil)
	appendOK(t, h.Journal, inst, saga.Event{Kind: saga.EventStepSkipped, Step: 1})
	wantOpen(t, "after step_skipped", get(t, h.Journal, inst.ID), step(2), nil)
	appendOK(t, h.Journal, inst, saga.Event{Kind: saga.EventStepFailed, Step: 2, Error: "no", RetryIn: time.Second})
	wantOpen(t, "after step_failed", get(t, h.Journal, inst.ID), nil, nil)
	// A closed step is not reported: the next claim opens it afresh.
	expire(h, inst)
	again := claim(t, h.Journal, inst.ID, lease)
	wantOpen(t, "claimed after a recorded failure", again, step(2), nil)
	appendOK(t, h.Journal, again, saga.Event{Kind: saga.EventStepCompleted, Step: 2})
	if ok, err := h.Journal.MarkTerminal(ctx, inst.ID, again.LeaseID.UUID, saga.StatusCompleted, ""); !ok || err != nil {
		t.Fatalf("mark completed: %t %v", ok, err)
	}
	wantOpen(t, "completed", get(t, h.Journal, inst.ID), nil, nil)
}

// testLeftOpenIsReportedUntilRecorded: a holder that loses its lease in
// the middle of an attempt leaves the step open; every claim reports it,
// however many claimers crash before they record it, and step_interrupted
// records it. The recorder goes on into the same step, so losing its lease
// in turn leaves it open again.
func testLeftOpenIsReportedUntilRecorded(t *testing.T, h Harness) {
	inst := started(t, h)
	appendOK(t, h.Journal, inst, saga.Event{Kind: saga.EventStepCompleted, Step: 0, StepName: "a"})
	expire(h, inst) // the holder crashed in step 1's attempt
	c1 := claim(t, h.Journal, inst.ID, lease)
	wantOpen(t, "first claim after the crash", c1, step(1), step(1))
	expire(h, c1) // and so did the next one, before recording it
	c2 := claim(t, h.Journal, inst.ID, lease)
	wantOpen(t, "second claim", c2, step(1), step(1))
	// The crashed claimer cannot record it any more.
	_, err := h.Journal.Append(ctx, inst.ID, c1.LeaseID.UUID, saga.Event{Kind: saga.EventStepInterrupted, Step: 1})
	isKind(t, "step_interrupted under a lost lease", err, saga.ErrLeaseLost)
	// Only the open step can be recorded.
	_, err = h.Journal.Append(ctx, inst.ID, c2.LeaseID.UUID, saga.Event{Kind: saga.EventStepInterrupted, Step: 0})
	isKind(t, "step_interrupted for another step", err, saga.ErrInvalid)
	now := h.Clock.Now()
	v := appendOK(t, h.Journal, c2, saga.Event{Kind: saga.EventStepInterrupted, Step: 1, StepName: "b", Reason: saga.ReasonInterrupted})
	got := get(t, h.Journal, inst.ID)
	if got.Version != v || got.Status != saga.StatusRunning || got.CurrentStep != 1 || got.Attempt != 0 || !got.LeaseID.Valid || got.LeaseID != c2.LeaseID {
		t.Fatalf("step_interrupted changed more than the record: %+v", got)
	}
	wantOpen(t, "after step_interrupted", got, step(1), nil)
	evs, err := h.Journal.Load(ctx, inst.ID)
	if err != nil {
		t.Fatal(err)
	}
	last := evs[len(evs)-1]
	if last.Kind != saga.EventStepInterrupted || last.Step != 1 || last.StepName != "b" || last.Reason != saga.ReasonInterrupted || !last.CreatedAt.Equal(now) {
		t.Fatalf("recorded %+v", last)
	}
	// The step record says an attempt began, and counts none.
	steps, err := h.Journal.Steps(ctx, inst.ID)
	if err != nil || len(steps) != 2 {
		t.Fatalf("steps: %+v %v", steps, err)
	}
	if s := steps[1]; s.Sequence != 1 || s.Name != "b" || s.Status != saga.StepRunning || s.Attempts != 0 || s.CompletedAt != nil {
		t.Fatalf("step record after step_interrupted: %+v", s)
	}
	sameTime(t, "started_at", steps[1].StartedAt, now)
	// The recorder's own attempt is cut short too: reported again.
	expire(h, c2)
	c3 := claim(t, h.Journal, inst.ID, lease)
	wantOpen(t, "claim after the recorder lost its lease", c3, step(1), step(1))
	appendOK(t, h.Journal, c3, saga.Event{Kind: saga.EventStepInterrupted, Step: 1})
	appendOK(t, h.Journal, c3, saga.Event{Kind: saga.EventStepFailed, Step: 1, Error: "refused"})
	expire(h, c3)
	c4 := claim(t, h.Journal, inst.ID, lease)
	wantOpen(t, "claim after a recorded failure", c4, step(1), nil)
	// Nothing is open to record now... but the claim opened step 1.
	appendOK(t, h.Journal, c4, saga.Event{Kind: saga.EventCompensationStarted, Step: 0, Reason: "step b failed"})
	_, err = h.Journal.Append(ctx, inst.ID, c4.LeaseID.UUID, saga.Event{Kind: saga.EventStepInterrupted, Step: 1})
	isKind(t, "step_interrupted with no step open", err, saga.ErrInvalid)
}

// testReleaseClosesHeartbeatKeeps: Release gives the lease back with the
// step closed (the holder ran nothing); a heartbeat that shortens the lease
// leaves it open, for an attempt that was cut short.
func testReleaseClosesHeartbeatKeeps(t *testing.T, h Harness) {
	rel, ok := h.Journal.(releaser)
	if !ok {
		t.Skip("the journal cannot give a lease back")
	}
	inst := started(t, h)
	if ok, err := rel.Release(ctx, inst.ID, uuid.New()); ok || err != nil {
		t.Fatalf("release of a lease not held: %t %v", ok, err)
	}
	if ok, err := rel.Release(ctx, inst.ID, inst.LeaseID.UUID); !ok || err != nil {
		t.Fatalf("release: %t %v", ok, err)
	}
	got := get(t, h.Journal, inst.ID)
	if got.LeaseID.Valid || got.LeaseExpiresAt != nil || got.Version != 0 {
		t.Fatalf("after release: %+v", got)
	}
	wantOpen(t, "released", got, nil, nil)
	if ok, err := rel.Release(ctx, inst.ID, inst.LeaseID.UUID); ok || err != nil {
		t.Fatalf("release twice: %t %v", ok, err)
	}
	_, err := h.Journal.Append(ctx, inst.ID, inst.LeaseID.UUID, saga.Event{Kind: saga.EventStepCompleted, Step: 0})
	isKind(t, "append after release", err, saga.ErrLeaseLost)
	// Claimable at once, and nothing reported.
	c := claim(t, h.Journal, inst.ID, lease)
	wantOpen(t, "claimed after release", c, step(0), nil)

	if ok, err := h.Journal.Heartbeat(ctx, c.ID, c.LeaseID.UUID, time.Microsecond); !ok || err != nil {
		t.Fatalf("shortening heartbeat: %t %v", ok, err)
	}
	h.Clock.Advance(2 * time.Microsecond)
	wantOpen(t, "claimed after a shortened lease", claim(t, h.Journal, inst.ID, lease), step(0), step(0))
}

// testLeaseRevokingRequestsKeepIt: a person's request or a reply revokes
// the lease, and the attempt it cuts short may have acted: the open step
// stays, and the next claim reports it, whatever status the instance is in
// then (cancel: COMPENSATING, where step_interrupted closes it).
func testLeaseRevokingRequestsKeepIt(t *testing.T, h Harness) {
	// Cancel.
	inst := started(t, h)
	appendOK(t, h.Journal, inst, saga.Event{Kind: saga.EventStepCompleted, Step: 0})
	if err := h.Journal.RequestCancel(ctx, inst.ID, "withdrawn", "ops"); err != nil {
		t.Fatal(err)
	}
	wantOpen(t, "cancelled", get(t, h.Journal, inst.ID), step(1), nil)
	c := claim(t, h.Journal, inst.ID, lease)
	if c.Status != saga.StatusCompensating || c.CurrentStep != 1 {
		t.Fatalf("claimed after cancel: %+v", c)
	}
	wantOpen(t, "claimed after cancel", c, step(1), step(1))
	appendOK(t, h.Journal, c, saga.Event{Kind: saga.EventStepInterrupted, Step: 1, Reason: saga.ReasonInterrupted})
	got := get(t, h.Journal, inst.ID)
	if got.Status != saga.StatusCompensating || got.CurrentStep != 1 {
		t.Fatalf("step_interrupted moved a compensating instance: %+v", got)
	}
	wantOpen(t, "compensating after step_interrupted", got, nil, nil)
	expire(h, c)
	c = claim(t, h.Journal, inst.ID, lease)
	wantOpen(t, "compensating, claimed again", c, nil, nil)
	// The interrupted step, which never recorded an attempt of its own,
	// can be compensated.
	appendOK(t, h.Journal, c, saga.Event{Kind: saga.EventCompensationFailed, Step: 1, Error: "undo failed", RetryIn: time.Second})
	appendOK(t, h.Journal, c, saga.Event{Kind: saga.EventStepCompensated, Step: 1})

	// Pause and resume, in the middle of step 1.
	inst = started(t, h)
	appendOK(t, h.Journal, inst, saga.Event{Kind: saga.EventStepCompleted, Step: 0})
	if err := h.Journal.RequestPause(ctx, inst.ID, "", "ops"); err != nil {
		t.Fatal(err)
	}
	wantOpen(t, "paused", get(t, h.Journal, inst.ID), step(1), nil)
	if err := h.Journal.RequestResume(ctx, inst.ID, "", "ops"); err != nil {
		t.Fatal(err)
	}
	wantOpen(t, "claimed after pause and resume", claim(t, h.Journal, inst.ID, lease), step(1), step(1))

	// A person's retry.
	inst = started(t, h)
	if err := h.Journal.RequestRetry(ctx, inst.ID, "", "ops"); err != nil {
		t.Fatal(err)
	}
	wantOpen(t, "claimed after a retry", claim(t, h.Journal, inst.ID, lease), step(0), step(0))
}

// testSkipAfterInterruption: an attempt that was interrupted may be
// followed by one that decides not to act: the skip is recorded.
func testSkipAfterInterruption(t *testing.T, h Harness) {
	inst := started(t, h)
	expire(h, inst)
	c := claim(t, h.Journal, inst.ID, lease)
	appendOK(t, h.Journal, c, saga.Event{Kind: saga.EventStepInterrupted, Step: 0})
	appendOK(t, h.Journal, c, saga.Event{Kind: saga.EventStepSkipped, Step: 0, Reason: "nothing to do"})
	got := get(t, h.Journal, inst.ID)
	if got.CurrentStep != 1 {
		t.Fatalf("after the skip: %+v", got)
	}
	wantOpen(t, "after the skip", got, step(1), nil)
	if steps, _ := h.Journal.Steps(ctx, inst.ID); len(steps) != 1 || steps[0].Status != saga.StepSkipped {
		t.Fatalf("step records: %+v", steps)
	}
}

// testWaitsOpenNothing: a step that waits (a reply, a timer) or holds a
// reply runs no attempt when claimed: the claim opens nothing, and a holder
// lost there is not reported.
func testWaitsOpenNothing(t *testing.T, h Harness) {
	inst := started(t, h)
	corr := uuid.New()
	appendOK(t, h.Journal, inst, saga.Event{Kind: saga.EventStepAwaiting, Step: 0, CorrelationID: corr, AwaitFor: time.Second})
	wantOpen(t, "awaiting", get(t, h.Journal, inst.ID), nil, nil)
	expire(h, inst) // and the reply is late: due for its timeout
	c := claim(t, h.Journal, inst.ID, lease)
	wantOpen(t, "claimed at the reply timeout", c, nil, nil)
	expire(h, c)
	c = claim(t, h.Journal, inst.ID, lease)
	wantOpen(t, "claimed again", c, nil, nil)
	if _, err := h.Journal.DeliverReply(ctx, corr, []byte(`{"ok": true}`), "test"); err != nil {
		t.Fatal(err)
	}
	wantOpen(t, "claimed with a reply", claim(t, h.Journal, inst.ID, lease), nil, nil)

	inst = started(t, h)
	appendOK(t, h.Journal, inst, saga.Event{Kind: saga.EventStepWaiting, Step: 0, Until: h.Clock.Now().Add(time.Second)})
	wantOpen(t, "waiting", get(t, h.Journal, inst.ID), nil, nil)
	expire(h, inst) // past the wait's end too
	c = claim(t, h.Journal, inst.ID, lease)
	wantOpen(t, "claimed at the wait's end", c, nil, nil)
	appendOK(t, h.Journal, c, saga.Event{Kind: saga.EventStepCompleted, Step: 0})
	wantOpen(t, "the wait's step completed", get(t, h.Journal, inst.ID), step(1), nil)
}

// testRateGiveBackCloses: an instance given back until its rate turn ran
// nothing: its step is closed.
func testRateGiveBackCloses(t *testing.T, h Harness) {
	rt, ok := h.Journal.(saga.RateTaker)
	if !ok {
		t.Skip("the journal keeps no rate turns")
	}
	a, b := started(t, h), started(t, h)
	for i, inst := range []saga.Instance{a, b} {
		if wait, err := rt.TakeRateTurn(ctx, inst.ID, inst.LeaseID.UUID, "open.rate", time.Second); err != nil || wait != time.Duration(i)*time.Second {
			t.Fatalf("turn %d: (%s, %v)", i, wait, err)
		}
	}
	wantOpen(t, "the turn came", get(t, h.Journal, a.ID), step(0), nil)
	wantOpen(t, "given back", get(t, h.Journal, b.ID), nil, nil)
	h.Clock.Advance(time.Second)
	got, err := h.Journal.ClaimPending(ctx, 10, lease)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(got, func(x saga.Instance) bool { return x.ID == b.ID })
	if i < 0 {
		t.Fatal("not claimed at its turn")
	}
	wantOpen(t, "claimed at its turn", got[i], step(0), nil)
}
