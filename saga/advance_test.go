package saga_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/compensa/compensa/saga"
)

var t0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

func running() saga.Instance {
	return saga.Instance{
		ID: uuid.New(), SagaName: "s", SagaVersion: 1, Status: saga.StatusRunning,
		Context: json.RawMessage(`{}`), NextAttemptAt: t0,
		LeaseID: uuid.NullUUID{UUID: uuid.New(), Valid: true}, LeaseExpiresAt: ptr(t0.Add(time.Minute)),
	}
}

func ptr[T any](v T) *T { return &v }

func mustAdvance(t *testing.T, inst saga.Instance, cur *saga.StepRecord, ev saga.Event, now time.Time) saga.Transition {
	t.Helper()
	tr, err := saga.Advance(inst, cur, ev, now)
	if err != nil {
		t.Fatalf("Advance(%s): %v", ev.Kind, err)
	}
	if tr.Instance.Version != inst.Version+1 || tr.Event.Version != tr.Instance.Version {
		t.Fatalf("version %d -> %d (event %d)", inst.Version, tr.Instance.Version, tr.Event.Version)
	}
	return tr
}

func wantKind(t *testing.T, err, kind error) {
	t.Helper()
	if !errors.Is(err, kind) {
		t.Fatalf("error = %v, want kind %v", err, kind)
	}
}

func TestAdvanceForwardStep(t *testing.T) {
	inst := running()
	now := t0.Add(1500 * time.Nanosecond) // sub-microsecond: truncated
	tr := mustAdvance(t, inst, nil, saga.Event{Kind: saga.EventStepCompleted, Step: 0, StepName: "reserve",
		State: json.RawMessage(`{"a":1}`), Output: json.RawMessage(`"out"`)}, now)
	// Already due (at t0): it keeps next_attempt_at, so that the update
	// changes no indexed column (a HOT update).
	want := t0.Add(time.Microsecond)
	got := tr.Instance
	if got.CurrentStep != 1 || got.Attempt != 0 || !got.NextAttemptAt.Equal(t0) || string(got.Context) != `{"a":1}` {
		t.Fatalf("projection after step_completed: %+v", got)
	}
	// Not due yet (a claim never returns such an instance, but Advance does
	// not rely on it): the next step is due now.
	later := running()
	later.NextAttemptAt = t0.Add(time.Hour)
	if tr := mustAdvance(t, later, nil, saga.Event{Kind: saga.EventStepCompleted, Step: 0, StepName: "reserve"}, now); !tr.Instance.NextAttemptAt.Equal(want) {
		t.Fatalf("next_attempt_at after a step of an instance not yet due: %v, want now", tr.Instance.NextAttemptAt)
	}
	if !got.LeaseID.Valid {
		t.Fatal("step_completed must keep the holder's lease")
	}
	s := tr.Step
	if s == nil || s.Sequence != 0 || s.Name != "reserve" || s.Status != saga.StepCompleted || s.Attempts != 1 ||
		string(s.Output) != `"out"` || !s.CompletedAt.Equal(want) || !s.StartedAt.Equal(want) {
		t.Fatalf("step record: %+v", s)
	}
	if !tr.Event.CreatedAt.Equal(want) || tr.Event.InstanceID != inst.ID {
		t.Fatalf("event: %+v", tr.Event)
	}

	// A failing attempt of step 1: counters up, retried RetryIn from now.
	tr = mustAdvance(t, got, nil, saga.Event{Kind: saga.EventStepFailed, Step: 1, Error: "boom", RetryIn: 2*time.Second + 999}, t0)
	if tr.Instance.Attempt != 1 || tr.Instance.LastError != "boom" || !tr.Instance.NextAttemptAt.Equal(t0.Add(2*time.Second)) {
		t.Fatalf("after step_failed: %+v", tr.Instance)
	}
	if tr.Step.Status != saga.StepFailed || tr.Step.Attempts != 1 || tr.Step.LastError != "boom" {
		t.Fatalf("failed step record: %+v", tr.Step)
	}
	// The retry completes: instance attempt resets, the step counts 2.
	tr = mustAdvance(t, tr.Instance, tr.Step, saga.Event{Kind: saga.EventStepCompleted, Step: 1}, t0.Add(3*time.Second))
	if tr.Instance.CurrentStep != 2 || tr.Instance.Attempt != 0 || tr.Instance.LastError != "" || tr.Step.Attempts != 2 {
		t.Fatalf("after retry completed: %+v %+v", tr.Instance, tr.Step)
	}
}

