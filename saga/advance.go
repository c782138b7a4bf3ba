package saga

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
)

// Transition is what one event does to an instance: the new projection, the
// step record to store and the journal entry to append. Both journals store
// exactly this, so that they cannot disagree about what an event means.
type Transition struct {
	// Instance is the new projection, Version already incremented.
	Instance Instance
	// Step is the step record to insert or replace; nil when the event
	// changes no step record.
	Step *StepRecord
	// Event is the entry to append. InstanceID, Version and CreatedAt are
	// set; GlobalSeq is left to the store.
	Event RecordedEvent
}

// Valid reports whether k is one of the known event kinds.
func (k EventKind) Valid() bool {
	switch k {
	case EventStepCompleted, EventStepFailed, EventStepAwaiting, EventReplyReceived,
		EventStepSkipped, EventStepWaiting, EventCompensationStarted, EventStepCompensated, EventCompensationSkipped, EventCompensationFailed,
		EventRetryRequested, EventCancelRequested, EventPaused, EventResumed, EventUpgraded, EventRestarted,
		EventStepInterrupted, EventCompleted, EventCompensated, EventFailed, EventTimedOut:
		return true
	}
	return false
}

// Appendable reports whether a lease holder writes events of this kind with
// Journal.Append. The others have their own entry points: MarkTerminal for
// terminal kinds, and the unfenced DeliverReply, RequestRetry,
// RequestCancel, RequestPause and RequestResume, which revoke the lease
// instead of checking it.
func (k EventKind) Appendable() bool {
	switch k {
	case EventStepCompleted, EventStepFailed, EventStepAwaiting, EventStepSkipped, EventStepWaiting,
		EventCompensationStarted, EventStepCompensated, EventCompensationSkipped, EventCompensationFailed,
		EventStepInterrupted:
		return true
	}
	return false
}

// Terminal reports whether k is the event of a terminal status.
func (k EventKind) Terminal() bool {
	_, ok := terminalStatus[k]
	return ok
}

var terminalStatus = map[EventKind]Status{
	EventCompleted:   StatusCompleted,
	EventCompensated: StatusCompensated,
	EventFailed:      StatusFailed,
	EventTimedOut:    StatusTimedOut,
}

// TerminalKind returns the event kind MarkTerminal records for a terminal
// status; a non-terminal status is ErrInvalid.
func TerminalKind(s Status) (EventKind, error) {
	for k, st := range terminalStatus {
		if st == s {
			return k, nil
		}
	}
	return "", Errorf(ErrInvalid, "%q is not a terminal status: MarkTerminal takes COMPLETED, COMPENSATED, FAILED or TIMED_OUT", s)
}

// HoldsLease reports whether leaseID is inst's live lease at now. At exact
// expiry the lease is still held: a takeover needs lease_expires_at < now, so
// the two sides of the boundary never overlap.
func HoldsLease(inst Instance, leaseID uuid.UUID, now time.Time) bool {
	return inst.LeaseID.Valid && inst.LeaseID.UUID == leaseID &&
		inst.LeaseExpiresAt != nil && !inst.LeaseExpiresAt.Before(now)
}

// Claimable reports whether ClaimPending may lease inst at now: it is RUNNING
// or COMPENSATING, due, and holds no live lease.
func Claimable(inst *Instance, now time.Time) bool {
	if inst.Status != StatusRunning && inst.Status != StatusCompensating {
		return false
	}
	if inst.NextAttemptAt.After(now) {
		return false
	}
	return !inst.LeaseID.Valid || inst.LeaseExpiresAt == nil || inst.LeaseExpiresAt.Before(now)
}

// ClaimOpenStep is what a claim does to inst's OpenStep, the same in every
// journal (pgjournal's claim statement says it in SQL): interrupted is the
// step the previous holder left open (the claim reports it as
// InterruptedStep), open the OpenStep the claim stores. A step left open is
// kept until step_interrupted records it, so that a claimer that crashes
// first leaves it to the next claim. Otherwise the claim opens the current
// step of a RUNNING instance that neither waits nor holds a reply: its
// holder may run an attempt of it. A waiting instance's step already acted
// (step_awaiting) or does nothing but end its wait.
func ClaimOpenStep(inst Instance) (interrupted, open *int) {
	if inst.OpenStep != nil {
		return inst.OpenStep, inst.OpenStep
	}
	return nil, opening(inst)
}

