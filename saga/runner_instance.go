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