func TestAdvanceAwaitReplyConsume(t *testing.T) {
	inst := running()
	corr := uuid.New()
	tr := mustAdvance(t, inst, nil, saga.Event{Kind: saga.EventStepAwaiting, Step: 0, CorrelationID: corr, AwaitFor: time.Minute}, t0)
	if tr.Step.Status != saga.StepRunning || tr.Step.Attempts != 0 {
		t.Fatalf("awaiting step: %+v", tr.Step)
	}
	if tr.Instance.AwaitingCorrelationID.UUID != corr || !tr.Instance.AwaitingUntil.Equal(t0.Add(time.Minute)) ||
		!tr.Instance.NextAttemptAt.Equal(t0.Add(time.Minute)) {
		t.Fatalf("awaiting projection: %+v", tr.Instance)
	}
	waiting, step := tr.Instance, tr.Step

	_, err := saga.Advance(waiting, step, saga.Event{Kind: saga.EventReplyReceived, Step: 0, CorrelationID: uuid.New(), Output: json.RawMessage(`1`)}, t0)
	wantKind(t, err, saga.ErrInvalid)

	tr = mustAdvance(t, waiting, step, saga.Event{Kind: saga.EventReplyReceived, Step: 0, CorrelationID: corr, Output: json.RawMessage(`{"ok":true}`)}, t0.Add(time.Second))
	got := tr.Instance
	if string(got.Reply) != `{"ok":true}` || got.AwaitingCorrelationID.Valid || got.LeaseID.Valid || got.LeaseExpiresAt != nil ||
		!got.NextAttemptAt.Equal(t0.Add(time.Second)) || tr.Step != nil {
		t.Fatalf("after reply: %+v", got)
	}
	// The runner consumes the reply by completing the step.
	tr = mustAdvance(t, got, step, saga.Event{Kind: saga.EventStepCompleted, Step: 0}, t0.Add(2*time.Second))
	if tr.Instance.Reply != nil || tr.Instance.AwaitingUntil != nil || tr.Step.Attempts != 1 {
		t.Fatalf("reply not consumed: %+v %+v", tr.Instance, tr.Step)
	}
	// A wait that times out fails the attempt and ends the wait.
	tr = mustAdvance(t, waiting, step, saga.Event{Kind: saga.EventStepFailed, Step: 0, Error: "no reply"}, t0.Add(time.Minute))
	if tr.Instance.AwaitingCorrelationID.Valid || tr.Instance.Attempt != 1 || tr.Step.Status != saga.StepFailed {
		t.Fatalf("timed-out wait: %+v %+v", tr.Instance, tr.Step)
	}
}

