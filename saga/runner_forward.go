package saga

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Forward steps: the rate turn, one attempt in its transaction, and what a
// failed attempt leads to (retry, hold, or compensation).

// forward advances a RUNNING instance by one unit: the deadline, a reply, a
// reply timeout, or one attempt of the current step.
func (w *work) forward(ctx context.Context) next {
	inst := &w.inst
	i := inst.CurrentStep
	if i < 0 || i >= len(w.def.Steps) {
		w.r.stuck(w.log, *inst, fmt.Sprintf("current step %d is outside the %d steps of %s", i, len(w.def.Steps), w.def.Key()))
		return nextLeave
	}
	if inst.TimeoutAt != nil && !w.now().Before(*inst.TimeoutAt) {
		return w.startCompensation(ctx, nil, ReasonDeadline)
	}
	step := w.def.Steps[i]
	switch {
	case len(inst.Reply) > 0:
		return w.consumeReply(ctx, step)
	case inst.AwaitingUntil != nil && !inst.AwaitingCorrelationID.Valid:
		return w.waited(ctx, step)
	case inst.AwaitingCorrelationID.Valid:
		if inst.AwaitingUntil != nil && w.now().Before(*inst.AwaitingUntil) {
			// Woken before the reply or its timeout (a manual retry):
			// nothing to do; the lease expires and the claim moves on.
			return nextLeave
		}
		err := fmt.Errorf("no reply to command %s within %s", inst.AwaitingCorrelationID.UUID, step.ReplyTimeout)
		switch step.OnReplyTimeout {
		case ReplyTimeoutCompensate:
			err = Permanent(err)
		case ReplyTimeoutFail:
			return w.failForGood(ctx, step, inst.Attempt+1, err)
		}
		return w.fail(ctx, step, inst.Attempt+1, err, FailureReplyTimeout, 0)
	}
	if step.Rate != nil {
		if n, ok := w.takeRate(ctx, step); !ok {
			return n
		}
	}
	return w.runDo(ctx, step)
}

// takeRate takes the step's turn under its Rate. It reports false with what
// the worker does next when the turn has not come: the journal gave the
// instance back, due at its turn, and the worker is free for other
// instances meanwhile; or the lease was lost, or the journal unreachable.
func (w *work) takeRate(ctx context.Context, step Step) (next, bool) {
	rt, ok := w.r.journal.(RateTaker)
	if !ok {
		return nextContinue, true
	}
	wait, err := rt.TakeRateTurn(ctx, w.inst.ID, w.lease, step.Rate.Key(w.def.Name, step.Name, w.inst.TenantID), step.Rate.Every())
	switch {
	case ctx.Err() != nil || errors.Is(err, ErrLeaseLost):
		return nextDrop, false
	case err != nil:
		w.r.throttle.Warn("rate", "saga step rate: taking a turn failed; the step waits for its next claim", "step", step.Name, "err", err)
		return nextYield, false
	case wait > 0:
		// Given back: the lease is released already.
		return nextDrop, false
	}
	return nextContinue, true
}

// forwardCtx is the context of one attempt of a forward step: cancelled by a
// lost lease, a hard stop and the step's timeout, each with its own cause.
func (w *work) forwardCtx(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	sctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(w.r.hardCtx, func() { cancel(errHardStop) })
	var tcancel context.CancelFunc = func() {}
	var out context.Context = sctx
	if timeout > 0 {
		out, tcancel = context.WithTimeoutCause(sctx, timeout, errStepTimeout)
	}
	return out, func() {
		tcancel()
		stop()
		cancel(nil)
	}
}

func (w *work) stepTx(tx pgx.Tx, step Step, attempt int) *StepTx {
	x := &StepTx{
		Tx:       tx,
		Instance: w.inst,
		Step:     w.inst.CurrentStep,
		StepName: step.Name,
		Attempt:  attempt,
		State:    w.inst.Context,
	}
	x.emitter = emitter{
		tx:     tx,
		table:  w.r.cfg.OutboxTable,
		tenant: w.inst.TenantID,
		cause:  w.inst.TriggerEventID,
		corr:   w.inst.CorrelationID.UUID,
	}
	return x
}

// call runs a step function, turning a panic into an error so that a bug in
// one step fails its attempt instead of the process.
func (w *work) call(f func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			w.log.Error("saga step panicked", "step", w.inst.CurrentStep, "panic", p, "stack", string(debug.Stack()))
			err = fmt.Errorf("step panicked: %v", p)
		}
	}()
	return f()
}

