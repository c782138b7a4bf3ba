package saga

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/trace"
)

// Compensation reasons the runner writes in compensation_started.
const (
	// ReasonDeadline: the saga's deadline passed; the instance ends
	// TIMED_OUT once compensated.
	ReasonDeadline = "deadline"
	// reasonStepFailedPrefix starts the reason of a compensation that a
	// step's failure started: "step <name> failed: <error>".
	reasonStepFailedPrefix = "step "
)

// Values of Event.Reason on step_failed: the failed attempt may have acted
// (it ran out of time, or it had sent a command), so the step is compensated
// even though it never completed. A step whose Do returned an error did not
// act: its transaction was rolled back.
const (
	FailureTimeout      = "timeout"
	FailureReplyTimeout = "reply_timeout"
	FailureReplyError   = "reply_error"
	// FailureMayHaveActed: Do said so (MayHaveActed), e.g. a call out
	// that got a 5xx or no answer.
	FailureMayHaveActed = "may_have_acted"
)

// mayHaveActed reports whether a step_failed reason marks a step that may
// have acted.
func mayHaveActed(reason string) bool {
	switch reason {
	case FailureTimeout, FailureReplyTimeout, FailureReplyError, FailureMayHaveActed:
		return true
	}
	return false
}

var (
	errStepTimeout = errors.New("step timed out")
	errHardStop    = errors.New("runner stopped: step cancelled")
	errLeaseGone   = Errorf(ErrLeaseLost, "the instance's lease was lost: another worker may hold it")
)

// next says what a worker does after one unit of work on an instance.
type next int

const (
	// nextContinue: more work is due now; keep the lease and go on.
	nextContinue next = iota
	// nextYield: the instance is scheduled for later; release the lease.
	nextYield
	// nextDone: terminal; MarkTerminal released the lease.
	nextDone
	// nextDrop: the lease is lost, or the outcome is unknown (a failed
	// commit): touch nothing more.
	nextDrop
	// nextLeave: nothing can be done now (stuck, or woken early): keep the
	// lease until it expires, so the instance is not claimed in a hot loop.
	nextLeave
)

type stuckKey struct {
	id     uuid.UUID
	reason string
}

// work is one claimed instance in the hands of one worker.
type work struct {
	r    *Runner
	def  Definition
	inst Instance
	// id is inst.ID, for the heartbeat goroutine (the worker replaces inst
	// as it advances).
	id uuid.UUID
	// lease is the lease this claim holds.
	lease uuid.UUID
	// dbAt is the journal clock's time when the claim ran and localAt the
	// local time the claim returned: now() extrapolates between them.
	dbAt    time.Time
	localAt time.Time
	log     *slog.Logger
	// span is the current attempt's span (nil when tracing is off or no
	// attempt is under way): hook ends it with the attempt's outcome.
	span trace.Span
}

func (r *Runner) process(c claim) {
	w := r.newWork(c)
	if w == nil {
		return
	}
	leaseCtx, lose := context.WithCancelCause(r.baseCtx)
	defer lose(nil)
	hbDone := make(chan struct{})
	hbStopped := make(chan struct{})
	go func() {
		defer close(hbStopped)
		w.heartbeat(leaseCtx, lose, hbDone)
	}()
	defer func() {
		close(hbDone)
		<-hbStopped
	}()
	w.loop(leaseCtx)
	w.endSpan(OutcomeAborted, nil)
}

// newWork prepares a claimed instance for a worker, or reports it (nil)
// when it cannot be run here.
func (r *Runner) newWork(c claim) *work {
	inst := c.inst
	key := Key{Name: inst.SagaName, Version: inst.SagaVersion}
	log := r.log.With("saga_id", inst.ID, "saga", key.String())
	if !inst.LeaseID.Valid {
		log.Error("saga claim returned an instance without a lease: skipped")
		return nil
	}
	def, ok := r.registry.Lookup(inst.SagaName, inst.SagaVersion)
	if !ok {
		r.stuck(log, inst, fmt.Sprintf("definition %s is not registered in this process", key))
		return nil
	}
	w := &work{r: r, def: def, inst: inst, id: inst.ID, lease: inst.LeaseID.UUID, localAt: c.at, log: log}
	w.dbAt = c.at
	if inst.LeaseExpiresAt != nil {
		w.dbAt = inst.LeaseExpiresAt.Add(-r.cfg.LeaseDuration)
	}
	return w
}

