package saga_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/compensa/compensa/saga"
)

func replayDef(version int, steps ...saga.Step) saga.Definition {
	return saga.Definition{Name: "order", Version: version, Steps: steps}
}

// history builds a recorded journal from events, numbering their versions.
func history(evs ...saga.Event) []saga.RecordedEvent {
	id := uuid.New()
	out := make([]saga.RecordedEvent, len(evs))
	for i, ev := range evs {
		out[i] = saga.RecordedEvent{InstanceID: id, Version: int64(i + 1), Event: ev}
	}
	return out
}

func TestReplay(t *testing.T) {
	reserve := saga.Step{Name: "reserve", Kind: "sql", Do: noop, Compensate: noop}
	charge := saga.Step{Name: "charge", Kind: "command", Do: noop, ReplyTimeout: time.Minute}
	ship := saga.Step{Name: "ship", Kind: "http", Do: noop}
	ran := history(
		saga.Event{Kind: saga.EventStepCompleted, Step: 0, StepName: "reserve"},
		saga.Event{Kind: saga.EventStepAwaiting, Step: 1, StepName: "charge", CorrelationID: uuid.New(), AwaitFor: time.Minute},
		saga.Event{Kind: saga.EventPaused, Step: -1},
		saga.Event{Kind: saga.EventReplyReceived, Step: 1},
		saga.Event{Kind: saga.EventStepCompleted, Step: 1, StepName: "charge"},
	)
	v1 := replayDef(1, reserve, charge)
	cases := []struct {
		name string
		def  saga.Definition
		ran  []saga.RecordedEvent
		want string // "" when it agrees; else a part of the divergence
	}{
		{"the same definition", v1, ran, ""},
		{"a step appended", replayDef(2, reserve, charge, ship), ran, ""},
		{"a step renamed", replayDef(2, reserve, saga.Step{Name: "bill", Kind: "command", Do: noop, ReplyTimeout: time.Minute}), ran, `the journal ran "charge" here, order v2 has "bill"`},
		{"a step removed", replayDef(2, reserve), ran, "the journal ran step 1, order v2 has 1 steps"},
		{"a step inserted before", replayDef(2, ship, reserve, charge), ran, `the journal ran "reserve" here, order v2 has "ship"`},
		{"a command that no longer waits", replayDef(2, reserve, saga.Step{Name: "charge", Do: noop}), ran, "in order v2 it emits no command"},
		{"a step that now waits", replayDef(2, reserve, charge), history(
			saga.Event{Kind: saga.EventStepCompleted, Step: 0, StepName: "reserve"},
			saga.Event{Kind: saga.EventStepCompleted, Step: 1, StepName: "charge"}), "completed without waiting for a reply"},
		{"a compensation removed", replayDef(2, saga.Step{Name: "reserve", Kind: "sql", Do: noop}, charge), history(
			saga.Event{Kind: saga.EventStepCompleted, Step: 0, StepName: "reserve"},
			saga.Event{Kind: saga.EventCompensationStarted, Step: 0, StepName: "reserve"},
			saga.Event{Kind: saga.EventStepCompensated, Step: 0, StepName: "reserve"}), `compensated step "reserve", order v2 has no compensation`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := saga.Replay(c.def, c.ran)
			if c.want == "" {
				if err != nil {
					t.Fatalf("Replay: %v, want none", err)
				}
				return
			}
			var d *saga.Divergence
			if !errors.As(err, &d) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Replay: %v, want a divergence saying %q", err, c.want)
			}
			if d.InstanceID != c.ran[0].InstanceID {
				t.Fatalf("the divergence names instance %s", d.InstanceID)
			}
		})
	}
}

func TestReplayVersionComparesKinds(t *testing.T) {
	ran := history(saga.Event{Kind: saga.EventStepCompleted, Step: 0, StepName: "reserve"})
	v1 := replayDef(1, saga.Step{Name: "reserve", Kind: "sql", Do: noop})
	v2 := replayDef(2, saga.Step{Name: "reserve", Kind: "http", Do: noop})
	if err := saga.ReplayVersion(&v1, v2, ran); err == nil || !strings.Contains(err.Error(), "was a sql step in v1, it is a http step in v2") {
		t.Fatalf("ReplayVersion: %v", err)
	}
	if err := saga.ReplayVersion(&v1, v1, ran); err != nil {
		t.Fatalf("ReplayVersion of the same version: %v", err)
	}
	if err := saga.ReplayVersion(nil, v2, ran); err != nil {
		t.Fatalf("ReplayVersion without the version it ran under compares names only: %v", err)
	}
}