// opening is the OpenStep of inst when its holder goes on to its current
// step: that step while inst is RUNNING and neither waits nor holds a
// reply (an attempt of it may run), else none.
func opening(inst Instance) *int {
	if inst.Status != StatusRunning || inst.AwaitingCorrelationID.Valid || inst.AwaitingUntil != nil || len(inst.Reply) > 0 {
		return nil
	}
	step := inst.CurrentStep
	return &step
}

// Timestamp is t as the journals store it: UTC, truncated to the microsecond
// that PostgreSQL's timestamptz keeps, so that the memory journal and the
// PostgreSQL journal compute the same instants.
func Timestamp(t time.Time) time.Time { return t.Truncate(time.Microsecond).UTC() }

// Advance is the one function that says what an event does. It validates ev
// against the projection inst and the record cur of inst.CurrentStep (nil
// when that step has no record yet) and returns the transition to store. Any
// refusal is ErrInvalid (ErrConflict for a second reply to one wait); inst
// and cur are not modified.
//
// Advance does not check leases: the journals check the lease (HoldsLease)
// before calling it, so that a stale writer learns about its lease first.
//
// The effect of each kind (now is the journal's clock):
//
//   - step_completed (RUNNING, Step = CurrentStep): the step becomes
//     COMPLETED with Output; CurrentStep = Step+1, Attempt = 0,
//     next_attempt_at = now, last_error cleared.
//   - step_failed (RUNNING, Step = CurrentStep): the step becomes FAILED with
//     Error; Attempt+1, next_attempt_at = now+RetryIn, last_error = Error.
//     With a Class that holds (ClassOperator, ClassTransient) Attempt is
//     left as it is and held_since is set (kept when already set); every
//     other event clears held_since.
//   - step_skipped (RUNNING, Step = CurrentStep, a step that has not run,
//     or only in an attempt that was interrupted): the step becomes
//     SKIPPED; CurrentStep = Step+1, Attempt = 0, next_attempt_at = now,
//     last_error cleared. A skipped step is never compensated.
//   - step_waiting (RUNNING, Step = CurrentStep): the step is RUNNING;
//     awaiting_until = Until, next_attempt_at = Until (now when Until has
//     passed); Attempt is left as it is: a wait is not an attempt.
//   - step_awaiting (RUNNING, Step = CurrentStep): the step is RUNNING;
//     awaiting_correlation_id = CorrelationID, awaiting_until =
//     next_attempt_at = now+AwaitFor.
//   - reply_received (RUNNING, Step = CurrentStep, awaiting CorrelationID):
//     reply = Output, the wait is cleared, next_attempt_at = now, lease
//     revoked. (The correlator writes this event with its own set-based SQL
//     to the same effect; keep the two in step.)
//   - compensation_started (RUNNING, -1 <= Step <= CurrentStep):
//     COMPENSATING, CurrentStep = Step, compensation_reason = Reason,
//     Attempt = 0, next_attempt_at = now.
//   - step_compensated (COMPENSATING, Step = CurrentStep): the step becomes
//     COMPENSATED; CurrentStep = Step-1, Attempt = 0, next_attempt_at = now.
//   - compensation_skipped (COMPENSATING, Step = CurrentStep): the step
//     record is left as it is; CurrentStep = Step-1, Attempt = 0,
//     next_attempt_at = now.
//   - compensation_failed (COMPENSATING, Step = CurrentStep, a step that can
//     be compensated): the step's compensation_attempts+1 and last_error;
//     Attempt+1, next_attempt_at = now+RetryIn, last_error = Error; a Class
//     that holds counts no attempt and sets held_since, as for step_failed.
//   - retry_requested (RUNNING, COMPENSATING, or FAILED which becomes
//     COMPENSATING): Attempt = 0, next_attempt_at = now, the current step's
//     counter of the phase being resumed reset, lease revoked. No step is
//     marked done.
//   - cancel_requested (RUNNING): COMPENSATING from CurrentStep,
//     compensation_reason = Reason, Attempt = 0, next_attempt_at = now,
//     lease revoked.
//   - paused (RUNNING or COMPENSATING): PAUSED, paused_from = the status
//     it was in, lease revoked; nothing else changes (step, attempt,
//     next_attempt_at, the wait, held_since).
//   - resumed (PAUSED): back to paused_from, lease revoked; nothing else
//     changes, so the instance is due when it was due.
//   - reply_received may reach a PAUSED instance paused while it waited:
//     the reply is kept and the instance stays PAUSED.
//   - restarted (FAILED or COMPENSATED, Step >= 0): RUNNING at Step, Attempt
//     = 0, next_attempt_at = now, last_error, compensation_reason and
//     completed_at cleared, lease revoked; no step record changes.
//   - completed, compensated, failed, timed_out: the terminal status (as
//     CheckTransition allows; compensated and timed_out only once every step
//     is compensated or skipped, CurrentStep < 0), completed_at = now, lease
//     released.
//   - step_interrupted (RUNNING or COMPENSATING, Step = OpenStep): the
//     record that step Step may have acted. The step becomes RUNNING (an
//     attempt began) unless its record cannot (COMPLETED, SKIPPED);
//     Attempt, the step's attempts and held_since are kept. The holder
//     that writes it goes on: OpenStep is its current step again while
//     RUNNING (as a claim would open it), none while COMPENSATING.
//
// OpenStep, the step the holder may be running: step_completed and
// step_skipped open the next one (the holder goes on to it); step_failed,
// step_waiting, step_awaiting, compensation_started, the compensation
// events, restarted and the terminal kinds close it (the holder runs no
// attempt after them); reply_received, retry_requested, cancel_requested,
// paused and resumed keep it: they revoke the lease, and an attempt they
// cut short may have acted. InterruptedStep, a claim's report, is cleared
// by every event.
//
// Every event that ends a wait (step_completed, step_failed, step_awaiting,
// compensation_started, cancel_requested, the terminal kinds) clears
// awaiting_correlation_id, awaiting_until and reply: that is how the runner
// consumes a delivered reply. A step's attempts count its finished attempts: one per
// step_completed and step_failed (step_awaiting leaves it, the attempt ends
// when the reply or the timeout does). State, when set, replaces the context.
func Advance(inst Instance, cur *StepRecord, ev Event, now time.Time) (Transition, error) {
	now = Timestamp(now)
	if err := validateEvent(ev); err != nil {
		return Transition{}, err
	}
	if cur != nil && cur.Sequence != inst.CurrentStep {
		return Transition{}, Errorf(ErrInvalid, "instance %s: step record %d given for current step %d", inst.ID, cur.Sequence, inst.CurrentStep)
	}
	if err := checkEventStep(inst, ev); err != nil {
		return Transition{}, err
	}

	next := inst
	var step *StepRecord
	// loadStep returns a copy of the current step's record to change,
	// creating a PENDING one for a step that has none yet.
	loadStep := func() (*StepRecord, error) {
		s := StepRecord{Sequence: inst.CurrentStep, Name: ev.StepName, Status: StepPending}
		if cur != nil {
			s = *cur
			if ev.StepName != "" && s.Name != "" && s.Name != ev.StepName {
				return nil, Errorf(ErrInvalid, "instance %s: step %d is %q, the event names %q", inst.ID, inst.CurrentStep, s.Name, ev.StepName)
			}
			if s.Name == "" {
				s.Name = ev.StepName
			}
		}
		return &s, nil
	}
	moveStep := func(s *StepRecord, to StepStatus) error {
		if err := CheckStepTransition(s.Status, to); err != nil {
			return fmt.Errorf("instance %s step %d, %s: %w", inst.ID, s.Sequence, ev.Kind, err)
		}
		s.Status = to
		return nil
	}
	requireStatus := func(want Status) error {
		if inst.Status != want {
			return Errorf(ErrInvalid, "instance %s: %s needs a %s instance, it is %s", inst.ID, ev.Kind, want, inst.Status)
		}
		return nil
	}
	endWait := func() {
		next.AwaitingCorrelationID = uuid.NullUUID{}
		next.AwaitingUntil = nil
		next.Reply = nil
	}
	revokeLease := func() {
		next.LeaseID = uuid.NullUUID{}
		next.LeaseExpiresAt = nil
	}
	at := func(t time.Time) *time.Time { return &t }
	// A failure that holds the instance is not an attempt: it starts (or
	// continues) the hold instead. Every other event ends a hold.
	next.HeldSince = nil
	// A claim's report, not part of the projection.
	next.InterruptedStep = nil
	countAttempt := func() {
		if ev.Class.holds() {
			next.HeldSince = cmp.Or(inst.HeldSince, at(now))
			return
		}
		next.Attempt++
	}

	var to Status
	switch ev.Kind {
	case EventReplyReceived:
		to = StatusRunning
		if inst.Status == StatusPaused && inst.PausedFrom == StatusRunning {
			to = StatusPaused
		}
	case EventStepCompleted, EventStepFailed, EventStepAwaiting, EventStepSkipped, EventStepWaiting:
		to = StatusRunning
	case EventStepInterrupted:
		if inst.Status != StatusRunning && inst.Status != StatusCompensating {
			return Transition{}, Errorf(ErrInvalid, "instance %s: step_interrupted needs a RUNNING or COMPENSATING instance, it is %s", inst.ID, inst.Status)
		}
		to = inst.Status
	case EventRestarted:
		if inst.Status != StatusFailed && inst.Status != StatusCompensated {
			return Transition{}, Errorf(ErrInvalid, "instance %s: only a FAILED or COMPENSATED instance can be restarted from a step, it is %s", inst.ID, inst.Status)
		}
		to = StatusRunning
	case EventPaused:
		if inst.Status != StatusRunning && inst.Status != StatusCompensating {
			return Transition{}, Errorf(ErrInvalid, "instance %s: only a RUNNING or COMPENSATING instance can be paused, it is %s", inst.ID, inst.Status)
		}
		to = StatusPaused
	case EventResumed:
		if err := requireStatus(StatusPaused); err != nil {
			return Transition{}, err
		}
		to = inst.PausedFrom
		if to != StatusRunning && to != StatusCompensating {
			return Transition{}, Errorf(ErrInvalid, "instance %s: paused from %q, which is not RUNNING or COMPENSATING", inst.ID, inst.PausedFrom)
		}
	case EventCompensationStarted, EventCancelRequested:
		if err := requireStatus(StatusRunning); err != nil {
			return Transition{}, err
		}
		to = StatusCompensating
	case EventStepCompensated, EventCompensationSkipped, EventCompensationFailed:
		if err := requireStatus(StatusCompensating); err != nil {
			return Transition{}, err
		}
		to = StatusCompensating
	case EventRetryRequested:
		to = inst.Status
		if inst.Status == StatusFailed {
			to = StatusCompensating
		}
	default:
		to = terminalStatus[ev.Kind]
	}
	if err := CheckTransition(inst.Status, to); err != nil {
		return Transition{}, fmt.Errorf("instance %s, %s: %w", inst.ID, ev.Kind, err)
	}
	next.Status = to

	switch ev.Kind {
	case EventStepCompleted:
		s, err := loadStep()
		if err != nil {
			return Transition{}, err
		}
		if err := moveStep(s, StepCompleted); err != nil {
			return Transition{}, err
		}
		if len(ev.Output) > 0 {
			s.Output = ev.Output
		}
		if s.StartedAt == nil {
			s.StartedAt = at(now)
		}
		s.CompletedAt = at(now)
		s.Attempts++
		step = s
		next.CurrentStep = ev.Step + 1
		next.Attempt = 0
		// The next step is due now. An instance already due keeps its
		// next_attempt_at: due either way, and a projection update that
		// changes no indexed column is a HOT update in PostgreSQL (no new
		// index entry in any of saga_instances' indexes), which is most of
		// the cost of a step's write. It also keeps the instance's place in
		// the claim order, so a saga already under way finishes first.
		if next.NextAttemptAt.After(now) {
			next.NextAttemptAt = now
		}
		next.LastError = ""
		endWait()

	case EventStepFailed:
		s, err := loadStep()
		if err != nil {
			return Transition{}, err
		}
		if err := moveStep(s, StepFailed); err != nil {
			return Transition{}, err
		}
		if s.StartedAt == nil {
			s.StartedAt = at(now)
		}
		s.Attempts++
		s.LastError = ev.Error
		step = s
		countAttempt()
		next.NextAttemptAt = now.Add(ev.RetryIn).Truncate(time.Microsecond)
		next.LastError = ev.Error
		endWait()

	case EventStepSkipped:
		if inst.AwaitingCorrelationID.Valid || inst.AwaitingUntil != nil || len(inst.Reply) > 0 {
			// Its record is RUNNING, as after an interrupted attempt, but
			// it sent a command or waits for a timer: not a step that can
			// still decide not to act.
			return Transition{}, Errorf(ErrInvalid, "instance %s step %d waits for a reply or a timer: it cannot be skipped", inst.ID, ev.Step)
		}
		s, err := loadStep()
		if err != nil {
			return Transition{}, err
		}
		if err := moveStep(s, StepSkipped); err != nil {
			return Transition{}, err
		}
		s.CompletedAt = at(now)
		step = s
		next.CurrentStep = ev.Step + 1
		next.Attempt = 0
		if next.NextAttemptAt.After(now) {
			next.NextAttemptAt = now
		}
		next.LastError = ""
		endWait()

	case EventStepWaiting:
		s, err := loadStep()
		if err != nil {
			return Transition{}, err
		}
		if err := moveStep(s, StepRunning); err != nil {
			return Transition{}, err
		}
		if s.StartedAt == nil {
			s.StartedAt = at(now)
		}
		step = s
		until := Timestamp(ev.Until)
		endWait()
		next.AwaitingUntil = at(until)
		next.NextAttemptAt = until
		if until.Before(now) {
			next.NextAttemptAt = now
		}

	case EventStepAwaiting:
		s, err := loadStep()
		if err != nil {
			return Transition{}, err
		}
		if err := moveStep(s, StepRunning); err != nil {
			return Transition{}, err
		}
		if len(ev.Output) > 0 {
			s.Output = ev.Output
		}
		if s.StartedAt == nil {
			s.StartedAt = at(now)
		}
		step = s
		until := now.Add(ev.AwaitFor).Truncate(time.Microsecond)
		endWait()
		next.AwaitingCorrelationID = uuid.NullUUID{UUID: ev.CorrelationID, Valid: true}
		next.AwaitingUntil = at(until)
		next.NextAttemptAt = until

	case EventReplyReceived:
		if !inst.AwaitingCorrelationID.Valid || inst.AwaitingCorrelationID.UUID != ev.CorrelationID {
			return Transition{}, Errorf(ErrInvalid, "instance %s does not wait for correlation id %s", inst.ID, ev.CorrelationID)
		}
		if inst.Reply != nil {
			return Transition{}, Errorf(ErrConflict, "instance %s already holds an unconsumed reply for correlation id %s", inst.ID, ev.CorrelationID)
		}
		next.Reply = ev.Output
		next.AwaitingCorrelationID = uuid.NullUUID{}
		next.AwaitingUntil = nil
		next.NextAttemptAt = now
		revokeLease()

	case EventCompensationStarted:
		next.CurrentStep = ev.Step
		next.CompensationReason = ev.Reason
		next.Attempt = 0
		next.NextAttemptAt = now
		endWait()

	case EventStepCompensated:
		s, err := loadStep()
		if err != nil {
			return Transition{}, err
		}
		if err := moveStep(s, StepCompensated); err != nil {
			return Transition{}, err
		}
		// Like Attempts for Do, the count includes the attempt that
		// succeeded.
		s.CompensationAttempts++
		s.CompensatedAt = at(now)
		step = s
		next.CurrentStep = ev.Step - 1
		next.Attempt = 0
		next.NextAttemptAt = now
		next.LastError = ""

	case EventCompensationSkipped:
		next.CurrentStep = ev.Step - 1
		next.Attempt = 0
		next.NextAttemptAt = now

	case EventCompensationFailed:
		s, err := loadStep()
		if err != nil {
			return Transition{}, err
		}
		if err := CheckStepTransition(s.Status, StepCompensated); err != nil {
			return Transition{}, Errorf(ErrInvalid, "instance %s step %d is %s: it has nothing to compensate (append compensation_skipped)", inst.ID, s.Sequence, s.Status)
		}
		s.CompensationAttempts++
		s.LastError = ev.Error
		step = s
		countAttempt()
		next.NextAttemptAt = now.Add(ev.RetryIn).Truncate(time.Microsecond)
		next.LastError = ev.Error

	case EventRetryRequested:
		if cur != nil {
			s := *cur
			// Reset the counter of the phase being resumed; the other
			// phase's count stays as history.
			if to == StatusRunning {
				s.Attempts = 0
			} else {
				s.CompensationAttempts = 0
			}
			step = &s
		}
		next.Attempt = 0
		next.NextAttemptAt = now
		revokeLease()

	case EventPaused:
		next.PausedFrom = inst.Status
		next.HeldSince = inst.HeldSince
		revokeLease()

	case EventRestarted:
		next.CurrentStep = ev.Step
		next.Attempt = 0
		next.NextAttemptAt = now
		next.LastError = ""
		next.CompensationReason = ""
		next.CompletedAt = nil
		endWait()
		revokeLease()

	case EventResumed:
		next.PausedFrom = ""
		next.HeldSince = inst.HeldSince
		revokeLease()

	case EventStepInterrupted:
		// A record, not an outcome: a hold goes on, no attempt is counted.
		// The step record says that an attempt began (RUNNING), so that
		// its compensation can be recorded; a record that cannot move
		// there (COMPLETED, SKIPPED) is left as it is, since the event is
		// recorded whatever the record says.
		next.HeldSince = inst.HeldSince
		if ev.Step == inst.CurrentStep {
			s, err := loadStep()
			if err != nil {
				return Transition{}, err
			}
			if CheckStepTransition(s.Status, StepRunning) == nil {
				s.Status = StepRunning
				if s.StartedAt == nil {
					s.StartedAt = at(now)
				}
				step = s
			}
		}

	case EventCancelRequested:
		next.CompensationReason = ev.Reason
		if next.CompensationReason == "" {
			next.CompensationReason = "cancel requested"
		}
		next.Attempt = 0
		next.NextAttemptAt = now
		endWait()
		revokeLease()

	default: // terminal kinds
		if (to == StatusCompensated || to == StatusTimedOut) && inst.CurrentStep >= 0 {
			return Transition{}, Errorf(ErrInvalid, "instance %s cannot end %s: step %d is not compensated or skipped yet", inst.ID, to, inst.CurrentStep)
		}
		next.CompletedAt = at(now)
		endWait()
		revokeLease()
	}

	switch ev.Kind {
	case EventStepCompleted, EventStepSkipped, EventStepInterrupted:
		// The holder goes on to the (new) current step, if it runs one.
		next.OpenStep = opening(next)
	case EventReplyReceived, EventRetryRequested, EventCancelRequested, EventPaused, EventResumed:
		// They revoke the lease: an attempt they cut short may have acted.
	default:
		next.OpenStep = nil
	}
	if len(ev.State) > 0 {
		next.Context = ev.State
	}
	next.Version = inst.Version + 1
	next.UpdatedAt = now
	return Transition{
		Instance: next,
		Step:     step,
		Event:    RecordedEvent{InstanceID: inst.ID, Version: next.Version, Event: ev, CreatedAt: now},
	}, nil
}