// loop advances the instance under its lease (leaseCtx) until it yields,
// ends, or the runner stops.
func (w *work) loop(leaseCtx context.Context) {
	r := w.r
	for {
		if r.isStopping() {
			w.release(leaseCtx)
			return
		}
		var n next
		switch w.inst.Status {
		case StatusRunning:
			n = w.forward(leaseCtx)
		case StatusCompensating:
			n = w.compensate(leaseCtx)
		default:
			// Claimed in a status the runner does not advance (a journal
			// that claims more than it should): leave it alone, lease and
			// all, so that it is not claimed again at once.
			w.log.Warn("saga claimed in a status the runner does not advance", "status", w.inst.Status)
			n = nextLeave
		}
		switch n {
		case nextContinue:
			continue
		case nextYield:
			w.release(leaseCtx)
		}
		return
	}
}

// stuck reports an instance the runner cannot advance, once per reason per
// process in the log, every time to the hook.
func (r *Runner) stuck(log *slog.Logger, inst Instance, reason string) {
	if h := r.cfg.Hooks.OnStuck; h != nil {
		h(inst, reason)
	}
	k := stuckKey{id: inst.ID, reason: reason}
	r.stuckMu.Lock()
	_, seen := r.stuckSeen[k]
	if !seen {
		if len(r.stuckSeen) > 10000 {
			clear(r.stuckSeen)
		}
		r.stuckSeen[k] = struct{}{}
	}
	r.stuckMu.Unlock()
	if !seen {
		log.Warn("saga instance stuck: left alone", "reason", reason)
	}
}

// now is the journal's clock, extrapolated from the claim: the lease expiry
// the journal stamped minus the lease duration is its time at the claim.
// Deadlines and reply timeouts are judged on it, not on the local clock.
func (w *work) now() time.Time { return w.dbAt.Add(time.Since(w.localAt)) }

