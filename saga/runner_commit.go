package saga

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Committing a unit of work: the step's transaction with its journal
// events, the ending of an instance, and the hooks that report them.

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