// runDo runs one attempt of the current step's Do and commits it with its
// journal entry, or records the failure.
func (w *work) runDo(ctx context.Context, step Step) next {
	attempt := w.inst.Attempt + 1
	ctx = w.traceAttempt(ctx, step, false, attempt)
	began := time.Now()
	tx := &lazyTx{begin: w.r.pool.Begin}
	x := w.stepTx(tx, step, attempt)
	if step.awaitsReply() {
		x.CommandID = uuid.New()
		x.command = x.CommandID
	}
	sctx, cancel := w.forwardCtx(ctx, step.Timeout)
	err := w.call(func() error { return step.Do(sctx, x) })
	cause := context.Cause(sctx)
	timedOut := sctx.Err() != nil && errors.Is(cause, errStepTimeout)
	cancel()
	x.closed = true
	if err == nil && step.awaitsReply() && x.commands == 0 {
		err = Permanent(errNoCommand)
	}
	if err == nil {
		err = checkJSON(x)
	}
	if err == nil && tx.err != nil {
		// Do swallowed the failed BEGIN: what it meant to write is not in
		// any transaction, so its entry must not be written alone.
		err = fmt.Errorf("begin the step's transaction: %w", tx.err)
	}
	if err != nil {
		tx.rollback()
		return w.afterFailedAttempt(ctx, step, attempt, err, cause, timedOut, "", time.Since(began))
	}

	var ev Event
	outcome := OutcomeCompleted
	last := w.inst.CurrentStep == len(w.def.Steps)-1
	if step.awaitsReply() {
		outcome = OutcomeAwaiting
		ev = Event{Kind: EventStepAwaiting, Step: w.inst.CurrentStep, StepName: step.Name,
			State: x.State, Output: x.Output, CorrelationID: x.command,
			// At least a millisecond: a deadline that passed while Do ran
			// still needs a wait that ends, so that the next claim sees it.
			AwaitFor: max(w.capToDeadline(step.ReplyTimeout), time.Millisecond)}
	} else {
		ev = Event{Kind: EventStepCompleted, Step: w.inst.CurrentStep, StepName: step.Name,
			State: x.State, Output: x.Output}
	}
	n, err := w.commitLazy(ctx, tx, func(jctx context.Context) error {
		if last && ev.Kind == EventStepCompleted {
			return w.appendEnding(jctx, ev, StatusCompleted, "")
		}
		_, err := w.r.journal.Append(jctx, w.inst.ID, w.lease, ev)
		return err
	})
	if err != nil {
		return w.afterFailedCommit(ctx, step, attempt, err, n, "", time.Since(began))
	}
	w.hook(step, false, attempt, outcome, false, time.Since(began), nil)
	w.log.DebugContext(ctx, "saga step committed", "step", step.Name, "attempt", attempt, "outcome", outcome, "emitted", x.emitted)
	switch {
	case ev.Kind == EventStepAwaiting:
		return nextYield
	case last:
		w.terminal(StatusCompleted, "")
		return nextDone
	}
	return w.advanced(ctx, ev)
}

// afterFailedAttempt classifies an attempt whose function returned an error
// (its transaction is already rolled back). reason is the failure reason when
// the step had already acted (a reply's OnReply), else empty.
func (w *work) afterFailedAttempt(ctx context.Context, step Step, attempt int, err, cause error, timedOut bool, reason string, took time.Duration) next {
	switch {
	case errors.Is(context.Cause(ctx), ErrLeaseLost):
		w.hook(step, false, attempt, OutcomeLeaseLost, false, took, err)
		return nextDrop
	case errors.Is(cause, errHardStop) && !timedOut:
		// Not an attempt: the runner, not the step, gave up. But it may
		// have acted before it was stopped: the step is left open for the
		// next claim to record.
		w.hook(step, false, attempt, OutcomeAborted, false, took, err)
		return nextAbandon
	}
	if ev, ok := w.skipOrWait(step, err); ok && !timedOut && reason == "" {
		return w.commitNoAct(ctx, step, attempt, ev, time.Now().Add(-took))
	}
	if timedOut {
		reason = FailureTimeout
		err = fmt.Errorf("%w after %s: %w", errStepTimeout, step.Timeout, err)
	}
	if reason == "" && errors.Is(err, ErrMayHaveActed) {
		reason = FailureMayHaveActed
	}
	return w.fail(ctx, step, attempt, err, reason, took)
}