// heartbeat extends the lease every third of its duration until done. A
// refused heartbeat, or none accepted for a whole lease, loses the lease:
// lose cancels every context of the instance's work.
//
// It runs beside the worker, which replaces w.inst as the instance advances:
// it reads only w.id (not w.inst.ID) and fields that do not change.
func (w *work) heartbeat(ctx context.Context, lose context.CancelCauseFunc, done <-chan struct{}) {
	t := time.NewTicker(w.r.cfg.LeaseDuration / 3)
	defer t.Stop()
	last := w.localAt
	for {
		select {
		case <-done:
			return
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !w.beat(ctx, lose, &last) {
			return
		}
	}
}

// beat extends the lease once; last is when the lease was last known held.
// It reports false once the lease is lost (lose was called) or ctx ended.
func (w *work) beat(ctx context.Context, lose context.CancelCauseFunc, last *time.Time) bool {
	if ctx.Err() != nil {
		return false
	}
	d := w.r.cfg.LeaseDuration
	sent := time.Now()
	hctx, cancel := context.WithTimeout(ctx, d/3)
	ok, err := w.r.journal.Heartbeat(hctx, w.id, w.lease, d)
	cancel()
	switch {
	case err == nil && ok:
		*last = sent
	case err == nil:
		w.log.Warn("saga lease lost: heartbeat refused")
		lose(errLeaseGone)
		return false
	default:
		if ctx.Err() != nil {
			return false
		}
		w.r.throttle.Warn("heartbeat", "saga heartbeat failed", "err", err)
		if time.Since(*last) >= d {
			lose(errLeaseGone)
			return false
		}
	}
	return true
}

// release gives the lease back so that the instance's next attempt, or
// another runner, need not wait for it to expire. A journal with a Release
// method is asked to release; any other gets a heartbeat of one microsecond,
// which shortens the lease to "now" on its own clock within the Heartbeat
// contract (a journal that only ever extends leaves it to expire).
func (w *work) release(ctx context.Context) {
	if ctx.Err() != nil {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, w.r.cfg.LeaseDuration/3)
	defer cancel()
	var err error
	if rel, ok := w.r.journal.(leaseReleaser); ok {
		_, err = rel.Release(rctx, w.inst.ID, w.lease)
	} else {
		_, err = w.r.journal.Heartbeat(rctx, w.inst.ID, w.lease, time.Microsecond)
	}
	if err != nil {
		w.log.Warn("saga lease release failed: it will expire", "err", err)
	}
}

// leaseReleaser is implemented by journals that can give a lease back.
type leaseReleaser interface {
	Release(ctx context.Context, instanceID, leaseID uuid.UUID) (bool, error)
}

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
		// Not an attempt: the runner, not the step, gave up.
		w.hook(step, false, attempt, OutcomeAborted, false, took, err)
		return nextYield
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

// commit runs f with the transaction in its context, then commits. It returns
// nextDrop with the error when the lease is lost or the commit itself failed
// (its outcome is unknown), nextContinue with the error when f failed with
// anything else (rolled back).
func (w *work) commit(ctx context.Context, tx pgx.Tx, f func(jctx context.Context) error) (next, error) {
	if err := f(ContextWithTx(ctx, tx)); err != nil {
		rollback(tx)
		if errors.Is(err, ErrLeaseLost) || errors.Is(context.Cause(ctx), ErrLeaseLost) {
			return nextDrop, err
		}
		return nextContinue, err
	}
	if ctx.Err() != nil {
		// The heartbeat lost the lease meanwhile: never commit after that.
		rollback(tx)
		return nextDrop, errLeaseGone
	}
	if err := tx.Commit(ctx); err != nil {
		return nextDrop, fmt.Errorf("commit: %w", err)
	}
	return nextContinue, nil
}

// commitLazy is commit for a step's lazy transaction. When the step never
// used the database, f runs without a transaction in its context: the
// journal fences, writes and commits the entry in a transaction of its own
// (pgjournal: BEGIN with the locking read, COMMIT with the write).
func (w *work) commitLazy(ctx context.Context, tx *lazyTx, f func(jctx context.Context) error) (next, error) {
	if tx.tx != nil {
		return w.commit(ctx, tx.tx, f)
	}
	if tx.err != nil {
		return nextDrop, tx.err
	}
	if ctx.Err() != nil {
		// The heartbeat lost the lease: never write after that.
		return nextDrop, errLeaseGone
	}
	if err := f(ctx); err != nil {
		return ownCommitNext(err), err
	}
	return nextContinue, nil
}

// ownCommitNext classifies the error of a journal write that ran in the
// journal's own transaction. A refusal (the lease aside) or an error the
// server answered means nothing was committed: a failed attempt
// (nextContinue), as in the step's own transaction. Anything else (the
// connection, a cancelled context) either happened before anything was sent
// or leaves the COMMIT's outcome unknown: nextDrop, and the next claim
// finds out from the journal.
func ownCommitNext(err error) next {
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, ErrLeaseLost):
		return nextDrop
	case errors.Is(err, ErrInvalid), errors.Is(err, ErrNotFound), errors.As(err, &pgErr):
		return nextContinue
	}
	return nextDrop
}

// inTx runs journal writes in a transaction of their own.
func (w *work) inTx(ctx context.Context, f func(jctx context.Context) error) (next, error) {
	tx, err := w.r.pool.Begin(ctx)
	if err != nil {
		return nextDrop, fmt.Errorf("begin: %w", err)
	}
	return w.commit(ctx, tx, f)
}

// appendEnding appends ev and ends the instance in final, in the caller's
// transaction: in one fenced mutation when the journal can (TerminalAppender),
// else Append then MarkTerminal.
func (w *work) appendEnding(jctx context.Context, ev Event, final Status, reason string) error {
	if ta, ok := w.r.journal.(TerminalAppender); ok {
		_, err := ta.AppendTerminal(jctx, w.inst.ID, w.lease, ev, final, reason)
		return err
	}
	if _, err := w.r.journal.Append(jctx, w.inst.ID, w.lease, ev); err != nil {
		return err
	}
	return w.markTerminal(jctx, final, reason)
}

