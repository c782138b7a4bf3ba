package saga

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
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

// ReasonInterrupted is the Reason of the step_interrupted the runner
// appends for the step a claim found open (Instance.InterruptedStep).
const ReasonInterrupted = "the lease was lost while an attempt of the step may have been running: it may have acted"

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
	// nextAbandon: a hard stop cut an attempt short, and it may have acted
	// (a call out): give the lease back with the step left open, so that
	// the next claim records it (step_interrupted).
	nextAbandon
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
	if !w.recordInterruption(leaseCtx) {
		return
	}
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
		case nextAbandon:
			w.releaseOpen(leaseCtx)
		}
		return
	}
}

// recordInterruption appends step_interrupted for the step the claim found
// open (InterruptedStep), before anything else is done with the instance:
// the previous holder's attempt of it may have acted, and the open step is
// the only trace of that. It reports false when the worker must leave the
// instance (the lease lost, or the write's outcome unknown): the step stays
// open, and the next claim reports it again.
func (w *work) recordInterruption(ctx context.Context) bool {
	k := w.inst.InterruptedStep
	if k == nil {
		return true
	}
	w.inst.InterruptedStep = nil
	if *k < 0 || *k >= len(w.def.Steps) {
		// No step of this definition: nothing to compensate there. The
		// worker reports what it finds (forward, compensate); writing here
		// would add an event at every claim of an instance that is stuck.
		return true
	}
	ev := Event{Kind: EventStepInterrupted, Step: *k, StepName: w.def.Steps[*k].Name, Reason: ReasonInterrupted}
	_, err := w.r.journal.Append(ctx, w.inst.ID, w.lease, ev)
	switch {
	case err == nil:
	case errors.Is(err, ErrInvalid):
		// The journal refused what its own claim reported (while this
		// worker holds the lease, nothing else changes the open step): a
		// bug to report, not a reason to hold the instance, which would
		// not write the record either.
		w.log.Error("saga: the step the claim found open could not be recorded as interrupted", "step", ev.StepName, "err", err)
		return true
	case errors.Is(err, ErrLeaseLost):
		w.log.Warn("saga lease lost: could not record the interrupted step", "step", ev.StepName)
		return false
	default:
		w.log.Error("saga journal write failed: could not record the interrupted step; left to the next claim", "step", ev.StepName, "err", err)
		return false
	}
	w.log.Info("saga step interrupted: the lease of its previous holder was lost while an attempt of it may have been running; the step counts as one that may have acted", "step", ev.StepName)
	return w.advanced(ctx, ev) == nextContinue
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
