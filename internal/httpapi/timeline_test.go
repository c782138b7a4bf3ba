package httpapi

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/admin"
)

// TestTimelineShowsAnInterruptedAttempt: an attempt whose lease was lost
// (step_interrupted) is a bar of its own, told apart from a failed one, and
// counts among the step's attempts.
func TestTimelineShowsAnInterruptedAttempt(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	var d admin.Detail
	d.Instance.CreatedAt = t0
	d.Instance.Status = saga.StatusRunning
	d.Steps = []admin.Step{{Sequence: 0, Name: "charge"}}
	event := func(v int64, ev saga.Event, at time.Duration) admin.Event {
		payload, err := json.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		step := ev.Step
		return admin.Event{Version: v, Kind: ev.Kind, Step: &step, Payload: payload, CreatedAt: t0.Add(at)}
	}
	d.Events = []admin.Event{
		event(1, saga.Event{Kind: saga.EventStepInterrupted, Step: 0, Reason: saga.ReasonInterrupted}, 30*time.Second),
		event(2, saga.Event{Kind: saga.EventStepCompleted, Step: 0}, 31*time.Second),
	}
	tl := layoutTimeline(d, t0.Add(time.Minute))
	if len(tl.Bars) != 2 {
		t.Fatalf("%d bars, want 2: %+v", len(tl.Bars), tl.Bars)
	}
	lost, ok := tl.Bars[0], tl.Bars[1]
	if lost.Class != "attempt-interrupted" || lost.Kind != "attempt" || lost.Step != "charge" || !strings.Contains(lost.Title, "attempt 1") || !strings.Contains(lost.Title, "may have acted") {
		t.Fatalf("interrupted bar %+v", lost)
	}
	if ok.Class != "attempt-ok" || !strings.Contains(ok.Title, "attempt 2") || ok.Ms != 1000 {
		t.Fatalf("the next attempt's bar %+v", ok)
	}
}