func TestAdvanceCompensation(t *testing.T) {
	inst := running()
	tr := mustAdvance(t, inst, nil, saga.Event{Kind: saga.EventStepCompleted, Step: 0, StepName: "a"}, t0)
	done0 := *tr.Step
	tr = mustAdvance(t, tr.Instance, nil, saga.Event{Kind: saga.EventStepFailed, Step: 1, Error: "x"}, t0)
	atStep1, failed1 := tr.Instance, *tr.Step

	_, err := saga.Advance(atStep1, &failed1, saga.Event{Kind: saga.EventCompensationStarted, Step: 2}, t0)
	wantKind(t, err, saga.ErrInvalid) // beyond the steps reached
	_, err = saga.Advance(atStep1, &failed1, saga.Event{Kind: saga.EventStepCompensated, Step: 1}, t0)
	wantKind(t, err, saga.ErrInvalid) // not compensating yet

	tr = mustAdvance(t, atStep1, &failed1, saga.Event{Kind: saga.EventCompensationStarted, Step: 1, Reason: "step 1 failed"}, t0)
	c := tr.Instance
	if c.Status != saga.StatusCompensating || c.CurrentStep != 1 || c.CompensationReason != "step 1 failed" || c.Attempt != 0 || tr.Step != nil {
		t.Fatalf("compensation started: %+v", c)
	}
	// Compensation of step 1 fails once, then succeeds.
	tr = mustAdvance(t, c, &failed1, saga.Event{Kind: saga.EventCompensationFailed, Step: 1, Error: "undo", RetryIn: time.Second}, t0)
	if tr.Instance.Attempt != 1 || tr.Step.CompensationAttempts != 1 || tr.Step.Status != saga.StepFailed ||
		!tr.Instance.NextAttemptAt.Equal(t0.Add(time.Second)) {
		t.Fatalf("compensation failed: %+v %+v", tr.Instance, tr.Step)
	}
	tr = mustAdvance(t, tr.Instance, tr.Step, saga.Event{Kind: saga.EventStepCompensated, Step: 1}, t0)
	if tr.Instance.CurrentStep != 0 || tr.Instance.Attempt != 0 || tr.Step.Status != saga.StepCompensated || !tr.Step.CompensatedAt.Equal(t0) {
		t.Fatalf("step compensated: %+v %+v", tr.Instance, tr.Step)
	}
	// Not done yet: COMPENSATED needs every step behind.
	_, err = saga.Advance(tr.Instance, &done0, saga.Event{Kind: saga.EventCompensated, Step: -1}, t0)
	wantKind(t, err, saga.ErrInvalid)
	tr = mustAdvance(t, tr.Instance, &done0, saga.Event{Kind: saga.EventCompensationSkipped, Step: 0}, t0)
	if tr.Instance.CurrentStep != -1 || tr.Step != nil {
		t.Fatalf("skipped: %+v", tr.Instance)
	}
	tr = mustAdvance(t, tr.Instance, nil, saga.Event{Kind: saga.EventCompensated, Step: -1, Reason: "done"}, t0.Add(time.Hour))
	if tr.Instance.Status != saga.StatusCompensated || !tr.Instance.CompletedAt.Equal(t0.Add(time.Hour)) || tr.Instance.LeaseID.Valid {
		t.Fatalf("terminal: %+v", tr.Instance)
	}
	// A terminal instance takes nothing more, a manual retry included.
	for _, k := range []saga.EventKind{saga.EventStepCompleted, saga.EventCompensationSkipped, saga.EventRetryRequested, saga.EventCancelRequested, saga.EventCompleted} {
		if _, err := saga.Advance(tr.Instance, nil, saga.Event{Kind: k, Step: -1}, t0); !errors.Is(err, saga.ErrInvalid) {
			t.Fatalf("%s on COMPENSATED: %v, want ErrInvalid", k, err)
		}
	}
}

func TestAdvanceCompensationNeedsSomethingToUndo(t *testing.T) {
	inst := running()
	inst.Status = saga.StatusCompensating
	_, err := saga.Advance(inst, nil, saga.Event{Kind: saga.EventStepCompensated, Step: 0}, t0)
	wantKind(t, err, saga.ErrInvalid) // PENDING step never ran
	_, err = saga.Advance(inst, nil, saga.Event{Kind: saga.EventCompensationFailed, Step: 0}, t0)
	wantKind(t, err, saga.ErrInvalid)
	mustAdvance(t, inst, nil, saga.Event{Kind: saga.EventCompensationSkipped, Step: 0}, t0)
}

