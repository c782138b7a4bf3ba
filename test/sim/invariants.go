package sim

import (
	"fmt"
	"strings"

	"github.com/google/uuid"

	"github.com/compensa/compensa/saga"
)

// The invariants every run checks once it is over. A stale lease's write
// is checked as it happens (world.commit), since only then is the lease's
// state known.

func (w *world) checkAll() {
	hist := map[uuid.UUID][]saga.RecordedEvent{}
	for _, id := range w.instances {
		evs, err := w.mem.Load(ctx, id)
		if err != nil {
			w.violate("%s: Load failed: %v", w.name(id), err)
			continue
		}
		hist[id] = evs
	}
	w.checkStartsOnce()
	w.checkNothingLost()
	w.checkEffectsOnce(hist)
	w.checkRepliesOnce()
	w.checkCompensation(hist)
	w.checkEnded()
	w.stats.Instances = len(w.instances)
	w.stats.Effects = len(w.ledger)
}

// checkStartsOnce: each trigger starts at most one instance per saga, both
// as the correlator saw its starts succeed and as the journal holds them.
func (w *world) checkStartsOnce() {
	for k, n := range w.started {
		if n > 1 {
			w.violate("trigger %s started saga %s %d times: a replayed trigger must be recognised", k.trigger, k.saga, n)
		}
	}
	seen := map[startKey]uuid.UUID{}
	for _, id := range w.instances {
		inst, err := w.mem.Get(ctx, id)
		if err != nil {
			continue
		}
		k := startKey{inst.TriggerEventID, inst.SagaName}
		if other, dup := seen[k]; dup {
			w.violate("trigger %s has two instances of saga %s: %s and %s", k.trigger, k.saga, w.name(other), w.name(id))
		}
		seen[k] = id
	}
}

// checkNothingLost: every trigger the correlator acknowledged has its
// instances, and by the end every trigger was acknowledged.
func (w *world) checkNothingLost() {
	if w.corr.acked < len(w.triggers) {
		w.violate("the stream was acknowledged up to %d of %d triggers by the end", w.corr.acked, len(w.triggers))
	}
	for pos := range w.corr.acked {
		trig := w.triggers[pos]
		for _, name := range trig.sagas {
			if _, err := w.mem.Get(ctx, instanceID(trig.id, name)); err != nil {
				w.violate("trigger %d was acknowledged but saga %s was never started: lost", pos, name)
			}
		}
	}
}

// checkEffectsOnce: a step's effect commits once per journal entry that
// records it (step_completed, or step_awaiting for a command step), and a
// step completes at most once per instance. An effect without its entry is
// a zombie's write or an entry lost after its effect: the step runs again
// and acts twice.
func (w *world) checkEffectsOnce(hist map[uuid.UUID][]saga.RecordedEvent) {
	type key struct {
		inst uuid.UUID
		step int
	}
	effects := map[key]int{}
	for _, e := range w.ledger {
		if e.kind == "do" {
			effects[key{e.inst, e.step}]++
		}
	}
	for _, id := range w.instances {
		inst, _ := w.mem.Get(ctx, id)
		def := w.def(inst.SagaName)
		entries := map[int]int{}
		completed := map[int]int{}
		for _, e := range hist[id] {
			switch {
			case e.Kind == saga.EventStepCompleted:
				completed[e.Step]++
				if !def.steps[e.Step].command {
					entries[e.Step]++
				}
			case e.Kind == saga.EventStepAwaiting:
				entries[e.Step]++
			}
		}
		for i, s := range def.steps {
			if completed[i] > 1 {
				w.violate("%s step %d (%s) completed %d times", w.name(id), i, s.name, completed[i])
			}
			if n := effects[key{id, i}]; n != entries[i] {
				w.violate("%s step %d (%s): %d effects committed for %d journal entries: an effect without its entry (double effect)", w.name(id), i, s.name, n, entries[i])
			}
		}
	}
}

// checkRepliesOnce: a reply is accepted at most once, and applied (the
// step that waited completes with it) at most once.
func (w *world) checkRepliesOnce() {
	for corr, n := range w.acceptedReplies {
		if n > 1 {
			w.violate("reply to %s accepted %d times", w.cmdName(corr), n)
		}
	}
	applied := map[uuid.UUID]int{}
	for _, e := range w.ledger {
		if e.kind == "reply" {
			applied[e.corr]++
		}
	}
	for corr, n := range applied {
		if n > 1 {
			w.violate("reply to %s applied %d times", w.cmdName(corr), n)
		}
	}
}