func (w *work) markTerminal(jctx context.Context, st Status, reason string) error {
	ok, err := w.r.journal.MarkTerminal(jctx, w.inst.ID, w.lease, st, reason)
	if err != nil {
		return err
	}
	if !ok {
		return errLeaseGone
	}
	return nil
}

func rollback(tx pgx.Tx) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = tx.Rollback(ctx)
}

// checkJSON refuses a state or output that is not JSON before the journal
// does: the step's author gets a message that names the step.
func checkJSON(x *StepTx) error {
	if len(x.State) > 0 && !json.Valid(x.State) {
		return Permanent(Errorf(ErrInvalid, "step %s left a State that is not valid JSON", x.StepName))
	}
	if len(x.Output) > 0 && !json.Valid(x.Output) {
		return Permanent(Errorf(ErrInvalid, "step %s left an Output that is not valid JSON", x.StepName))
	}
	return nil
}

// capToDeadline shortens a wait so that it ends no later than the saga's
// deadline: an instance waiting for a retry or a reply must be claimed again
// when its deadline passes, not after.
func (w *work) capToDeadline(d time.Duration) time.Duration {
	if w.inst.TimeoutAt == nil {
		return d
	}
	left := w.inst.TimeoutAt.Sub(w.now())
	return max(0, min(d, left))
}

// advanced applies the events the worker just committed to its copy of the
// projection, with the same Advance the journal applied, instead of reading
// the row back: a round trip saved per step. Should Advance refuse (the
// journal stored something else), the row is read back.
func (w *work) advanced(ctx context.Context, evs ...Event) next {
	inst := w.inst
	for _, ev := range evs {
		var cur *StepRecord
		if ev.Kind == EventStepCompensated {
			// Only the projection is used: any record the event may move.
			cur = &StepRecord{Sequence: inst.CurrentStep, Name: ev.StepName, Status: StepCompleted}
		}
		tr, err := Advance(inst, cur, ev, w.now())
		if err != nil {
			w.log.Warn("saga projection: local advance refused, reading it back", "kind", ev.Kind, "err", err)
			return w.reload(ctx)
		}
		inst = tr.Instance
	}
	w.inst = inst
	return nextContinue
}

// reload reads the projection back.
func (w *work) reload(ctx context.Context) next {
	inst, err := w.r.journal.Get(ctx, w.inst.ID)
	if err != nil {
		w.log.Error("saga reload after commit failed", "err", err)
		return nextYield
	}
	if !inst.LeaseID.Valid || inst.LeaseID.UUID != w.lease {
		return nextDrop
	}
	w.inst = inst
	if inst.Status.Terminal() {
		return nextDone
	}
	return nextContinue
}

func (w *work) hook(step Step, comp bool, attempt int, o Outcome, timedOut bool, took time.Duration, err error) {
	w.endSpan(o, err)
	h := w.r.cfg.Hooks.OnStep
	if h == nil {
		return
	}
	h(StepEvent{
		Saga: w.def.Key(), InstanceID: w.inst.ID, Step: w.inst.CurrentStep, StepName: step.Name,
		Compensation: comp, Attempt: attempt, Outcome: o, TimedOut: timedOut, Duration: took, Err: err,
	})
}

func (w *work) terminal(st Status, reason string) {
	w.log.Info("saga instance ended", "status", st, "reason", reason)
	if h := w.r.cfg.Hooks.OnTerminal; h != nil {
		h(TerminalEvent{Saga: w.def.Key(), InstanceID: w.inst.ID, Status: st, Reason: reason})
	}
}

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

