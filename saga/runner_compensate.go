package saga

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Compensation: in reverse order, only for the steps that completed (or
// may have acted), each retried under its own policy.

// startCompensation moves a RUNNING instance to COMPENSATING, starting at the
// newest step that completed or may have acted. failed, when set, is the
// step_failed of the attempt that ended the forward run: both commit
// together, so the attempt is counted exactly when compensation starts.
func (w *work) startCompensation(ctx context.Context, failed *Event, reason string) next {
	start, err := w.compensationStart(ctx, failed)
	if err != nil {
		w.log.Error("saga compensation: reading the history failed", "err", err)
		return nextDrop
	}
	ev := Event{Kind: EventCompensationStarted, Step: start, Reason: reason}
	if start >= 0 {
		ev.StepName = w.def.Steps[start].Name
	}
	final := w.finalStatus(reason)
	if _, err := w.inTx(ctx, func(jctx context.Context) error {
		if failed != nil {
			if _, err := w.r.journal.Append(jctx, w.inst.ID, w.lease, *failed); err != nil {
				return err
			}
		}
		if _, err := w.r.journal.Append(jctx, w.inst.ID, w.lease, ev); err != nil {
			return err
		}
		if start < 0 {
			// Nothing acted: compensated at once.
			return w.markTerminal(jctx, final, reason)
		}
		return nil
	}); err != nil {
		return w.lostOrBroken(w.def.Steps[w.inst.CurrentStep], false, w.inst.Attempt+1, 0, err, "start compensation")
	}
	w.log.Info("saga compensating", "from_step", start, "reason", reason)
	if start < 0 {
		w.terminal(final, reason)
		return nextDone
	}
	if failed != nil {
		return w.advanced(ctx, *failed, ev)
	}
	return w.advanced(ctx, ev)
}

func (w *work) finalStatus(reason string) Status {
	if reason == ReasonDeadline {
		return StatusTimedOut
	}
	return StatusCompensated
}

// compensationStart is the newest step that completed or may have acted: the
// steps before the current one completed; the current one counts if it ever
// acted (see acted).
func (w *work) compensationStart(ctx context.Context, failed *Event) (int, error) {
	i := min(w.inst.CurrentStep, len(w.def.Steps)-1)
	if failed != nil && mayHaveActed(failed.Reason) {
		return i, nil
	}
	acted, _, err := w.acted(ctx, i)
	if err != nil {
		return 0, err
	}
	if acted {
		return i, nil
	}
	return i - 1, nil
}

// acted reports, from the instance's history, whether step i completed or
// may have acted: it committed, it committed a command (step_awaiting), an
// attempt of it ran out of time or got a reply, or an attempt of it lost
// its lease (step_interrupted), unless it then skipped: a step that decides
// not to act (step_skipped) decided so in the attempt that was interrupted
// too, and is never compensated. command is the id of the
// last command the step sent, if any, for its compensation to cancel. Only
// the attempt since the last restart at or before step i counts: what an
// earlier attempt did there was compensated then.
func (w *work) acted(ctx context.Context, i int) (acted bool, command uuid.UUID, err error) {
	hist, err := w.r.journal.Load(ctx, w.inst.ID)
	if err != nil {
		return false, uuid.Nil, err
	}
	for _, e := range hist {
		if e.Kind == EventRestarted && e.Step <= i {
			acted, command = false, uuid.Nil
			continue
		}
		if e.Step != i {
			continue
		}
		switch e.Kind {
		case EventStepAwaiting:
			acted, command = true, e.CorrelationID
		case EventStepCompleted, EventReplyReceived, EventStepInterrupted:
			acted = true
		case EventStepSkipped:
			acted, command = false, uuid.Nil
		case EventStepFailed:
			if mayHaveActed(e.Reason) {
				acted = true
			}
		}
	}
	return acted, command, nil
}

// compensate runs one unit of a COMPENSATING instance: the compensation of
// its current step (or its skip), and the terminal status after step 0.
func (w *work) compensate(ctx context.Context) next {
	inst := &w.inst
	i := inst.CurrentStep
	final := w.finalStatus(inst.CompensationReason)
	if i < 0 {
		if _, err := w.inTx(ctx, func(jctx context.Context) error {
			return w.markTerminal(jctx, final, inst.CompensationReason)
		}); err != nil {
			return w.lostOrBroken(Step{}, true, 0, 0, err, "end the compensation")
		}
		w.terminal(final, inst.CompensationReason)
		return nextDone
	}
	if i >= len(w.def.Steps) {
		w.r.stuck(w.log, *inst, fmt.Sprintf("compensating step %d, outside the %d steps of %s", i, len(w.def.Steps), w.def.Key()))
		return nextLeave
	}
	step := w.def.Steps[i]
	acted, command, err := w.acted(ctx, i)
	if err != nil {
		w.log.Error("saga compensation: reading the history failed", "err", err)
		return nextDrop
	}
	if !acted || step.Compensate == nil {
		why := "the step never acted"
		if acted {
			why = "the step has no Compensate"
		}
		ev := Event{Kind: EventCompensationSkipped, Step: i, StepName: step.Name, Reason: why}
		return w.compensationDone(ctx, step, ev, 0, OutcomeSkipped, 0, final)
	}

	attempt := inst.Attempt + 1
	began := time.Now()
	ctx = w.traceAttempt(ctx, step, true, attempt)
	tx, err := w.r.pool.Begin(ctx)
	if err != nil {
		w.log.Error("saga compensation: begin transaction", "step", step.Name, "err", err)
		return nextDrop
	}
	x := w.stepTx(tx, step, attempt)
	x.CommandID = command
	if x.Output, err = w.recordedOutput(ctx, i); err != nil {
		rollback(tx)
		w.log.Error("saga compensation: reading the step's output failed", "step", step.Name, "err", err)
		return nextDrop
	}
	// Detached from shutdown (ctx is the lease's context, under baseCtx):
	// only the compensation's own timeout and a lost lease stop it.
	cctx, cancel := context.WithTimeoutCause(ctx, cmpOr(step.Timeout, w.r.cfg.CompensationTimeout), errStepTimeout)
	err = w.call(func() error { return step.Compensate(cctx, x) })
	timedOut := cctx.Err() != nil && errors.Is(context.Cause(cctx), errStepTimeout)
	cancel()
	x.closed = true
	if err != nil {
		rollback(tx)
		if errors.Is(context.Cause(ctx), ErrLeaseLost) {
			w.hook(step, true, attempt, OutcomeLeaseLost, false, time.Since(began), err)
			return nextDrop
		}
		if timedOut {
			err = fmt.Errorf("compensation timed out: %w", err)
		}
		return w.compensationFailed(ctx, step, attempt, err, timedOut, time.Since(began))
	}
	ev := Event{Kind: EventStepCompensated, Step: i, StepName: step.Name}
	return w.compensationDoneTx(ctx, tx, step, ev, attempt, began, final)
}

// compensationDone commits a compensation_skipped in a transaction of its own.
func (w *work) compensationDone(ctx context.Context, step Step, ev Event, attempt int, o Outcome, took time.Duration, final Status) next {
	tx, err := w.r.pool.Begin(ctx)
	if err != nil {
		w.log.Error("saga compensation: begin transaction", "step", step.Name, "err", err)
		return nextDrop
	}
	return w.compensationDoneTx(ctx, tx, step, ev, attempt, time.Now().Add(-took), final)
}

// compensationDoneTx appends a step_compensated or compensation_skipped in
// tx, with the terminal status when it was step 0, and commits.
func (w *work) compensationDoneTx(ctx context.Context, tx pgx.Tx, step Step, ev Event, attempt int, began time.Time, final Status) next {
	last := ev.Step == 0
	reason := w.inst.CompensationReason
	n, err := w.commit(ctx, tx, func(jctx context.Context) error {
		if last {
			return w.appendEnding(jctx, ev, final, reason)
		}
		_, err := w.r.journal.Append(jctx, w.inst.ID, w.lease, ev)
		return err
	})
	o := OutcomeCompleted
	if ev.Kind == EventCompensationSkipped {
		o = OutcomeSkipped
	}
	if err != nil {
		if n == nextDrop || ev.Kind == EventCompensationSkipped {
			return w.lostOrBroken(step, true, attempt, time.Since(began), err, "record the compensation")
		}
		return w.compensationFailed(ctx, step, attempt, err, false, time.Since(began))
	}
	w.hook(step, true, attempt, o, false, time.Since(began), nil)
	w.log.InfoContext(ctx, "saga step compensation recorded", "step", step.Name, "outcome", o)
	if last {
		w.terminal(final, reason)
		return nextDone
	}
	return w.advanced(ctx, ev)
}

// compensationFailed records a failed compensation attempt: another after
// the backoff, or, for a permanent error or the last attempt, the instance
// ends FAILED with the error; the compensations below are not run.
func (w *work) compensationFailed(ctx context.Context, step Step, attempt int, err error, timedOut bool, took time.Duration) next {
	msg := err.Error()
	ev := Event{Kind: EventCompensationFailed, Step: w.inst.CurrentStep, StepName: step.Name, Error: msg}
	n, why, gaveUp := w.retryOrHold(ctx, step, true, attempt, ev, err, timedOut, took)
	if !gaveUp {
		return n
	}
	// The instance's last_error is the last event's Error: make it say
	// which compensation gave up, for the person who must now act.
	ev.Error = why
	if _, cerr := w.inTx(ctx, func(jctx context.Context) error {
		return w.appendEnding(jctx, ev, StatusFailed, why)
	}); cerr != nil {
		return w.lostOrBroken(step, true, attempt, took, cerr, "record the failed compensation")
	}
	w.hook(step, true, attempt, OutcomeFailed, timedOut, took, err)
	w.log.ErrorContext(ctx, "saga compensation failed for good: instance FAILED, needs a person", "step", step.Name, "attempt", attempt, "err", msg)
	w.terminal(StatusFailed, why)
	return nextDone
}

// recordedOutput is the output step i recorded (saga_steps.output).
func (w *work) recordedOutput(ctx context.Context, i int) (json.RawMessage, error) {
	recs, err := w.r.journal.Steps(ctx, w.inst.ID)
	if err != nil {
		return nil, err
	}
	for _, rec := range recs {
		if rec.Sequence == i {
			return rec.Output, nil
		}
	}
	return nil, nil
}

func cmpOr(a, b time.Duration) time.Duration {
	if a > 0 {
		return a
	}
	return b
}