// afterFailedCommit handles an error from the journal or the commit of a
// step whose function succeeded.
func (w *work) afterFailedCommit(ctx context.Context, step Step, attempt int, err error, n next, reason string, took time.Duration) next {
	if n == nextDrop {
		if errors.Is(err, ErrLeaseLost) {
			w.hook(step, false, attempt, OutcomeLeaseLost, false, took, err)
			w.log.Warn("saga step rolled back: lease lost", "step", step.Name, "attempt", attempt)
		} else {
			w.log.Error("saga step commit failed: outcome unknown, left to the next claim", "step", step.Name, "err", err)
		}
		return nextDrop
	}
	// The journal refused the entry (an invalid state) or the database
	// failed before the commit: a failed attempt.
	if errors.Is(err, ErrInvalid) {
		err = Permanent(err)
	}
	return w.fail(ctx, step, attempt, err, reason, took)
}

// fail records a failed attempt of the current step (its writes are rolled
// back): another attempt after the backoff, or, for a permanent error or the
// last attempt, the start of compensation. reason marks an attempt that may
// have acted.
func (w *work) fail(ctx context.Context, step Step, attempt int, err error, reason string, took time.Duration) next {
	timedOut := reason == FailureTimeout || reason == FailureReplyTimeout
	ev := Event{Kind: EventStepFailed, Step: w.inst.CurrentStep, StepName: step.Name, Error: err.Error(), Reason: reason}
	n, why, gaveUp := w.retryOrHold(ctx, step, false, attempt, ev, err, timedOut, took)
	if !gaveUp {
		return n
	}
	w.hook(step, false, attempt, OutcomeFailed, timedOut, took, err)
	w.log.WarnContext(ctx, "saga step failed for good: compensating", "step", step.Name, "attempt", attempt, "err", err.Error())
	return w.startCompensation(ctx, &ev, why)
}

// retryOrHold decides what a failed attempt of a step (or, with comp, of
// its compensation) leads to, the same way for both: an error an operator
// must fix holds the instance (a timeout never does); a transient error
// within the policy's attempts records ev with the delay before the next
// one (at least what a Retry-After asks for; a forward step's never past
// the deadline) and yields. Otherwise it gives up and returns why, for the
// caller to compensate or to fail the instance.
func (w *work) retryOrHold(ctx context.Context, step Step, comp bool, attempt int, ev Event, err error, timedOut bool, took time.Duration) (n next, why string, gaveUp bool) {
	pol, subject := step.Retry.WithDefaults(DefaultStepRetry), "step "+step.Name
	limit := w.capToDeadline
	if comp {
		// A compensation runs past the deadline: it is what the deadline
		// started.
		pol, subject = step.CompensationRetry.WithDefaults(DefaultCompensationRetry), "compensation of step "+step.Name
		limit = func(d time.Duration) time.Duration { return d }
	}
	if class := Classify(err); class.holds() && !timedOut {
		ev.Class = class
		ev.RetryIn = RoundDelay(limit(w.heldDelay(pol, err)))
		return w.hold(ctx, step, comp, attempt, ev, err, took), "", false
	}
	if !IsPermanent(err) && attempt < pol.MaxAttempts {
		ev.RetryIn = pol.Delay(attempt)
		if d, ok := RetryAfterOf(err); ok && d > ev.RetryIn {
			ev.RetryIn = d // the service asked for at least this much
		}
		ev.RetryIn = RoundDelay(limit(ev.RetryIn))
		if _, cerr := w.inTx(ctx, func(jctx context.Context) error {
			_, err := w.r.journal.Append(jctx, w.inst.ID, w.lease, ev)
			return err
		}); cerr != nil {
			return w.lostOrBroken(step, comp, attempt, took, cerr, "record a failed attempt of the "+subject), "", false
		}
		w.hook(step, comp, attempt, OutcomeRetry, timedOut, took, err)
		// A forward step's retry is routine; a compensation's is not.
		level, msg := slog.LevelInfo, "saga step failed: retry scheduled"
		if comp {
			level, msg = slog.LevelWarn, "saga compensation failed: retry scheduled"
		}
		w.log.Log(ctx, level, msg, "step", step.Name, "attempt", attempt,
			"max_attempts", pol.MaxAttempts, "retry_in", ev.RetryIn, "err", err.Error())
		return nextYield, "", false
	}
	if IsPermanent(err) {
		return 0, fmt.Sprintf("%s failed permanently: %s", subject, err.Error()), true
	}
	return 0, fmt.Sprintf("%s failed after %d attempts: %s", subject, attempt, err.Error()), true
}

