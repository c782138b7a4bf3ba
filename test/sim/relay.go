package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/compensa/compensa/saga"
)

// relay is a simulated relay's step runner: its memory is the work in hand
// (lost on a crash) and nothing else.
type relay struct {
	id          int
	down        int
	pausedUntil time.Time
	// resumed is set by a pause: the first turn after it commits what was
	// prepared before the heartbeat can say the lease is gone, as a process
	// stopped in the middle of its step does.
	resumed bool
	works   []*work
}

// work is one claimed instance: the runner's work struct.
type work struct {
	inst    saga.Instance
	lease   uuid.UUID
	def     *sagaDef
	pending *pendingTx
}

// next mirrors the runner's: what a relay does after one unit of work.
type next int

const (
	nextContinue next = iota
	nextYield
	nextDone
	nextDrop
	nextLeave
)

// pendingTx is a prepared transaction: journal writes, then (only if all
// of them succeeded) the participant effects; after decides what follows,
// possibly another transaction (a failed commit becomes a failed attempt).
type pendingTx struct {
	what    string
	writes  func() error
	effects []effect
	after   func(err error) (next, *pendingTx)
}

var errLeaseGone = saga.Errorf(saga.ErrLeaseLost, "the instance's lease was lost: another worker may hold it")

func (w *world) relayTurn(r *relay) {
	if r.down > 0 || r.pausedUntil.After(w.now) {
		return
	}
	if r.resumed {
		r.resumed = false
		if len(r.works) > 0 && r.works[0].pending != nil {
			w.logf("relay %d resumes after a pause and commits", r.id)
			w.commitHead(r)
			return
		}
	}
	// The heartbeat: a lease it cannot extend cancels the work, and what
	// was prepared under it is rolled back.
	kept := r.works[:0]
	for _, wk := range r.works {
		ok, err := w.j.Heartbeat(ctx, wk.inst.ID, wk.lease, leaseDuration)
		if err != nil || !ok {
			w.logf("relay %d lost %s lease %s: work dropped", r.id, w.name(wk.inst.ID), w.leaseName(wk.lease))
			continue
		}
		kept = append(kept, wk)
	}
	r.works = kept
	if len(r.works) == 0 {
		w.claim(r)
		return
	}
	wk := r.works[0]
	if wk.pending != nil {
		w.commitHead(r)
		return
	}
	tx, n := w.prepare(r, wk)
	if tx != nil {
		wk.pending = tx
		return
	}
	w.settle(r, wk, n)
}

func (w *world) claim(r *relay) {
	// The projection as it stood before the claim, to check the claim
	// against saga.Claimable and against the leases other relays hold.
	before := map[uuid.UUID]saga.Instance{}
	for _, id := range w.instances {
		if w.settled[id] {
			continue
		}
		if inst, err := w.mem.Get(ctx, id); err == nil {
			before[id] = inst
			// Nothing in the simulation restarts a COMPLETED or
			// COMPENSATED instance: it need not be read again.
			w.settled[id] = inst.Status == saga.StatusCompleted || inst.Status == saga.StatusCompensated
		}
	}
	insts, err := w.j.ClaimPending(ctx, claimBatch, leaseDuration)
	if err != nil {
		w.violate("relay %d: claim failed: %v", r.id, err)
		return
	}
	for _, inst := range insts {
		prev, ok := before[inst.ID]
		if !ok {
			w.violate("relay %d claimed %s, which had ended", r.id, w.name(inst.ID))
		}
		if !saga.Claimable(&prev, w.now) {
			w.violate("relay %d claimed %s, which was not claimable (%s, due %s, lease until %v)", r.id, w.name(inst.ID), prev.Status, prev.NextAttemptAt.Sub(w.start), prev.LeaseExpiresAt)
		}
		for _, other := range w.relays {
			for _, wk := range other.works {
				if wk.inst.ID == inst.ID && saga.HoldsLease(prev, wk.lease, w.now) {
					w.violate("relay %d claimed %s while relay %d still held its lease %s", r.id, w.name(inst.ID), other.id, w.leaseName(wk.lease))
				}
			}
		}
		d := w.def(inst.SagaName)
		left := ""
		if inst.InterruptedStep != nil {
			left = fmt.Sprintf(", step %d left open", *inst.InterruptedStep)
		}
		w.logf("relay %d claimed %s (%s step %d%s) lease %s", r.id, w.name(inst.ID), inst.Status, inst.CurrentStep, left, w.leaseName(inst.LeaseID.UUID))
		r.works = append(r.works, &work{inst: inst, lease: inst.LeaseID.UUID, def: d})
	}
}