// fail records a failed attempt of the current step (its writes are rolled
// back): another attempt after the backoff, or, for a permanent error or the
// last attempt, the start of compensation. reason marks an attempt that may
// have acted.
func (w *work) fail(ctx context.Context, step Step, attempt int, err error, reason string, took time.Duration) next {
	pol := step.Retry.WithDefaults(DefaultStepRetry)
	timedOut := reason == FailureTimeout || reason == FailureReplyTimeout
	msg := err.Error()
	ev := Event{Kind: EventStepFailed, Step: w.inst.CurrentStep, StepName: step.Name, Error: msg, Reason: reason}
	if !timedOut {
		if class := Classify(err); class.holds() {
			ev.Class = class
			ev.RetryIn = RoundDelay(w.capToDeadline(w.heldDelay(pol, err)))
			return w.hold(ctx, step, false, attempt, ev, err, took)
		}
	}
	if !IsPermanent(err) && attempt < pol.MaxAttempts {
		ev.RetryIn = pol.Delay(attempt)
		if d, ok := RetryAfterOf(err); ok && d > ev.RetryIn {
			ev.RetryIn = d // the service asked for at least this much
		}
		ev.RetryIn = RoundDelay(w.capToDeadline(ev.RetryIn))
		if _, cerr := w.inTx(ctx, func(jctx context.Context) error {
			_, err := w.r.journal.Append(jctx, w.inst.ID, w.lease, ev)
			return err
		}); cerr != nil {
			return w.lostOrBroken(step, false, attempt, took, cerr, "record a failed attempt")
		}
		w.hook(step, false, attempt, OutcomeRetry, timedOut, took, err)
		w.log.InfoContext(ctx, "saga step failed: retry scheduled", "step", step.Name, "attempt", attempt,
			"max_attempts", pol.MaxAttempts, "retry_in", ev.RetryIn, "err", msg)
		return nextYield
	}
	why := fmt.Sprintf("step %s failed after %d attempts: %s", step.Name, attempt, msg)
	if IsPermanent(err) {
		why = fmt.Sprintf("step %s failed permanently: %s", step.Name, msg)
	}
	w.hook(step, false, attempt, OutcomeFailed, timedOut, took, err)
	w.log.WarnContext(ctx, "saga step failed for good: compensating", "step", step.Name, "attempt", attempt, "err", msg)
	return w.startCompensation(ctx, &ev, why)
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
// may have acted: it committed, it committed a command (step_awaiting), or
// an attempt of it ran out of time or got a reply. command is the id of the
// last command the step sent, if any, for its compensation to cancel.
func (w *work) acted(ctx context.Context, i int) (acted bool, command uuid.UUID, err error) {
	hist, err := w.r.journal.Load(ctx, w.inst.ID)
	if err != nil {
		return false, uuid.Nil, err
	}
	for _, e := range hist {
		if e.Step != i {
			continue
		}
		switch e.Kind {
		case EventStepAwaiting:
			acted, command = true, e.CorrelationID
		case EventStepCompleted, EventReplyReceived:
			acted = true
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
	pol := step.CompensationRetry.WithDefaults(DefaultCompensationRetry)
	msg := err.Error()
	ev := Event{Kind: EventCompensationFailed, Step: w.inst.CurrentStep, StepName: step.Name, Error: msg}
	if class := Classify(err); class.holds() && !timedOut {
		ev.Class = class
		ev.RetryIn = RoundDelay(w.heldDelay(pol, err))
		return w.hold(ctx, step, true, attempt, ev, err, took)
	}
	if !IsPermanent(err) && attempt < pol.MaxAttempts {
		ev.RetryIn = pol.Delay(attempt)
		if d, ok := RetryAfterOf(err); ok && d > ev.RetryIn {
			ev.RetryIn = d
		}
		ev.RetryIn = RoundDelay(ev.RetryIn)
		if _, cerr := w.inTx(ctx, func(jctx context.Context) error {
			_, err := w.r.journal.Append(jctx, w.inst.ID, w.lease, ev)
			return err
		}); cerr != nil {
			return w.lostOrBroken(step, true, attempt, took, cerr, "record a failed compensation")
		}
		w.hook(step, true, attempt, OutcomeRetry, timedOut, took, err)
		w.log.WarnContext(ctx, "saga compensation failed: retry scheduled", "step", step.Name, "attempt", attempt,
			"max_attempts", pol.MaxAttempts, "retry_in", ev.RetryIn, "err", msg)
		return nextYield
	}
	why := fmt.Sprintf("compensation of step %s failed after %d attempts: %s", step.Name, attempt, msg)
	if IsPermanent(err) {
		why = fmt.Sprintf("compensation of step %s failed permanently: %s", step.Name, msg)
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
