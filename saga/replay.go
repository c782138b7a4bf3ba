package saga

import (
	"fmt"

	"github.com/google/uuid"
)

// Divergence is where a recorded history and a definition part ways: the
// first event of the history that the definition could not have written at
// that place. It is the error Replay returns.
type Divergence struct {
	InstanceID uuid.UUID
	// Version is the journal version of the event that diverges.
	Version int64
	// Step is the step the event concerns (-1 when none).
	Step int
	// StepName is the step's name in the history ("" when it named none).
	StepName string
	// What says what differs, in words an operator can act on.
	What string
}

func (d *Divergence) Error() string {
	where := fmt.Sprintf("event %d", d.Version)
	if d.Step >= 0 {
		where += fmt.Sprintf(", step %d", d.Step)
		if d.StepName != "" {
			where += fmt.Sprintf(" (%s)", d.StepName)
		}
	}
	return fmt.Sprintf("instance %s diverges at %s: %s", d.InstanceID, where, d.What)
}

// Replay checks a recorded history (Journal.Load, in version order) against
// def, as a new version is checked before it is deployed: it returns nil
// when every step the history ran is the step def has at that place, so
// that def could have written the history and can continue it; otherwise
// the first Divergence:
//
//   - a step the history ran (started, completed, failed, skipped, waited,
//     interrupted, compensated) that def does not have at that index, or
//     that def names differently;
//   - a step that waited for a reply (step_awaiting, reply_received) where
//     def's step emits no command (ReplyTimeout is zero), or a step def
//     declares as a command whose reply the history never waited for
//     although the step completed;
//   - a step the history compensated (step_compensated, compensation_failed)
//     that def cannot compensate (no Compensate): the compensation order
//     def would follow differs.
//
// ReplayVersion also compares the kinds of the steps with the definition
// the history ran under.
func Replay(def Definition, history []RecordedEvent) error {
	return ReplayVersion(nil, def, history)
}

// ReplayVersion is Replay with the definition the history ran under
// (ranUnder, nil when unknown): a step whose Kind differs between the two
// (a sql step that became an http step) diverges too.
func ReplayVersion(ranUnder *Definition, def Definition, history []RecordedEvent) error {
	awaited := map[int]bool{}
	for _, ev := range history {
		if ev.Step < 0 || !stepEvent(ev.Kind) {
			continue
		}
		diverge := func(format string, args ...any) error {
			return &Divergence{InstanceID: ev.InstanceID, Version: ev.Version, Step: ev.Step, StepName: ev.StepName, What: fmt.Sprintf(format, args...)}
		}
		if ev.Step >= len(def.Steps) {
			return diverge("the journal ran step %d, %s v%d has %d steps", ev.Step, def.Name, def.Version, len(def.Steps))
		}
		st := def.Steps[ev.Step]
		if ev.StepName != "" && st.Name != ev.StepName {
			return diverge("the journal ran %q here, %s v%d has %q at this place", ev.StepName, def.Name, def.Version, st.Name)
		}
		if ranUnder != nil && ev.Step < len(ranUnder.Steps) {
			if was := ranUnder.Steps[ev.Step]; was.Kind != "" && st.Kind != "" && was.Kind != st.Kind {
				return diverge("step %q was a %s step in v%d, it is a %s step in v%d", st.Name, was.Kind, ranUnder.Version, st.Kind, def.Version)
			}
		}
		switch ev.Kind {
		case EventStepAwaiting, EventReplyReceived:
			awaited[ev.Step] = true
			if st.ReplyTimeout <= 0 {
				return diverge("the journal waited for a reply to step %q, in %s v%d it emits no command", st.Name, def.Name, def.Version)
			}
		case EventStepCompleted:
			if st.ReplyTimeout > 0 && !awaited[ev.Step] {
				return diverge("step %q completed without waiting for a reply, in %s v%d it emits a command and waits", st.Name, def.Name, def.Version)
			}
		case EventStepCompensated, EventCompensationFailed:
			if st.Compensate == nil {
				return diverge("the journal compensated step %q, %s v%d has no compensation for it: the compensation would skip it", st.Name, def.Name, def.Version)
			}
		}
	}
	return nil
}

// stepEvent reports whether k is written by a step or its compensation
// (the events Replay checks against the definition's steps).
func stepEvent(k EventKind) bool {
	switch k {
	case EventStepCompleted, EventStepFailed, EventStepSkipped, EventStepWaiting, EventStepAwaiting, EventReplyReceived,
		EventStepInterrupted, EventStepCompensated, EventCompensationSkipped, EventCompensationFailed:
		return true
	}
	return false
}