// commitHead commits the head work's prepared transaction, with a crash
// possible on either side of the commit.
func (w *world) commitHead(r *relay) {
	wk := r.works[0]
	tx := wk.pending
	wk.pending = nil
	if w.fault(fmt.Sprintf("relay %d crashed before commit", r.id), 0.01) {
		w.crash(r)
		return
	}
	err, crashed := w.commit(r, wk, tx)
	if crashed {
		w.crash(r)
		return
	}
	n, follow := tx.after(err)
	if w.fault(fmt.Sprintf("relay %d crashed after commit", r.id), 0.01) {
		w.crash(r)
		return
	}
	if follow != nil {
		wk.pending = follow
		return
	}
	w.settle(r, wk, n)
}

// commit runs tx as one transaction and checks the fence from outside: a
// transaction that commits under a lease that is not held is a violation,
// whatever the journal said.
func (w *world) commit(r *relay, wk *work, tx *pendingTx) (err error, crashed bool) {
	before, gerr := w.mem.Get(ctx, wk.inst.ID)
	held := gerr == nil && saga.HoldsLease(before, wk.lease, w.now)
	if w.cfg.Mutant == MutantLostJournalWrite && len(tx.effects) > 0 {
		// The planted bug: the effect commits alone, then the entry.
		w.record(r, tx)
		if w.fault(fmt.Sprintf("relay %d crashed between the effect and its journal entry", r.id), 0.1) {
			return nil, true
		}
		err = tx.writes()
	} else {
		err = tx.writes()
		if err == nil {
			w.record(r, tx)
		}
	}
	if err != nil {
		// A transaction that failed must have written nothing: memjournal
		// cannot roll back, so a refusal after a first write succeeded
		// would be a partial commit PostgreSQL never makes.
		if after, aerr := w.mem.Get(ctx, wk.inst.ID); gerr == nil && aerr == nil && after.Version != before.Version {
			w.violate("relay %d: %s for %s failed after writing (version %d to %d): a partial transaction", r.id, tx.what, w.name(wk.inst.ID), before.Version, after.Version)
		}
	}
	if err == nil && !held {
		w.violate("stale lease accepted: relay %d committed %s for %s under lease %s, which it no longer held", r.id, tx.what, w.name(wk.inst.ID), w.leaseName(wk.lease))
	}
	if errors.Is(err, saga.ErrLeaseLost) {
		w.stats.StaleRefused++
	}
	w.logf("relay %d commit %s %s lease %s: %s", r.id, w.name(wk.inst.ID), tx.what, w.leaseName(wk.lease), errText(err))
	return err, false
}

func (w *world) record(r *relay, tx *pendingTx) {
	for _, e := range tx.effects {
		e.relay = r.id
		w.ledger = append(w.ledger, e)
		w.logf("effect %s %s step %d attempt %d", e.kind, w.name(e.inst), e.step, e.attempt)
	}
}

// settle does what the runner's loop does with a unit's outcome.
func (w *world) settle(r *relay, wk *work, n next) {
	switch n {
	case nextContinue:
		return
	case nextYield:
		// Released as the runner releases with a journal that can (its
		// open step closed with the lease).
		if _, err := w.j.Release(ctx, wk.inst.ID, wk.lease); err != nil {
			w.logf("relay %d release %s: %v", r.id, w.name(wk.inst.ID), err)
		}
	}
	r.works = r.works[1:]
}

