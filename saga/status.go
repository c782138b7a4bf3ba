package saga

import "slices"

// Status is where a saga instance stands. The values are the saga_status enum.
type Status string

const (
	StatusRunning      Status = "RUNNING"
	StatusCompleted    Status = "COMPLETED"
	StatusCompensating Status = "COMPENSATING"
	StatusCompensated  Status = "COMPENSATED"
	StatusFailed       Status = "FAILED"
	StatusTimedOut     Status = "TIMED_OUT"
	// StatusPaused: an operator paused the instance (RequestPause). It runs
	// no step and no compensation until resumed, and then continues in the
	// status it was paused in (Instance.PausedFrom).
	StatusPaused Status = "PAUSED"
)

// Terminal reports whether no further work happens on its own. FAILED is
// terminal for the runner (a failed compensation waits for a person), but a
// manual retry can move it back to COMPENSATING.
func (s Status) Terminal() bool {
	switch s {
	case StatusCompleted, StatusCompensated, StatusFailed, StatusTimedOut:
		return true
	}
	return false
}

// Statuses lists every status, in the order an instance meets them.
var Statuses = []Status{StatusRunning, StatusPaused, StatusCompensating, StatusFailed, StatusCompleted, StatusCompensated, StatusTimedOut}

// Valid reports whether s is one of the known statuses.
func (s Status) Valid() bool { return slices.Contains(Statuses, s) }

// StepStatus is where one step of an instance stands: the saga_step_status enum.
type StepStatus string

const (
	StepPending     StepStatus = "PENDING"
	StepRunning     StepStatus = "RUNNING"
	StepCompleted   StepStatus = "COMPLETED"
	StepFailed      StepStatus = "FAILED"
	StepCompensated StepStatus = "COMPENSATED"
	StepSkipped     StepStatus = "SKIPPED"
)

// Valid reports whether s is one of the known step statuses.
func (s StepStatus) Valid() bool {
	switch s {
	case StepPending, StepRunning, StepCompleted, StepFailed, StepCompensated, StepSkipped:
		return true
	}
	return false
}

var sagaTransitions = map[Status][]Status{
	StatusRunning:      {StatusRunning, StatusCompleted, StatusCompensating, StatusPaused},
	StatusCompensating: {StatusCompensating, StatusCompensated, StatusFailed, StatusTimedOut, StatusPaused},
	// A paused instance goes back to the status it was paused in; a reply
	// may reach it meanwhile (PAUSED -> PAUSED).
	StatusPaused: {StatusPaused, StatusRunning, StatusCompensating},
	// A person's retry resumes the compensation that failed; a restart from
	// a step starts a new attempt.
	StatusFailed:      {StatusCompensating, StatusRunning},
	StatusCompensated: {StatusRunning},
}

// CheckTransition is the one place that says which status changes are legal.
// Both journals call it; an illegal change is an ErrInvalid error.
func CheckTransition(from, to Status) error {
	if !from.Valid() || !to.Valid() {
		return Errorf(ErrInvalid, "unknown saga status in transition %q -> %q", from, to)
	}
	for _, ok := range sagaTransitions[from] {
		if ok == to {
			return nil
		}
	}
	return Errorf(ErrInvalid, "saga status cannot go from %s to %s", from, to)
}

var stepTransitions = map[StepStatus][]StepStatus{
	StepPending: {StepRunning, StepCompleted, StepFailed, StepSkipped},
	// RUNNING -> RUNNING is a retry or a step waiting for its reply. A
	// step RUNNING since an attempt of it was interrupted (step_interrupted)
	// may still decide on its next attempt not to act (step_skipped); one
	// that waits may not (Advance checks the wait).
	StepRunning: {StepRunning, StepCompleted, StepFailed, StepCompensated, StepSkipped},
	// A failed step may have acted (a timeout): it is compensated too. A
	// manual retry re-runs it.
	StepFailed:    {StepRunning, StepCompleted, StepFailed, StepCompensated},
	StepCompleted: {StepCompensated},
	// A compensated step runs again only in a new attempt of its instance
	// (a restart from that step or an earlier one).
	StepCompensated: {StepRunning, StepCompleted, StepFailed, StepSkipped},
}

// CheckStepTransition validates a step status change, like CheckTransition.
func CheckStepTransition(from, to StepStatus) error {
	if !from.Valid() || !to.Valid() {
		return Errorf(ErrInvalid, "unknown step status in transition %q -> %q", from, to)
	}
	for _, ok := range stepTransitions[from] {
		if ok == to {
			return nil
		}
	}
	return Errorf(ErrInvalid, "step status cannot go from %s to %s", from, to)
}
