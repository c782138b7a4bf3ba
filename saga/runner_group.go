package saga

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Group commit: when a claim brings more instances than there are idle
// workers, a worker that holds several claimed instances runs one step of
// each in ONE transaction, each step inside its own SAVEPOINT, so that one
// commit (one WAL flush, one BEGIN and COMMIT) serves several steps. Every promise of a single step holds per instance:
// its step's writes, its outbox rows and its journal entry are released into
// the transaction together or rolled back together (ROLLBACK TO SAVEPOINT),
// and its journal write is fenced by its own lease. A step that fails, or
// whose lease is lost, rolls back to its savepoint only; its batch-mates
// commit. The failure is recorded after the commit, in a transaction of its
// own, as the single-instance path records it.

// member is one instance of a group.
type member struct {
	w    *work
	ctx  context.Context // the lease's context
	lose context.CancelCauseFunc
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
	committed bool  // its entry was written by AppendGroup
	// savepointed: its step and entry were written in its savepoint,
	// released into the round's transaction (committed with it).
	savepointed bool
	// broken: the round's transaction broke under it, not by its doing.
	broken bool
	// solo: the member's last round failed as a whole; it leaves the group
	// and runs alone, so that one bad entry cannot fail every round.
	solo bool
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
	if len(inst.Reply) > 0 || inst.AwaitingCorrelationID.Valid || inst.AwaitingUntil != nil {
		return Step{}, false
	}
	step := w.def.Steps[i]
	return step, !step.awaitsReply() && step.Rate == nil
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
		m := &member{w: w}
		m.ctx, m.lose = context.WithCancelCause(r.baseCtx)
		ms = append(ms, m)
	}
	hbDone, hbStopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(hbStopped)
		r.groupHeartbeat(ms, hbDone)
	}()
	defer func() {
		close(hbDone)
		<-hbStopped
		for _, m := range ms {
			m.lose(nil)
		}
	}()
	// What a claim found open is recorded first, member by member (a
	// claim rarely finds one).
	var active []*member
	for _, m := range ms {
		if !m.w.recordInterruption(m.ctx) {
			m.lose(nil)
			continue
		}
		active = append(active, m)
	}
	for len(active) > 1 && !r.isStopping() {
		var round, alone []*member
		for _, m := range active {
			if _, ok := m.w.groupable(); ok && !m.solo {
				round = append(round, m)
			} else {
				alone = append(alone, m)
			}
		}
		for _, m := range alone {
			m.w.loop(m.ctx)
			m.lose(nil) // done with it: the group's heartbeat skips it
		}
		if len(round) < 2 {
			active = round
			break
		}
		active = r.groupRound(round)
	}
	for _, m := range active {
		m.w.loop(m.ctx)
		m.lose(nil)
	}
}

// groupHeartbeat keeps the leases of a group's members with one statement
// per beat when the journal can (GroupHeartbeater), else one member after
// the other, on one connection at a time either way: a heartbeat per member
// on a connection of its own would hold up to Workers × GroupCommit
// connections. The group statement skips the rows its own round holds
// locked (no claimer can take those meanwhile) instead of waiting for the
// round to commit, so that one slow round does not starve the others'
// leases.
func (r *Runner) groupHeartbeat(ms []*member, done <-chan struct{}) {
	d := r.cfg.LeaseDuration
	t := time.NewTicker(d / 3)
	defer t.Stop()
	last := make([]time.Time, len(ms))
	for i, m := range ms {
		last[i] = m.w.localAt
	}
	gh, _ := r.journal.(GroupHeartbeater)
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		if gh == nil {
			for i, m := range ms {
				select {
				case <-done:
					return
				default:
				}
				m.w.beat(m.ctx, m.lose, &last[i])
			}
			continue
		}
		var live []int
		var leases []LeaseRef
		for i, m := range ms {
			if m.ctx.Err() == nil {
				live = append(live, i)
				leases = append(leases, LeaseRef{InstanceID: m.w.id, LeaseID: m.w.lease})
			}
		}
		if len(live) == 0 {
			continue
		}
		sent := time.Now()
		hctx, cancel := context.WithTimeout(r.baseCtx, d/3)
		states, err := gh.HeartbeatGroup(hctx, leases, d)
		cancel()
		for k, i := range live {
			m := ms[i]
			switch {
			case err != nil:
				r.throttle.Warn("heartbeat", "saga heartbeat failed", "err", err)
				if time.Since(last[i]) >= d {
					m.lose(errLeaseGone)
				}
			case states[k] == LeaseExtended:
				last[i] = sent
			case states[k] == LeaseBusy:
				// Locked by this group's round (or briefly by another
				// writer): held, not extended.
			default:
				m.w.log.Warn("saga lease lost: heartbeat refused")
				m.lose(errLeaseGone)
			}
		}
	}
}