// CheckNew validates an instance given to Journal.Enqueue: it needs an id, a
// saga name and a positive version, valid JSON context, and no progress (an
// instance starts RUNNING at step 0 with no attempt, lease, open step, wait,
// reply or event). CreatedAt and UpdatedAt are ignored: the journal stamps
// them.
func CheckNew(inst Instance) error {
	switch {
	case inst.ID == uuid.Nil:
		return Errorf(ErrInvalid, "enqueue: the instance has no ID")
	case inst.SagaName == "":
		return Errorf(ErrInvalid, "enqueue %s: SagaName is empty", inst.ID)
	case inst.SagaVersion <= 0:
		return Errorf(ErrInvalid, "enqueue %s: SagaVersion must be positive, got %d", inst.ID, inst.SagaVersion)
	case inst.Status != "" && inst.Status != StatusRunning:
		return Errorf(ErrInvalid, "enqueue %s: an instance starts RUNNING, got %s", inst.ID, inst.Status)
	case inst.CurrentStep != 0 || inst.Attempt != 0 || inst.Version != 0:
		return Errorf(ErrInvalid, "enqueue %s: an instance starts at step 0, attempt 0, version 0", inst.ID)
	case inst.LeaseID.Valid || inst.LeaseExpiresAt != nil:
		return Errorf(ErrInvalid, "enqueue %s: an instance starts without a lease (ClaimPending grants one)", inst.ID)
	case inst.OpenStep != nil || inst.InterruptedStep != nil:
		return Errorf(ErrInvalid, "enqueue %s: an instance starts with no step open (OpenStep and InterruptedStep are the claims')", inst.ID)
	case inst.AwaitingCorrelationID.Valid || inst.AwaitingUntil != nil || inst.Reply != nil:
		return Errorf(ErrInvalid, "enqueue %s: an instance starts without a wait or a reply", inst.ID)
	case inst.LastError != "" || inst.CompensationReason != "" || inst.CompletedAt != nil:
		return Errorf(ErrInvalid, "enqueue %s: LastError, CompensationReason and CompletedAt start empty", inst.ID)
	}
	if err := storableText(inst.SagaName); err != nil {
		return Errorf(ErrInvalid, "enqueue %s: SagaName %v", inst.ID, err)
	}
	if err := storableJSON(inst.Context); err != nil {
		return Errorf(ErrInvalid, "enqueue %s: Context %v", inst.ID, err)
	}
	return nil
}