// prepare is one unit of the runner's loop: first the record of a step
// the claim found open (recordInterruption), then forward for a RUNNING
// instance, compensate for a COMPENSATING one.
func (w *world) prepare(r *relay, wk *work) (*pendingTx, next) {
	if tx := w.recordInterruption(wk); tx != nil {
		return tx, nextContinue
	}
	switch wk.inst.Status {
	case saga.StatusRunning:
		return w.forward(r, wk)
	case saga.StatusCompensating:
		return w.compensate(r, wk)
	}
	return nil, nextLeave
}

// recordInterruption mirrors work.recordInterruption: step_interrupted for
// the step the claim found open, in a transaction of its own before
// anything else. Nil when there is nothing to record.
func (w *world) recordInterruption(wk *work) *pendingTx {
	k := wk.inst.InterruptedStep
	if k == nil {
		return nil
	}
	if *k < 0 || *k >= len(wk.def.steps) || w.cfg.Mutant == MutantForgetInterrupted {
		wk.inst.InterruptedStep = nil
		return nil
	}
	ev := saga.Event{Kind: saga.EventStepInterrupted, Step: *k, StepName: wk.def.steps[*k].name, Reason: saga.ReasonInterrupted}
	tx := &pendingTx{what: fmt.Sprintf("step_interrupted at %d", *k)}
	tx.writes = func() error {
		_, err := w.j.Append(ctx, wk.inst.ID, wk.lease, ev)
		return err
	}
	tx.after = func(err error) (next, *pendingTx) {
		switch {
		case err == nil:
			return w.advanced(wk, ev), nil
		case errors.Is(err, saga.ErrInvalid):
			// The runner logs it and goes on; here it is a bug.
			w.violate("%s: the step the claim found open (%d) could not be recorded: %v", w.name(wk.inst.ID), *k, err)
			wk.inst.InterruptedStep = nil
			return nextContinue, nil
		}
		return nextDrop, nil
	}
	return tx
}

// forward mirrors work.forward: a reply, a reply timeout, or one attempt.
func (w *world) forward(r *relay, wk *work) (*pendingTx, next) {
	inst := &wk.inst
	i := inst.CurrentStep
	if i < 0 || i >= len(wk.def.steps) {
		w.violate("%s: current step %d is outside the %d steps of %s", w.name(inst.ID), i, len(wk.def.steps), wk.def.name)
		return nil, nextLeave
	}
	step := wk.def.steps[i]
	switch {
	case len(inst.Reply) > 0:
		return w.consumeReply(wk, step)
	case inst.AwaitingCorrelationID.Valid:
		if inst.AwaitingUntil != nil && w.now.Before(*inst.AwaitingUntil) {
			return nil, nextLeave
		}
		err := fmt.Errorf("no reply to command %s within %s", w.cmdName(inst.AwaitingCorrelationID.UUID), replyTimeout)
		return w.fail(wk, step, inst.Attempt+1, err, saga.FailureReplyTimeout)
	}
	return w.runDo(r, wk, step)
}