func TestAdvanceManualRetryAndCancel(t *testing.T) {
	failed := running()
	failed.Status = saga.StatusFailed
	failed.CurrentStep = 1
	failed.Attempt = 7
	failed.NextAttemptAt = t0.Add(-time.Hour)
	rec := saga.StepRecord{Sequence: 1, Name: "b", Status: saga.StepCompleted, Attempts: 1, CompensationAttempts: 7}
	tr := mustAdvance(t, failed, &rec, saga.Event{Kind: saga.EventRetryRequested, Step: -1, Reason: "fixed", Actor: "ops"}, t0)
	got := tr.Instance
	if got.Status != saga.StatusCompensating || got.Attempt != 0 || !got.NextAttemptAt.Equal(t0) || got.LeaseID.Valid || got.CurrentStep != 1 {
		t.Fatalf("retry of FAILED: %+v", got)
	}
	if tr.Step.CompensationAttempts != 0 || tr.Step.Attempts != 1 || tr.Step.Status != saga.StepCompleted {
		t.Fatalf("retry must reset the compensation counter and mark nothing done: %+v", tr.Step)
	}
	if rec.CompensationAttempts != 7 {
		t.Fatal("Advance modified its input step record")
	}

	run := running()
	run.Attempt = 3
	tr = mustAdvance(t, run, nil, saga.Event{Kind: saga.EventRetryRequested, Step: -1}, t0)
	if tr.Instance.Status != saga.StatusRunning || tr.Instance.Attempt != 0 || tr.Step != nil || tr.Instance.LeaseID.Valid {
		t.Fatalf("retry of RUNNING: %+v", tr.Instance)
	}

	tr = mustAdvance(t, run, nil, saga.Event{Kind: saga.EventCancelRequested, Step: -1, Actor: "ops"}, t0)
	if tr.Instance.Status != saga.StatusCompensating || tr.Instance.CurrentStep != 0 || tr.Instance.LeaseID.Valid || tr.Instance.CompensationReason == "" {
		t.Fatalf("cancel: %+v", tr.Instance)
	}
	_, err := saga.Advance(tr.Instance, nil, saga.Event{Kind: saga.EventCancelRequested, Step: -1}, t0)
	wantKind(t, err, saga.ErrInvalid) // already compensating
}

func TestAdvanceRefusals(t *testing.T) {
	inst := running()
	cases := []struct {
		name string
		ev   saga.Event
		kind error
	}{
		{"unknown kind", saga.Event{Kind: "nope"}, saga.ErrInvalid},
		{"step mismatch", saga.Event{Kind: saga.EventStepCompleted, Step: 1}, saga.ErrInvalid},
		{"no step", saga.Event{Kind: saga.EventStepFailed, Step: -1}, saga.ErrInvalid},
		{"bad state", saga.Event{Kind: saga.EventStepCompleted, State: json.RawMessage(`{`)}, saga.ErrInvalid},
		{"NUL in jsonb", saga.Event{Kind: saga.EventStepCompleted, Output: json.RawMessage(`"a\u0000"`)}, saga.ErrInvalid},
		{"NUL in text", saga.Event{Kind: saga.EventStepFailed, Error: "a\x00"}, saga.ErrInvalid},
		{"bad utf8", saga.Event{Kind: saga.EventStepFailed, Error: "\xff"}, saga.ErrInvalid},
		{"negative retry", saga.Event{Kind: saga.EventStepFailed, RetryIn: -1}, saga.ErrInvalid},
		{"await without id", saga.Event{Kind: saga.EventStepAwaiting, AwaitFor: time.Second}, saga.ErrInvalid},
		{"await without time", saga.Event{Kind: saga.EventStepAwaiting, CorrelationID: uuid.New()}, saga.ErrInvalid},
		{"compensate while running", saga.Event{Kind: saga.EventStepCompensated}, saga.ErrInvalid},
		{"failed from running", saga.Event{Kind: saga.EventFailed, Step: -1}, saga.ErrInvalid},
		{"timed out from running", saga.Event{Kind: saga.EventTimedOut, Step: -1}, saga.ErrInvalid},
		{"terminal names other step", saga.Event{Kind: saga.EventCompleted, Step: 3}, saga.ErrInvalid},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := saga.Advance(inst, nil, c.ev, t0)
			wantKind(t, err, c.kind)
		})
	}
	named := saga.StepRecord{Sequence: 0, Name: "a", Status: saga.StepFailed}
	_, err := saga.Advance(inst, &named, saga.Event{Kind: saga.EventStepCompleted, StepName: "b"}, t0)
	wantKind(t, err, saga.ErrInvalid)
	wrong := saga.StepRecord{Sequence: 4}
	_, err = saga.Advance(inst, &wrong, saga.Event{Kind: saga.EventStepCompleted}, t0)
	wantKind(t, err, saga.ErrInvalid)
	done := saga.StepRecord{Sequence: 0, Status: saga.StepCompleted}
	_, err = saga.Advance(inst, &done, saga.Event{Kind: saga.EventStepFailed}, t0)
	wantKind(t, err, saga.ErrInvalid) // COMPLETED -> FAILED is not a step transition
}