// checkEventStep checks ev.Step against the instance: step events concern
// the current step, compensation_started a step at or below it,
// step_interrupted the open step, the others name no step (-1) or the
// current one.
func checkEventStep(inst Instance, ev Event) error {
	switch ev.Kind {
	case EventCompensationStarted:
		if ev.Step < -1 || ev.Step > inst.CurrentStep {
			return Errorf(ErrInvalid, "instance %s: compensation can start at step -1..%d (the steps reached), not %d", inst.ID, inst.CurrentStep, ev.Step)
		}
	case EventRestarted:
		if ev.Step < 0 {
			return Errorf(ErrInvalid, "instance %s: restarted needs the step to start from, got %d", inst.ID, ev.Step)
		}
	case EventStepInterrupted:
		// Only what a claim reported: the step the previous holder left
		// open. (Mostly the current step; not always after relays of an
		// earlier release, which do not keep open_step, ran the instance.)
		if inst.OpenStep == nil {
			return Errorf(ErrInvalid, "instance %s: step_interrupted for step %d, but no step is open (it records what ClaimPending reported in InterruptedStep)", inst.ID, ev.Step)
		}
		if ev.Step != *inst.OpenStep {
			return Errorf(ErrInvalid, "instance %s: step_interrupted for step %d, the open step is %d", inst.ID, ev.Step, *inst.OpenStep)
		}
	case EventRetryRequested, EventCancelRequested, EventPaused, EventResumed, EventCompleted, EventCompensated, EventFailed, EventTimedOut:
		if ev.Step != -1 && ev.Step != inst.CurrentStep {
			return Errorf(ErrInvalid, "instance %s: %s names step %d, the instance is at step %d", inst.ID, ev.Kind, ev.Step, inst.CurrentStep)
		}
	default:
		if ev.Step != inst.CurrentStep || ev.Step < 0 {
			return Errorf(ErrInvalid, "instance %s: %s for step %d, the instance is at step %d", inst.ID, ev.Kind, ev.Step, inst.CurrentStep)
		}
	}
	return nil
}