// runDo is one attempt of the current step: its outcome is drawn.
func (w *world) runDo(r *relay, wk *work, step stepDef) (*pendingTx, next) {
	inst := &wk.inst
	i := inst.CurrentStep
	attempt := inst.Attempt + 1
	switch x := w.rng.IntN(100); {
	case x < 6:
		return w.fail(wk, step, attempt, errors.New("participant said no"), "")
	case x < 8:
		return w.fail(wk, step, attempt, saga.Permanent(errors.New("participant refused for good")), "")
	}
	if until, ok := w.revoked[wk.def.name+"."+step.name]; ok && w.now.Before(until) {
		// What a missing grant looks like to the runner: PostgreSQL's
		// error, which saga.Classify holds for an operator.
		err := &pgconn.PgError{Severity: "ERROR", Code: "42501", Message: "permission denied for table " + step.name}
		return w.fail(wk, step, attempt, err, "")
	}
	if w.fault(fmt.Sprintf("step %s of %s times out", step.name, w.name(inst.ID)), 0.03) {
		if w.rng.IntN(2) == 0 {
			// It acted before it was stopped: outside the transaction, so
			// no rollback removes it.
			w.ledger = append(w.ledger, effect{inst: inst.ID, step: i, kind: "acted", attempt: attempt, relay: r.id})
			w.logf("effect acted %s step %d attempt %d", w.name(inst.ID), i, attempt)
		}
		return w.fail(wk, step, attempt, errors.New("step timed out"), saga.FailureTimeout)
	}
	last := i == len(wk.def.steps)-1
	var ev saga.Event
	eff := effect{inst: inst.ID, step: i, kind: "do", attempt: attempt}
	if step.command {
		corr := w.newCommand(inst.ID, inst.TenantID)
		eff.corr = corr
		ev = saga.Event{Kind: saga.EventStepAwaiting, Step: i, StepName: step.name, CorrelationID: corr, AwaitFor: replyTimeout}
	} else {
		ev = saga.Event{Kind: saga.EventStepCompleted, Step: i, StepName: step.name, Output: json.RawMessage(fmt.Sprintf(`{"attempt":%d}`, attempt))}
	}
	ending := last && ev.Kind == saga.EventStepCompleted
	tx := &pendingTx{what: string(ev.Kind) + " " + step.name, effects: []effect{eff}}
	tx.writes = func() error {
		if ending {
			_, err := w.j.AppendTerminal(ctx, inst.ID, wk.lease, ev, saga.StatusCompleted, "")
			return err
		}
		_, err := w.j.Append(ctx, inst.ID, wk.lease, ev)
		return err
	}
	tx.after = func(err error) (next, *pendingTx) {
		if err != nil {
			return w.afterFailedCommit(wk, step, attempt, err, "")
		}
		switch {
		case ev.Kind == saga.EventStepAwaiting:
			w.commandCommitted(ev.CorrelationID, inst.TenantID)
			return nextYield, nil
		case ending:
			return nextDone, nil
		}
		return w.advanced(wk, ev), nil
	}
	return tx, nextContinue
}

// afterFailedCommit mirrors the runner's: a lost lease drops the work; a
// refusal of the entry is a permanent failure of the attempt.
func (w *world) afterFailedCommit(wk *work, step stepDef, attempt int, err error, reason string) (next, *pendingTx) {
	if errors.Is(err, saga.ErrLeaseLost) {
		return nextDrop, nil
	}
	if errors.Is(err, saga.ErrInvalid) {
		err = saga.Permanent(err)
	}
	tx, n := w.fail(wk, step, attempt, err, reason)
	return n, tx
}

// fail mirrors work.fail and retryOrHold (without holds): a retry after
// the policy's delay, or the start of compensation.
func (w *world) fail(wk *work, step stepDef, attempt int, err error, reason string) (*pendingTx, next) {
	inst := &wk.inst
	ev := saga.Event{Kind: saga.EventStepFailed, Step: inst.CurrentStep, StepName: step.name, Error: err.Error(), Reason: reason}
	timedOut := reason == saga.FailureTimeout || reason == saga.FailureReplyTimeout
	if class := saga.Classify(err); (class == saga.ClassOperator || class == saga.ClassTransient) && !timedOut && w.cfg.Mutant != MutantNoErrorClasses {
		// The runner's hold: no attempt counted, retried after a delay
		// that grows with the hold (heldDelay, without its jitter), never
		// compensated.
		ev.Class = class
		held := time.Duration(0)
		if inst.HeldSince != nil {
			held = w.now.Sub(*inst.HeldSince)
		}
		ev.RetryIn = saga.RoundDelay(min(max(held, stepRetry.Base), stepRetry.Max))
		return w.journalOnly(wk, "step_failed (held) "+step.name, func() error {
			_, err := w.j.Append(ctx, inst.ID, wk.lease, ev)
			return err
		}, func() next { return nextYield }), nextContinue
	}
	if !saga.IsPermanent(err) && attempt < stepRetry.MaxAttempts {
		ev.RetryIn = saga.RoundDelay(stepRetry.Delay(attempt))
		return w.journalOnly(wk, "step_failed "+step.name, func() error {
			_, err := w.j.Append(ctx, inst.ID, wk.lease, ev)
			return err
		}, func() next { return nextYield }), nextContinue
	}
	why := fmt.Sprintf("step %s failed after %d attempts: %s", step.name, attempt, err)
	if saga.IsPermanent(err) {
		why = fmt.Sprintf("step %s failed permanently: %s", step.name, err)
	}
	return w.startCompensation(wk, &ev, why)
}