func TestLeaseBoundary(t *testing.T) {
	inst := running()
	exp := *inst.LeaseExpiresAt
	lease := inst.LeaseID.UUID
	if !saga.HoldsLease(inst, lease, exp.Add(-time.Microsecond)) || !saga.HoldsLease(inst, lease, exp) {
		t.Fatal("lease must hold before and at expiry")
	}
	if saga.HoldsLease(inst, lease, exp.Add(time.Microsecond)) || saga.HoldsLease(inst, uuid.New(), exp) {
		t.Fatal("lease must not hold after expiry or for another id")
	}
	if saga.Claimable(&inst, exp) || !saga.Claimable(&inst, exp.Add(time.Microsecond)) {
		t.Fatal("claimable only strictly after expiry")
	}
	inst.NextAttemptAt = exp.Add(time.Hour)
	if saga.Claimable(&inst, exp.Add(time.Microsecond)) {
		t.Fatal("not claimable before next_attempt_at")
	}
}

func TestTerminalKind(t *testing.T) {
	for _, s := range []saga.Status{saga.StatusCompleted, saga.StatusCompensated, saga.StatusFailed, saga.StatusTimedOut} {
		k, err := saga.TerminalKind(s)
		if err != nil || !k.Terminal() || k.Appendable() {
			t.Fatalf("%s -> %q %v", s, k, err)
		}
	}
	_, err := saga.TerminalKind(saga.StatusRunning)
	wantKind(t, err, saga.ErrInvalid)
}

func optStep(p *int) string {
	if p == nil {
		return "none"
	}
	return fmt.Sprint(*p)
}