// groupRound runs one step of each member in one transaction and returns
// the members that go on (nextContinue).
//
// The transaction is lazy, as a single step's is: it begins when a member's
// Do first uses the database, and that member's work then runs inside a
// savepoint of it (created on that first use, released once its journal
// entry is written). The entries of the members that wrote nothing of their
// own go to the journal together at the end (GroupAppender): with none of
// the members using the database, the whole round is the journal's two round
// trips, BEGIN with the locking read of every member, COMMIT with their
// writes, and one WAL flush for all of them.
func (r *Runner) groupRound(round []*member) []*member {
	// Under baseCtx, as a single step's commit is: a hard stop cancels the
	// steps (their Do), which then roll back to their savepoints and are
	// released, while the steps that finished still commit.
	ctx := r.baseCtx
	tx := &lazyTx{begin: r.pool.Begin}
	ga, _ := r.journal.(GroupAppender)
	var pending []*member
	for _, m := range round {
		if r.groupStep(ctx, tx, m, ga != nil) {
			if m.ctx.Err() != nil {
				// The heartbeat lost the lease meanwhile: never write.
				m.w.hook(m.step, false, m.attempt, OutcomeLeaseLost, false, time.Since(m.began), errLeaseGone)
				continue
			}
			pending = append(pending, m)
		}
	}
	var groupErr error
	if len(pending) > 0 {
		entries := make([]GroupEntry, len(pending))
		for i, m := range pending {
			entries[i] = GroupEntry{InstanceID: m.w.id, LeaseID: m.w.lease, Event: m.ev}
			if m.last {
				entries[i].Final = StatusCompleted
			}
		}
		jctx := ctx
		if tx.tx != nil {
			jctx = ContextWithTx(ctx, tx.tx)
		}
		groupErr = ga.AppendGroup(jctx, entries)
		for i, m := range pending {
			switch err := entries[i].Err; {
			case groupErr != nil:
			case err == nil:
				m.committed = true
			case errors.Is(err, ErrLeaseLost):
				m.w.hook(m.step, false, m.attempt, OutcomeLeaseLost, false, time.Since(m.began), err)
				m.w.log.Warn("saga step not written: lease lost", "step", m.step.Name, "attempt", m.attempt)
			default:
				m.writeErr = err
			}
		}
	}
	// Whether the round's failure left anything committed: known (nothing
	// was, the members run alone from a fresh read) or unknown (the COMMIT
	// was sent, the answer lost: left to the next claim, as a single step's).
	var roundErr error
	unknown := false
	switch {
	case tx.tx == nil:
		// Nothing began: the journal committed the entries itself.
		roundErr = groupErr
		unknown = groupErr != nil && ownCommitNext(groupErr) == nextDrop
	case groupErr != nil:
		tx.rollback()
		roundErr = groupErr
	default:
		if err := tx.tx.Commit(ctx); err != nil {
			roundErr = fmt.Errorf("commit: %w", err)
			var pgErr *pgconn.PgError
			unknown = !errors.As(err, &pgErr)
		}
	}
	if roundErr != nil {
		r.log.Error("saga group: the round failed: its members run alone next", "instances", len(round), "outcome_unknown", unknown, "err", roundErr)
	}
	var goOn []*member
	for _, m := range round {
		w := m.w
		took := time.Since(m.began)
		var n next
		written := m.committed || m.savepointed
		switch {
		case m.broken:
			// The round's transaction broke under it (not its own doing):
			// no attempt counted; it runs alone, from a fresh read.
			m.solo = true
			n = w.reload(m.ctx)
		case m.failed != nil:
			n = w.afterFailedAttempt(m.ctx, m.step, m.attempt, m.failed, m.cause, m.timedOut, "", took)
		case roundErr != nil && unknown && written:
			w.log.Error("saga group commit failed: outcome unknown, left to the next claim", "step", m.step.Name, "err", roundErr)
			n = nextDrop
		case roundErr != nil && m.writeErr == nil:
			// Nothing of the round committed: the member runs its step
			// alone, from a fresh read of its instance, so that one bad
			// entry cannot fail every round it is in.
			m.solo = true
			n = w.reload(m.ctx)
		case m.writeErr != nil:
			n = w.afterFailedCommit(m.ctx, m.step, m.attempt, m.writeErr, nextContinue, "", took)
		case !written:
			n = nextDrop // its lease was lost: nothing of it was written
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
			continue
		case nextYield:
			w.release(m.ctx)
		case nextAbandon:
			w.releaseOpen(m.ctx)
		}
		m.lose(nil) // done with it: the group's heartbeat skips it
	}
	return goOn
}

