package saga

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Waits and replies: a step that waits for a reply or a timer, the reply
// that ends the wait, and a step skipped or waiting on its condition.

// consumeReply completes a waiting step with the reply the correlator
// delivered, or fails its attempt.
func (w *work) consumeReply(ctx context.Context, step Step) next {
	attempt := w.inst.Attempt + 1
	reply := ParseReply(w.inst.Reply)
	if !reply.OK {
		err := fmt.Errorf("reply: %s", reply.Error)
		if reply.Permanent {
			err = Permanent(err)
		}
		return w.fail(ctx, step, attempt, err, FailureReplyError, 0)
	}
	began := time.Now()
	ctx = w.traceAttempt(ctx, step, false, attempt)
	tx, err := w.r.pool.Begin(ctx)
	if err != nil {
		w.log.Error("saga reply: begin transaction", "step", step.Name, "err", err)
		return nextDrop
	}
	x := w.stepTx(tx, step, attempt)
	x.Output = w.inst.Reply
	if step.OnReply != nil {
		sctx, cancel := w.forwardCtx(ctx, step.Timeout)
		err = w.call(func() error { return step.OnReply(sctx, x, reply) })
		cause := context.Cause(sctx)
		timedOut := sctx.Err() != nil && errors.Is(cause, errStepTimeout)
		cancel()
		x.closed = true
		if err == nil {
			err = checkJSON(x)
		}
		if err != nil {
			rollback(tx)
			return w.afterFailedAttempt(ctx, step, attempt, err, cause, timedOut, FailureReplyError, time.Since(began))
		}
	}
	x.closed = true
	last := w.inst.CurrentStep == len(w.def.Steps)-1
	ev := Event{Kind: EventStepCompleted, Step: w.inst.CurrentStep, StepName: step.Name, State: x.State, Output: x.Output}
	n, err := w.commit(ctx, tx, func(jctx context.Context) error {
		if last {
			return w.appendEnding(jctx, ev, StatusCompleted, "")
		}
		_, err := w.r.journal.Append(jctx, w.inst.ID, w.lease, ev)
		return err
	})
	if err != nil {
		return w.afterFailedCommit(ctx, step, attempt, err, n, FailureReplyError, time.Since(began))
	}
	w.hook(step, false, attempt, OutcomeCompleted, false, time.Since(began), nil)
	if last {
		w.terminal(StatusCompleted, "")
		return nextDone
	}
	return w.advanced(ctx, ev)
}

// skipOrWait turns a Skip or a WaitUntil that Do returned into the event
// the runner journals for it.
func (w *work) skipOrWait(step Step, err error) (Event, bool) {
	i := w.inst.CurrentStep
	if errors.Is(err, ErrSkipped) {
		return Event{Kind: EventStepSkipped, Step: i, StepName: step.Name, Reason: skipReason(err)}, true
	}
	if until, ok := waitOf(err); ok {
		if w.inst.TimeoutAt != nil && w.inst.TimeoutAt.Before(until) {
			// Due at the deadline, which then compensates.
			until = *w.inst.TimeoutAt
		}
		return Event{Kind: EventStepWaiting, Step: i, StepName: step.Name, Until: Timestamp(until)}, true
	}
	return Event{}, false
}

// commitNoAct journals a step that did not act: skipped (the saga goes
// on, or completes after its last step) or waiting (the instance is due
// at the wait's end; the lease is released meanwhile).
func (w *work) commitNoAct(ctx context.Context, step Step, attempt int, ev Event, began time.Time) next {
	last := ev.Kind == EventStepSkipped && w.inst.CurrentStep == len(w.def.Steps)-1
	if _, err := w.inTx(ctx, func(jctx context.Context) error {
		if last {
			return w.appendEnding(jctx, ev, StatusCompleted, "")
		}
		_, err := w.r.journal.Append(jctx, w.inst.ID, w.lease, ev)
		return err
	}); err != nil {
		return w.lostOrBroken(step, false, attempt, time.Since(began), err, "record "+string(ev.Kind))
	}
	o := OutcomeSkipped
	if ev.Kind == EventStepWaiting {
		o = OutcomeWaiting
	}
	w.hook(step, false, attempt, o, false, time.Since(began), nil)
	w.log.Debug("saga step recorded", "step", step.Name, "kind", ev.Kind, "until", ev.Until)
	switch {
	case last:
		w.terminal(StatusCompleted, "")
		return nextDone
	case ev.Kind == EventStepWaiting:
		if !ev.Until.After(w.now()) {
			return w.advanced(ctx, ev)
		}
		return nextYield
	}
	return w.advanced(ctx, ev)
}

// waited completes a step whose wait (step_waiting) is over; an instance
// woken before the end (a manual retry) waits again until it.
func (w *work) waited(ctx context.Context, step Step) next {
	until := *w.inst.AwaitingUntil
	if w.now().Before(until) {
		return w.commitNoAct(ctx, step, w.inst.Attempt+1, Event{Kind: EventStepWaiting, Step: w.inst.CurrentStep, StepName: step.Name, Until: until}, time.Now())
	}
	began := time.Now()
	last := w.inst.CurrentStep == len(w.def.Steps)-1
	ev := Event{Kind: EventStepCompleted, Step: w.inst.CurrentStep, StepName: step.Name}
	if _, err := w.inTx(ctx, func(jctx context.Context) error {
		if last {
			return w.appendEnding(jctx, ev, StatusCompleted, "")
		}
		_, err := w.r.journal.Append(jctx, w.inst.ID, w.lease, ev)
		return err
	}); err != nil {
		return w.lostOrBroken(step, false, w.inst.Attempt+1, time.Since(began), err, "end the wait")
	}
	w.hook(step, false, w.inst.Attempt+1, OutcomeCompleted, false, time.Since(began), nil)
	if last {
		w.terminal(StatusCompleted, "")
		return nextDone
	}
	return w.advanced(ctx, ev)
}