// TestAdvanceOpenStep: what each event does to the step the holder may be
// running (OpenStep), and what a claim does (ClaimOpenStep).
func TestAdvanceOpenStep(t *testing.T) {
	open := func(inst saga.Instance, step int) saga.Instance {
		inst.OpenStep = &step
		inst.CurrentStep = step
		return inst
	}
	compensating := open(running(), 1)
	compensating.Status = saga.StatusCompensating
	rec := &saga.StepRecord{Sequence: 1, Name: "b", Status: saga.StepCompleted}
	cases := []struct {
		name string
		inst saga.Instance
		cur  *saga.StepRecord
		ev   saga.Event
		want *int
	}{
		{"step_completed opens the next", open(running(), 1), nil, saga.Event{Kind: saga.EventStepCompleted, Step: 1}, ptr(2)},
		{"step_skipped opens the next", open(running(), 1), nil, saga.Event{Kind: saga.EventStepSkipped, Step: 1}, ptr(2)},
		{"step_failed closes", open(running(), 1), nil, saga.Event{Kind: saga.EventStepFailed, Step: 1, Error: "x"}, nil},
		{"a held step_failed closes", open(running(), 1), nil, saga.Event{Kind: saga.EventStepFailed, Step: 1, Error: "x", Class: saga.ClassOperator}, nil},
		{"step_awaiting closes", open(running(), 1), nil, saga.Event{Kind: saga.EventStepAwaiting, Step: 1, CorrelationID: uuid.New(), AwaitFor: time.Second}, nil},
		{"step_waiting closes", open(running(), 1), nil, saga.Event{Kind: saga.EventStepWaiting, Step: 1, Until: t0.Add(time.Hour)}, nil},
		{"compensation_started closes", open(running(), 1), nil, saga.Event{Kind: saga.EventCompensationStarted, Step: 0}, nil},
		{"retry_requested keeps", open(running(), 1), nil, saga.Event{Kind: saga.EventRetryRequested, Step: -1}, ptr(1)},
		{"cancel_requested keeps", open(running(), 1), nil, saga.Event{Kind: saga.EventCancelRequested, Step: -1}, ptr(1)},
		{"paused keeps", open(running(), 1), nil, saga.Event{Kind: saga.EventPaused, Step: -1}, ptr(1)},
		{"step_interrupted keeps a RUNNING holder in its step", open(running(), 1), nil, saga.Event{Kind: saga.EventStepInterrupted, Step: 1}, ptr(1)},
		{"step_interrupted closes a COMPENSATING one", compensating, rec, saga.Event{Kind: saga.EventStepInterrupted, Step: 1}, nil},
		{"step_compensated closes", compensating, rec, saga.Event{Kind: saga.EventStepCompensated, Step: 1}, nil},
		{"compensation_skipped closes", compensating, nil, saga.Event{Kind: saga.EventCompensationSkipped, Step: 1}, nil},
		{"completed closes", open(running(), 1), nil, saga.Event{Kind: saga.EventCompleted, Step: -1}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.inst.InterruptedStep = ptr(7)
			tr := mustAdvance(t, c.inst, c.cur, c.ev, t0)
			if optStep(tr.Instance.OpenStep) != optStep(c.want) {
				t.Fatalf("open step %s, want %s", optStep(tr.Instance.OpenStep), optStep(c.want))
			}
			if tr.Instance.InterruptedStep != nil {
				t.Fatal("InterruptedStep, a claim's report, outlived an event")
			}
		})
	}

	// step_interrupted: only the open step, a record that an attempt
	// began, nothing counted.
	inst := open(running(), 1)
	inst.Attempt = 2
	inst.HeldSince = ptr(t0.Add(-time.Minute))
	tr := mustAdvance(t, inst, nil, saga.Event{Kind: saga.EventStepInterrupted, Step: 1, StepName: "b", Reason: saga.ReasonInterrupted}, t0)
	if got := tr.Instance; got.Status != saga.StatusRunning || got.CurrentStep != 1 || got.Attempt != 2 || got.HeldSince == nil || !got.LeaseID.Valid {
		t.Fatalf("step_interrupted changed more than the record: %+v", got)
	}
	if s := tr.Step; s == nil || s.Status != saga.StepRunning || s.Attempts != 0 || s.Name != "b" || !s.StartedAt.Equal(t0) {
		t.Fatalf("step record: %+v", tr.Step)
	}
	done := &saga.StepRecord{Sequence: 1, Name: "b", Status: saga.StepCompleted}
	if tr := mustAdvance(t, inst, done, saga.Event{Kind: saga.EventStepInterrupted, Step: 1}, t0); tr.Step != nil {
		t.Fatalf("a COMPLETED record moved: %+v", tr.Step)
	}
	for name, ev := range map[string]saga.Event{
		"another step":   {Kind: saga.EventStepInterrupted, Step: 0},
		"no step open":   {Kind: saga.EventStepInterrupted, Step: 1},
		"paused":         {Kind: saga.EventStepInterrupted, Step: 1},
		"skip of a wait": {Kind: saga.EventStepSkipped, Step: 1},
	} {
		in := inst
		switch name {
		case "no step open":
			in.OpenStep = nil
		case "paused":
			in.Status = saga.StatusPaused
		case "skip of a wait":
			in.AwaitingUntil = ptr(t0.Add(time.Hour))
		}
		if _, err := saga.Advance(in, nil, ev, t0); !errors.Is(err, saga.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	if !saga.EventStepInterrupted.Appendable() || !saga.EventStepInterrupted.Valid() {
		t.Fatal("step_interrupted is appended by the lease holder")
	}

	// The claim: opens the current step of a RUNNING instance that does
	// not wait, keeps (and reports) a step left open.
	claims := []struct {
		name              string
		inst              saga.Instance
		interrupted, open *int
	}{
		{"running", running(), nil, ptr(0)},
		{"left open", open(running(), 2), ptr(2), ptr(2)},
		{"compensating", compensating, ptr(1), ptr(1)},
		{"compensating, nothing open", func() saga.Instance { i := compensating; i.OpenStep = nil; return i }(), nil, nil},
		{"awaiting a reply", func() saga.Instance {
			i := running()
			i.AwaitingCorrelationID = uuid.NullUUID{UUID: uuid.New(), Valid: true}
			return i
		}(), nil, nil},
		{"waiting", func() saga.Instance { i := running(); i.AwaitingUntil = ptr(t0); return i }(), nil, nil},
		{"holding a reply", func() saga.Instance { i := running(); i.Reply = json.RawMessage(`{}`); return i }(), nil, nil},
	}
	for _, c := range claims {
		interrupted, open := saga.ClaimOpenStep(c.inst)
		if optStep(interrupted) != optStep(c.interrupted) || optStep(open) != optStep(c.open) {
			t.Errorf("claim of %s: interrupted %s open %s, want %s and %s", c.name, optStep(interrupted), optStep(open), optStep(c.interrupted), optStep(c.open))
		}
	}
}