// checkCompensation: compensations run in reverse order, at most once per
// step, only for steps that completed or may have acted (a committed
// effect, a step_failed whose reason says it may have acted, or a
// step_interrupted: an attempt whose lease was lost), and an instance that
// ends COMPENSATED skipped none of those. Every attempt that acted outside
// its transaction is on record as one that may have acted, its step_failed
// committed or not.
func (w *world) checkCompensation(hist map[uuid.UUID][]saga.RecordedEvent) {
	comps := map[uuid.UUID][]int{}
	acted := map[uuid.UUID]map[int]bool{}
	// happened: anything of the step reached its participant.
	happened := map[uuid.UUID]map[int]bool{}
	for _, e := range w.ledger {
		if e.kind != "comp" {
			if happened[e.inst] == nil {
				happened[e.inst] = map[int]bool{}
			}
			happened[e.inst][e.step] = true
		}
		switch e.kind {
		case "comp":
			comps[e.inst] = append(comps[e.inst], e.step)
		case "do":
			if acted[e.inst] == nil {
				acted[e.inst] = map[int]bool{}
			}
			acted[e.inst][e.step] = true
		}
	}
	for _, id := range w.instances {
		inst, _ := w.mem.Get(ctx, id)
		def := w.def(inst.SagaName)
		may := map[int]bool{}
		for i := range acted[id] {
			may[i] = true
		}
		// recorded: the journal says an attempt of the step may have
		// acted (what a completed attempt says is not about the others).
		recorded := map[int]bool{}
		for _, e := range hist[id] {
			switch {
			case e.Kind == saga.EventStepFailed && mayHaveActed(e.Reason), e.Kind == saga.EventStepInterrupted:
				may[e.Step] = true
				recorded[e.Step] = true
			}
		}
		for _, e := range hist[id] {
			if e.Kind == saga.EventCompensationStarted && strings.Contains(e.Reason, "permission denied") {
				w.violate("%s: a missing grant, which an operator must fix, started compensation: %s", w.name(id), e.Reason)
			}
		}
		done := map[int]bool{}
		for k, step := range comps[id] {
			if k > 0 && step >= comps[id][k-1] {
				w.violate("%s: compensation of step %d ran after step %d's: not in reverse order (order %v)", w.name(id), step, comps[id][k-1], comps[id])
			}
			if done[step] {
				w.violate("%s: step %d compensated twice", w.name(id), step)
			}
			done[step] = true
			if !happened[id][step] {
				w.stats.NeedlessCompensations++
			}
			if !may[step] {
				w.violate("%s: step %d (%s) compensated, but it never completed nor may have acted", w.name(id), step, def.steps[step].name)
			}
		}
		for _, e := range w.ledger {
			if e.inst == id && e.kind == "acted" && !recorded[e.step] {
				// An attempt that acted and lost its lease (or its relay)
				// before its step_failed could commit: the step it left
				// open must have been recorded as interrupted, whether or
				// not a later attempt completed.
				w.stats.UnrecordedActs++
				uncompensated := inst.Status == saga.StatusCompensated && def.steps[e.step].compensates && !done[e.step]
				if uncompensated {
					w.stats.UncompensatedActs++
				}
				end := "the instance ended " + string(inst.Status)
				if uncompensated {
					end += " without compensating it"
				}
				w.violate("%s step %d attempt %d acted, and the journal has no record that the step may have acted (%s)", w.name(id), e.step, e.attempt, end)
			}
		}
		if inst.Status != saga.StatusCompensated {
			continue
		}
		for i, s := range def.steps {
			if may[i] && s.compensates && !done[i] {
				w.violate("%s ended COMPENSATED without compensating step %d (%s), which completed or may have acted", w.name(id), i, s.name)
			}
		}
	}
}

// checkEnded: after the quiet phase every instance has ended; one that has
// not is reported with where it stands.
func (w *world) checkEnded() {
	for _, id := range w.instances {
		inst, err := w.mem.Get(ctx, id)
		if err != nil {
			w.violate("%s: Get failed: %v", w.name(id), err)
			continue
		}
		switch inst.Status {
		case saga.StatusCompleted:
			w.stats.Completed++
			continue
		case saga.StatusCompensated:
			w.stats.Compensated++
			continue
		case saga.StatusFailed:
			w.stats.Failed++
			continue
		}
		w.violate("%s (%s) did not end: %s", w.name(id), inst.SagaName, stuckReason(inst, w))
	}
}

func stuckReason(inst saga.Instance, w *world) string {
	s := fmt.Sprintf("%s at step %d, attempt %d, due %s", inst.Status, inst.CurrentStep, inst.Attempt, inst.NextAttemptAt.Sub(w.start))
	if inst.AwaitingCorrelationID.Valid {
		s += ", awaiting reply " + w.cmdName(inst.AwaitingCorrelationID.UUID)
	}
	if inst.LeaseID.Valid && inst.LeaseExpiresAt != nil {
		s += fmt.Sprintf(", leased until %s", inst.LeaseExpiresAt.Sub(w.start))
	}
	if inst.LastError != "" {
		s += ", last error: " + inst.LastError
	}
	if saga.Claimable(&inst, w.now) {
		s += " (claimable now)"
	}
	return s
}