// heldDelay is the wait before the next attempt of a held instance (see
// the package's heldDelay), at least what a Retry-After in err asks for.
func (w *work) heldDelay(pol RetryPolicy, err error) time.Duration {
	d := heldDelay(pol, w.inst.HeldSince, w.now())
	if ra, ok := RetryAfterOf(err); ok && ra > d {
		d = ra
	}
	return d
}

// hold records a failed attempt whose error an operator or the database
// must fix, or that the next attempt resolves (ev.Class): it counts as no
// attempt and never compensates; the instance is retried after ev.RetryIn
// and shows as held once the hold has lasted (admin's StuckHeld).
func (w *work) hold(ctx context.Context, step Step, comp bool, attempt int, ev Event, err error, took time.Duration) next {
	if _, cerr := w.inTx(ctx, func(jctx context.Context) error {
		_, err := w.r.journal.Append(jctx, w.inst.ID, w.lease, ev)
		return err
	}); cerr != nil {
		return w.lostOrBroken(step, comp, attempt, took, cerr, "record a failed attempt")
	}
	w.hook(step, comp, attempt, OutcomeHeld, false, took, err)
	what := "saga step"
	if comp {
		what = "saga compensation"
	}
	args := []any{"step", step.Name, "class", ev.Class, "retry_in", ev.RetryIn.Round(time.Millisecond), "err", ev.Error}
	if w.inst.HeldSince == nil {
		// Once per hold: the attempts that follow are at debug level.
		w.log.WarnContext(ctx, what+" failed with an error that is not the step's answer: held and retried, not compensated; fix the cause or cancel the instance", args...)
	} else {
		w.log.DebugContext(ctx, what+" still held", append(args, "held_for", w.now().Sub(*w.inst.HeldSince).Round(time.Second))...)
	}
	return nextYield
}

// lostOrBroken reports a journal write that did not happen.
func (w *work) lostOrBroken(step Step, comp bool, attempt int, took time.Duration, err error, what string) next {
	if errors.Is(err, ErrLeaseLost) {
		w.hook(step, comp, attempt, OutcomeLeaseLost, false, took, err)
		w.log.Warn("saga lease lost: could not "+what, "step", step.Name)
	} else {
		w.log.Error("saga journal write failed: could not "+what+"; left to the next claim", "step", step.Name, "err", err)
	}
	return nextDrop
}

// failForGood ends a step that may have acted (no reply within its
// ReplyTimeout, with OnReplyTimeout ReplyTimeoutFail) without compensating:
// the instance ends FAILED with the reason, for a person; a manual retry
// then compensates from this step down.
func (w *work) failForGood(ctx context.Context, step Step, attempt int, err error) next {
	i := w.inst.CurrentStep
	why := fmt.Sprintf("step %s failed for good: %s; nothing was compensated, as the step asks on a reply timeout: check the participant, then retry to compensate", step.Name, err)
	// The instance's last_error is the last event's Error: make it say why
	// nothing was compensated, for the person who must now act.
	failed := Event{Kind: EventStepFailed, Step: i, StepName: step.Name, Error: why, Reason: FailureReplyTimeout}
	started := Event{Kind: EventCompensationStarted, Step: i, StepName: step.Name, Reason: why}
	if _, cerr := w.inTx(ctx, func(jctx context.Context) error {
		if _, err := w.r.journal.Append(jctx, w.inst.ID, w.lease, failed); err != nil {
			return err
		}
		if _, err := w.r.journal.Append(jctx, w.inst.ID, w.lease, started); err != nil {
			return err
		}
		return w.markTerminal(jctx, StatusFailed, why)
	}); cerr != nil {
		return w.lostOrBroken(step, false, attempt, 0, cerr, "fail the step")
	}
	w.hook(step, false, attempt, OutcomeFailed, true, 0, err)
	w.log.Warn("saga step failed for good: instance FAILED, not compensated", "step", step.Name, "err", err)
	w.terminal(StatusFailed, why)
	return nextDone
}