// mayHaveActed mirrors the runner's list of step_failed reasons that mark
// a step that may have acted.
func mayHaveActed(reason string) bool {
	switch reason {
	case saga.FailureTimeout, saga.FailureReplyTimeout, saga.FailureReplyError, saga.FailureMayHaveActed:
		return true
	}
	return false
}

// startCompensation mirrors work.startCompensation: step_failed and
// compensation_started in one transaction, from the newest step that
// completed or may have acted.
func (w *world) startCompensation(wk *work, failed *saga.Event, reason string) (*pendingTx, next) {
	inst := &wk.inst
	i := min(inst.CurrentStep, len(wk.def.steps)-1)
	start := i - 1
	if failed != nil && mayHaveActed(failed.Reason) {
		start = i
	} else if acted, _ := w.acted(wk, i); acted {
		start = i
	}
	ev := saga.Event{Kind: saga.EventCompensationStarted, Step: start, Reason: reason}
	if start >= 0 {
		ev.StepName = wk.def.steps[start].name
	}
	return w.journalOnly(wk, fmt.Sprintf("compensation_started at %d", start), func() error {
		if failed != nil {
			if _, err := w.j.Append(ctx, inst.ID, wk.lease, *failed); err != nil {
				return err
			}
		}
		if _, err := w.j.Append(ctx, inst.ID, wk.lease, ev); err != nil {
			return err
		}
		if start < 0 {
			return w.markTerminal(wk, saga.StatusCompensated, reason)
		}
		return nil
	}, func() next {
		if start < 0 {
			return nextDone
		}
		if failed != nil {
			return w.advanced(wk, *failed, ev)
		}
		return w.advanced(wk, ev)
	}), nextContinue
}

// journalOnly is a transaction without participant effects: a write that
// does not happen drops the work (the runner's lostOrBroken).
func (w *world) journalOnly(wk *work, what string, writes func() error, ok func() next) *pendingTx {
	return &pendingTx{what: what, writes: writes, after: func(err error) (next, *pendingTx) {
		if err != nil {
			return nextDrop, nil
		}
		return ok(), nil
	}}
}

func (w *world) markTerminal(wk *work, st saga.Status, reason string) error {
	ok, err := w.j.MarkTerminal(ctx, wk.inst.ID, wk.lease, st, reason)
	if err != nil {
		return err
	}
	if !ok {
		return errLeaseGone
	}
	return nil
}

// acted mirrors work.acted: from the history, whether step i completed or
// may have acted, and its last command.
func (w *world) acted(wk *work, i int) (bool, uuid.UUID) {
	if w.cfg.Mutant == MutantCompensateNeverRan {
		return true, uuid.Nil
	}
	hist, err := w.j.Load(ctx, wk.inst.ID)
	if err != nil {
		w.violate("%s: Load failed: %v", w.name(wk.inst.ID), err)
		return false, uuid.Nil
	}
	acted, cmd := false, uuid.Nil
	for _, e := range hist {
		if e.Kind == saga.EventRestarted && e.Step <= i {
			acted, cmd = false, uuid.Nil
			continue
		}
		if e.Step != i {
			continue
		}
		switch e.Kind {
		case saga.EventStepAwaiting:
			acted, cmd = true, e.CorrelationID
		case saga.EventStepCompleted, saga.EventReplyReceived, saga.EventStepInterrupted:
			acted = true
		case saga.EventStepSkipped:
			acted, cmd = false, uuid.Nil
		case saga.EventStepFailed:
			if mayHaveActed(e.Reason) {
				acted = true
			}
		}
	}
	return acted, cmd
}