// validateEvent checks what an event says on its own, before the projection.
func validateEvent(ev Event) error {
	if !ev.Kind.Valid() {
		return Errorf(ErrInvalid, "unknown event kind %q", ev.Kind)
	}
	if ev.RetryIn < 0 {
		return Errorf(ErrInvalid, "%s: RetryIn is negative (%s)", ev.Kind, ev.RetryIn)
	}
	if ev.AwaitFor < 0 {
		return Errorf(ErrInvalid, "%s: AwaitFor is negative (%s)", ev.Kind, ev.AwaitFor)
	}
	switch ev.Class {
	case "":
	case ClassOperator, ClassTransient:
		if ev.Kind != EventStepFailed && ev.Kind != EventCompensationFailed {
			return Errorf(ErrInvalid, "%s: Class %q is only for step_failed and compensation_failed", ev.Kind, ev.Class)
		}
	default:
		return Errorf(ErrInvalid, "%s: Class %q is not %q or %q (a failure that counts has no Class)", ev.Kind, ev.Class, ClassOperator, ClassTransient)
	}
	switch ev.Kind {
	case EventStepAwaiting:
		if ev.CorrelationID == uuid.Nil {
			return Errorf(ErrInvalid, "step_awaiting needs a CorrelationID to match the reply")
		}
		if ev.AwaitFor <= 0 {
			return Errorf(ErrInvalid, "step_awaiting needs a positive AwaitFor, got %s", ev.AwaitFor)
		}
	case EventStepWaiting:
		if ev.Until.IsZero() {
			return Errorf(ErrInvalid, "step_waiting needs the end of the wait in Until")
		}
	case EventReplyReceived:
		if ev.CorrelationID == uuid.Nil {
			return Errorf(ErrInvalid, "reply_received needs the CorrelationID of the wait")
		}
		if len(ev.Output) == 0 {
			return Errorf(ErrInvalid, "reply_received needs the reply payload in Output")
		}
	}
	texts := []struct{ name, s string }{{"StepName", ev.StepName}, {"Error", ev.Error}, {"Reason", ev.Reason}, {"Actor", ev.Actor}}
	for _, f := range texts {
		if err := storableText(f.s); err != nil {
			return Errorf(ErrInvalid, "%s: %s %v", ev.Kind, f.name, err)
		}
	}
	if err := storableJSON(ev.State); err != nil {
		return Errorf(ErrInvalid, "%s: State %v", ev.Kind, err)
	}
	if err := storableJSON(ev.Output); err != nil {
		return Errorf(ErrInvalid, "%s: Output %v", ev.Kind, err)
	}
	return nil
}

// storableText rejects text PostgreSQL cannot store: invalid UTF-8 or a NUL
// byte. Checking it here keeps the two journals' answers identical.
func storableText(s string) error {
	if !utf8.ValidString(s) {
		return textError("is not valid UTF-8")
	}
	if strings.IndexByte(s, 0) >= 0 {
		return textError("contains a NUL byte, which PostgreSQL text cannot hold")
	}
	return nil
}

// storableJSON rejects a JSON value that jsonb cannot store: invalid JSON, or a
// string holding NUL (\u0000). Empty means absent and is accepted.
func storableJSON(raw json.RawMessage) error {
	if len(raw) == 0 {
		return nil
	}
	if !json.Valid(raw) {
		return textError("is not valid JSON")
	}
	if bytes.Contains(raw, []byte(`\u0000`)) && jsonHasNUL(raw) {
		return textError(`holds \u0000, which PostgreSQL jsonb cannot store`)
	}
	return nil
}

func jsonHasNUL(raw json.RawMessage) bool {
	dec := json.NewDecoder(bytes.NewReader(raw))
	for {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		if s, ok := tok.(string); ok && strings.IndexByte(s, 0) >= 0 {
			return true
		}
	}
}

type textError string

func (e textError) Error() string { return string(e) }