// groupStep runs one attempt of m's current step. Its Do sees a lazy
// savepoint of the group's transaction: when Do used the database (or
// toJournal is false), the step's journal entry is written inside that
// savepoint and the savepoint released, or rolled back when anything failed.
// When Do wrote nothing and toJournal is true, groupStep reports true: the
// entry goes to the journal with the group's (groupRound).
func (r *Runner) groupStep(ctx context.Context, tx *lazyTx, m *member, toJournal bool) bool {
	w := m.w
	step, _ := w.groupable()
	m.step, m.attempt, m.began = step, w.inst.Attempt+1, time.Now()
	m.failed, m.writeErr, m.committed, m.savepointed, m.broken = nil, nil, false, false, false
	// The savepoint is begun under the group's context: Do's own context
	// ends with the attempt.
	sp := &lazyTx{begin: func(context.Context) (pgx.Tx, error) { return tx.Begin(ctx) }}
	x := w.stepTx(sp, step, m.attempt)
	sctx, cancel := w.forwardCtx(m.ctx, step.Timeout)
	err := w.call(func() error { return step.Do(sctx, x) })
	m.cause = context.Cause(sctx)
	m.timedOut = sctx.Err() != nil && errors.Is(m.cause, errStepTimeout)
	ownEnd := sctx.Err() != nil
	cancel()
	x.closed = true
	if sp.err != nil && !ownEnd {
		// Its SAVEPOINT (or the group's BEGIN) failed: the round's
		// transaction is broken, by an earlier member's cancelled
		// statement or the connection. Not this step's failure.
		m.broken = true
		return false
	}
	if err == nil {
		err = checkJSON(x)
	}
	if err == nil && sp.err != nil {
		err = sp.err // Do swallowed the failed SAVEPOINT
	}
	if err != nil {
		sp.rollback()
		m.failed = err
		return false
	}
	m.last = w.inst.CurrentStep == len(w.def.Steps)-1
	m.ev = Event{Kind: EventStepCompleted, Step: w.inst.CurrentStep, StepName: step.Name, State: x.State, Output: x.Output}
	if sp.tx == nil && toJournal {
		return true
	}
	if _, err := sp.get(ctx); err != nil {
		m.broken = true
		return false
	}
	jctx := ContextWithTx(m.ctx, sp.tx)
	if m.last {
		err = w.appendEnding(jctx, m.ev, StatusCompleted, "")
	} else {
		_, err = r.journal.Append(jctx, w.inst.ID, w.lease, m.ev)
	}
	if err == nil && m.ctx.Err() != nil {
		err = errLeaseGone // the heartbeat lost the lease meanwhile
	}
	if err != nil {
		sp.rollback()
		if errors.Is(err, ErrLeaseLost) || errors.Is(context.Cause(m.ctx), ErrLeaseLost) {
			w.hook(step, false, m.attempt, OutcomeLeaseLost, false, time.Since(m.began), err)
			w.log.Warn("saga step rolled back to its savepoint: lease lost", "step", step.Name, "attempt", m.attempt)
			return false
		}
		m.writeErr = err
		return false
	}
	if err := sp.tx.Commit(ctx); err != nil { // RELEASE SAVEPOINT
		m.broken = true
		return false
	}
	m.savepointed = true
	return false
}