// consumeReply mirrors work.consumeReply (no OnReply function: the reply
// becomes the step's output, and its effect is the participant's record
// that the reply was applied).
func (w *world) consumeReply(wk *work, step stepDef) (*pendingTx, next) {
	inst := &wk.inst
	attempt := inst.Attempt + 1
	rep := saga.ParseReply(inst.Reply)
	if !rep.OK {
		err := fmt.Errorf("reply: %s", rep.Error)
		if rep.Permanent {
			err = saga.Permanent(err)
		}
		return w.fail(wk, step, attempt, err, saga.FailureReplyError)
	}
	var body struct {
		Corr uuid.UUID `json:"corr"`
	}
	_ = json.Unmarshal(inst.Reply, &body)
	i := inst.CurrentStep
	last := i == len(wk.def.steps)-1
	ev := saga.Event{Kind: saga.EventStepCompleted, Step: i, StepName: step.name, Output: inst.Reply}
	tx := &pendingTx{what: "step_completed " + step.name + " (reply)", effects: []effect{{inst: inst.ID, step: i, kind: "reply", attempt: attempt, corr: body.Corr}}}
	tx.writes = func() error {
		if last {
			_, err := w.j.AppendTerminal(ctx, inst.ID, wk.lease, ev, saga.StatusCompleted, "")
			return err
		}
		_, err := w.j.Append(ctx, inst.ID, wk.lease, ev)
		return err
	}
	tx.after = func(err error) (next, *pendingTx) {
		if err != nil {
			return w.afterFailedCommit(wk, step, attempt, err, saga.FailureReplyError)
		}
		if last {
			return nextDone, nil
		}
		return w.advanced(wk, ev), nil
	}
	return tx, nextContinue
}

// compensate mirrors work.compensate: the end after step 0, a skip for a
// step that never acted or has nothing to undo, or one attempt of the
// current step's compensation.
func (w *world) compensate(r *relay, wk *work) (*pendingTx, next) {
	inst := &wk.inst
	i := inst.CurrentStep
	final := saga.StatusCompensated
	reason := inst.CompensationReason
	if i < 0 {
		return w.journalOnly(wk, "end "+string(final), func() error {
			return w.markTerminal(wk, final, reason)
		}, func() next { return nextDone }), nextContinue
	}
	step := wk.def.steps[i]
	last := i == 0
	if acted, _ := w.acted(wk, i); !acted || !step.compensates {
		why := "the step never acted"
		if acted {
			why = "the step has no Compensate"
		}
		ev := saga.Event{Kind: saga.EventCompensationSkipped, Step: i, StepName: step.name, Reason: why}
		return w.journalOnly(wk, "compensation_skipped "+step.name, func() error {
			return w.appendMaybeEnding(wk, ev, last, final, reason)
		}, func() next {
			if last {
				return nextDone
			}
			return w.advanced(wk, ev)
		}), nextContinue
	}
	attempt := inst.Attempt + 1
	if attempt <= 2 && w.fault(fmt.Sprintf("compensation of %s step %s fails", w.name(inst.ID), step.name), 0.2) {
		return w.compensationFailed(wk, step, attempt, errors.New("participant could not undo yet"))
	}
	if w.fault(fmt.Sprintf("compensation of %s step %s fails for good", w.name(inst.ID), step.name), 0.01) {
		// The instance ends FAILED, for a person: the operator's retry
		// (operatorTurn, quiesce) compensates again from this step.
		return w.compensationFailed(wk, step, attempt, saga.Permanent(errors.New("participant cannot undo")))
	}
	target := i
	if w.cfg.Mutant == MutantForwardCompensation {
		target = w.forwardTarget(wk, i)
	}
	ev := saga.Event{Kind: saga.EventStepCompensated, Step: i, StepName: step.name}
	tx := &pendingTx{what: "step_compensated " + step.name, effects: []effect{{inst: inst.ID, step: target, kind: "comp", attempt: attempt}}}
	tx.writes = func() error { return w.appendMaybeEnding(wk, ev, last, final, reason) }
	tx.after = func(err error) (next, *pendingTx) {
		switch {
		case err == nil && last:
			return nextDone, nil
		case err == nil:
			return w.advanced(wk, ev), nil
		case errors.Is(err, saga.ErrLeaseLost):
			return nextDrop, nil
		}
		tx, n := w.compensationFailed(wk, step, attempt, err)
		return n, tx
	}
	return tx, nextContinue
}

