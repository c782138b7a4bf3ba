package saga

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Group commit: while a backlog exists, a worker that holds several claimed
// instances runs one step of each in ONE transaction, each step inside its
// own SAVEPOINT, so that one commit (one WAL flush, one BEGIN and COMMIT)
// serves several steps. Every promise of a single step holds per instance:
// its step's writes, its outbox rows and its journal entry are released into
// the transaction together or rolled back together (ROLLBACK TO SAVEPOINT),
// and its journal write is fenced by its own lease. A step that fails, or
// whose lease is lost, rolls back to its savepoint only; its batch-mates
// commit. The failure is recorded after the commit, in a transaction of its
// own, as the single-instance path records it.

// member is one instance of a group.
type member struct {
	w      *work
	ctx    context.Context // the lease's context
	lose   context.CancelCauseFunc
	hbDone chan struct{}
	hbStop chan struct{}
	// The round's outcome, applied after the group's commit.
	ev        Event
	last      bool
	step      Step
	attempt   int
	began     time.Time
	failed    error // Do's error: a failed attempt, recorded after the commit
	cause     error
	timedOut  bool
	writeErr  error // the journal refused the entry (not a lost lease)
	committed bool
}

// groupable reports whether the next unit of work of w is a plain attempt of
// a forward step, which is all a group runs: waits, replies, deadlines and
// compensations take the single-instance path.
func (w *work) groupable() (Step, bool) {
	inst := &w.inst
	i := inst.CurrentStep
	if inst.Status != StatusRunning || i < 0 || i >= len(w.def.Steps) {
		return Step{}, false
	}
	if inst.TimeoutAt != nil && !w.now().Before(*inst.TimeoutAt) {
		return Step{}, false
	}
	if len(inst.Reply) > 0 || inst.AwaitingCorrelationID.Valid {
		return Step{}, false
	}
	step := w.def.Steps[i]
	return step, !step.awaitsReply()
}

// processGroup advances the claimed instances of cs, a round of one step
// each per transaction, for as long as at least two of them have a plain
// step to run; the others, and what is left, go the single-instance way.
func (r *Runner) processGroup(cs []claim) {
	var ms []*member
	for _, c := range cs {
		w := r.newWork(c)
		if w == nil {
			continue
		}
		m := &member{w: w, hbDone: make(chan struct{}), hbStop: make(chan struct{})}
		m.ctx, m.lose = context.WithCancelCause(r.baseCtx)
		go func() {
			defer close(m.hbStop)
			w.heartbeat(m.ctx, m.lose, m.hbDone)
		}()
		ms = append(ms, m)
	}
	defer func() {
		for _, m := range ms {
			close(m.hbDone)
			<-m.hbStop
			m.lose(nil)
		}
	}()
	active := ms
	for len(active) > 1 && !r.isStopping() {
		var round, alone []*member
		for _, m := range active {
			if _, ok := m.w.groupable(); ok {
				round = append(round, m)
			} else {
				alone = append(alone, m)
			}
		}
		for _, m := range alone {
			m.w.loop(m.ctx)
		}
		if len(round) < 2 {
			active = round
			break
		}
		active = r.groupRound(round)
	}
	for _, m := range active {
		m.w.loop(m.ctx)
	}
}

// groupRound runs one step of each member in one transaction and returns
// the members that go on (nextContinue).
func (r *Runner) groupRound(round []*member) []*member {
	// Under baseCtx, as a single step's commit is: a hard stop cancels the
	// steps (their Do), which then roll back to their savepoints and are
	// released, while the steps that finished still commit.
	ctx := r.baseCtx
	tx, err := r.pool.Begin(ctx)
	if err != nil {
		r.log.Error("saga group: begin transaction", "err", err)
		return nil // leases expire; the instances are claimed again
	}
	for _, m := range round {
		r.groupStep(ctx, tx, m)
	}
	commitErr := tx.Commit(ctx)
	var goOn []*member
	for _, m := range round {
		w := m.w
		took := time.Since(m.began)
		var n next
		switch {
		case m.failed != nil:
			n = w.afterFailedAttempt(m.ctx, m.step, m.attempt, m.failed, m.cause, m.timedOut, "", took)
		case m.writeErr != nil:
			n = w.afterFailedCommit(m.ctx, m.step, m.attempt, m.writeErr, nextContinue, "", took)
		case !m.committed:
			n = nextDrop // its lease was lost: rolled back to its savepoint
		case commitErr != nil:
			w.log.Error("saga group commit failed: outcome unknown, left to the next claim", "step", m.step.Name, "err", commitErr)
			n = nextDrop
		default:
			w.hook(m.step, false, m.attempt, OutcomeCompleted, false, took, nil)
			if m.last {
				w.terminal(StatusCompleted, "")
				n = nextDone
			} else {
				n = w.advanced(m.ctx, m.ev)
			}
		}
		switch n {
		case nextContinue:
			goOn = append(goOn, m)
		case nextYield:
			w.release(m.ctx)
		}
	}
	return goOn
}

// groupStep runs one attempt of m's current step inside its own savepoint of
// tx and releases the savepoint when the step and its journal entry
// succeeded; otherwise it rolls back to the savepoint and notes why.
func (r *Runner) groupStep(ctx context.Context, tx pgx.Tx, m *member) {
	w := m.w
	step, _ := w.groupable()
	m.step, m.attempt, m.began = step, w.inst.Attempt+1, time.Now()
	m.failed, m.writeErr, m.committed = nil, nil, false
	sp, err := tx.Begin(ctx) // SAVEPOINT
	if err != nil {
		m.writeErr = fmt.Errorf("savepoint: %w", err)
		return
	}
	x := w.stepTx(sp, step, m.attempt)
	sctx, cancel := w.forwardCtx(m.ctx, step.Timeout)
	err = w.call(func() error { return step.Do(sctx, x) })
	m.cause = context.Cause(sctx)
	m.timedOut = sctx.Err() != nil && errors.Is(m.cause, errStepTimeout)
	cancel()
	x.closed = true
	if err == nil {
		err = checkJSON(x)
	}
	if err != nil {
		rollback(sp)
		m.failed = err
		return
	}
	m.last = w.inst.CurrentStep == len(w.def.Steps)-1
	m.ev = Event{Kind: EventStepCompleted, Step: w.inst.CurrentStep, StepName: step.Name, State: x.State, Output: x.Output}
	jctx := ContextWithTx(m.ctx, sp)
	if m.last {
		err = w.appendEnding(jctx, m.ev, StatusCompleted, "")
	} else {
		_, err = r.journal.Append(jctx, w.inst.ID, w.lease, m.ev)
	}
	if err == nil && m.ctx.Err() != nil {
		err = errLeaseGone // the heartbeat lost the lease meanwhile
	}
	if err != nil {
		rollback(sp)
		if errors.Is(err, ErrLeaseLost) || errors.Is(context.Cause(m.ctx), ErrLeaseLost) {
			w.hook(step, false, m.attempt, OutcomeLeaseLost, false, time.Since(m.began), err)
			w.log.Warn("saga step rolled back to its savepoint: lease lost", "step", step.Name, "attempt", m.attempt)
			return
		}
		m.writeErr = err
		return
	}
	if err := sp.Commit(ctx); err != nil { // RELEASE SAVEPOINT
		m.writeErr = fmt.Errorf("release savepoint: %w", err)
		return
	}
	m.committed = true
}