// forwardTarget is the planted bug's choice: the step mirrored over the
// saga's steps, so that the compensations run from the first step up.
func (w *world) forwardTarget(wk *work, i int) int {
	return len(wk.def.steps) - 1 - i
}

func (w *world) appendMaybeEnding(wk *work, ev saga.Event, last bool, final saga.Status, reason string) error {
	if last {
		_, err := w.j.AppendTerminal(ctx, wk.inst.ID, wk.lease, ev, final, reason)
		return err
	}
	_, err := w.j.Append(ctx, wk.inst.ID, wk.lease, ev)
	return err
}

// compensationFailed mirrors the runner's: another attempt after the
// compensation policy's delay, or the instance ends FAILED for a person.
func (w *world) compensationFailed(wk *work, step stepDef, attempt int, err error) (*pendingTx, next) {
	inst := &wk.inst
	ev := saga.Event{Kind: saga.EventCompensationFailed, Step: inst.CurrentStep, StepName: step.name, Error: err.Error()}
	if !saga.IsPermanent(err) && attempt < compRetry.MaxAttempts {
		ev.RetryIn = saga.RoundDelay(compRetry.Delay(attempt))
		return w.journalOnly(wk, "compensation_failed "+step.name, func() error {
			_, err := w.j.Append(ctx, inst.ID, wk.lease, ev)
			return err
		}, func() next { return nextYield }), nextContinue
	}
	why := fmt.Sprintf("compensation of step %s failed after %d attempts: %s", step.name, attempt, err)
	ev.Error = why
	return w.journalOnly(wk, "compensation_failed for good "+step.name, func() error {
		_, err := w.j.AppendTerminal(ctx, inst.ID, wk.lease, ev, saga.StatusFailed, why)
		return err
	}, func() next { return nextDone }), nextContinue
}

// advanced mirrors work.advanced: the committed events applied to the
// local projection by saga.Advance, or the row read back if it refuses.
func (w *world) advanced(wk *work, evs ...saga.Event) next {
	inst := wk.inst
	for _, ev := range evs {
		var cur *saga.StepRecord
		if ev.Kind == saga.EventStepCompensated {
			cur = &saga.StepRecord{Sequence: inst.CurrentStep, Name: ev.StepName, Status: saga.StepCompleted}
		}
		tr, err := saga.Advance(inst, cur, ev, w.now)
		if err != nil {
			w.logf("%s: local advance refused (%v): read back", w.name(inst.ID), err)
			return w.reload(wk)
		}
		inst = tr.Instance
	}
	wk.inst = inst
	return nextContinue
}

func (w *world) reload(wk *work) next {
	inst, err := w.j.Get(ctx, wk.inst.ID)
	if err != nil {
		return nextYield
	}
	if !inst.LeaseID.Valid || inst.LeaseID.UUID != wk.lease {
		return nextDrop
	}
	wk.inst = inst
	if inst.Status.Terminal() {
		return nextDone
	}
	return nextContinue
}
