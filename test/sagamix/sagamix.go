// Package sagamix writes a mixed set of saga instances through the real
// PostgreSQL journal, one of each state an operator meets: running (after a
// retry), waiting for a reply, failed, compensated and completed. The
// monitor's page and the CLI's tests read the same set.
package sagamix

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/compensa/compensa/saga"
)

// Steps of Definition, in order.
var Steps = []string{"reserve", "charge", "score_brief", "publish"}

// Definition is the saga the set's instances run: four steps that do
// nothing (the set is written through the journal, not run).
func Definition() saga.Definition {
	noop := func(context.Context, *saga.StepTx) error { return nil }
	d := saga.Definition{Name: "order", Version: 1, Triggers: []saga.Trigger{{EventType: "order.placed"}}}
	for _, n := range Steps {
		d.Steps = append(d.Steps, saga.Step{Name: n, Do: noop, Compensate: noop})
	}
	return d
}

// Set holds the ids of the instances Write made.
type Set struct {
	Running, Waiting, Failed, Compensated, Completed uuid.UUID
}

// All lists the set's ids.
func (s Set) All() []uuid.UUID {
	return []uuid.UUID{s.Running, s.Waiting, s.Failed, s.Compensated, s.Completed}
}

// Reasons the set's instances carry.
const (
	CompensatedReason = "step score_brief failed permanently: the brief has no sources to score"
	FailedError       = "warehouse down: 503 from https://warehouse.example/holds"
	RunningError      = "charge: payment gateway timeout after 2s"
)

// Write creates the set for tenant, with a few milliseconds between journal
// entries so that a timeline has durations to show, a retry with its
// backoff in the completed and the compensated instance, and returns it.
func Write(t testing.TB, j saga.Journal, tenant uuid.UUID) Set {
	t.Helper()
	ctx := context.Background()
	pause := func(d time.Duration) { time.Sleep(d) }
	start := func() (uuid.UUID, uuid.UUID) {
		t.Helper()
		inst := saga.Instance{ID: uuid.Must(uuid.NewV7()), TenantID: tenant, SagaName: "order", SagaVersion: 1,
			Status: saga.StatusRunning, TriggerEventID: uuid.New(), Context: json.RawMessage(`{"order":"o-1"}`)}
		if err := j.Enqueue(ctx, inst); err != nil {
			t.Fatal(err)
		}
		c, err := j.ClaimPending(ctx, 1, time.Minute)
		if err != nil || len(c) != 1 || c[0].ID != inst.ID {
			t.Fatalf("claim the new instance: %v %v", c, err)
		}
		return inst.ID, c[0].LeaseID.UUID
	}
	appendAll := func(id, lease uuid.UUID, evs ...saga.Event) {
		t.Helper()
		for _, ev := range evs {
			pause(25 * time.Millisecond)
			if _, err := j.Append(ctx, id, lease, ev); err != nil {
				t.Fatalf("append %s: %v", ev.Kind, err)
			}
		}
	}
	done := func(i int) saga.Event {
		return saga.Event{Kind: saga.EventStepCompleted, Step: i, StepName: Steps[i], Output: json.RawMessage(`{"ok":true}`)}
	}
	terminal := func(id, lease uuid.UUID, st saga.Status, reason string) {
		t.Helper()
		pause(10 * time.Millisecond)
		if ok, err := j.MarkTerminal(ctx, id, lease, st, reason); !ok || err != nil {
			t.Fatalf("MarkTerminal %s: %v %v", st, ok, err)
		}
	}
	var s Set

	var lease uuid.UUID
	s.Completed, lease = start()
	appendAll(s.Completed, lease, done(0),
		saga.Event{Kind: saga.EventStepFailed, Step: 1, StepName: Steps[1], Error: "charge: connection reset", RetryIn: 60 * time.Millisecond})
	pause(60 * time.Millisecond)
	appendAll(s.Completed, lease, done(1), done(2), done(3))
	terminal(s.Completed, lease, saga.StatusCompleted, "")

	s.Compensated, lease = start()
	appendAll(s.Compensated, lease, done(0), done(1),
		saga.Event{Kind: saga.EventStepFailed, Step: 2, StepName: Steps[2], Error: "score_brief: scorer busy", RetryIn: 80 * time.Millisecond})
	pause(80 * time.Millisecond)
	appendAll(s.Compensated, lease,
		saga.Event{Kind: saga.EventStepFailed, Step: 2, StepName: Steps[2], Error: "the brief has no sources to score"},
		saga.Event{Kind: saga.EventCompensationStarted, Step: 1, StepName: Steps[1], Reason: CompensatedReason},
		saga.Event{Kind: saga.EventStepCompensated, Step: 1, StepName: Steps[1]},
		saga.Event{Kind: saga.EventStepCompensated, Step: 0, StepName: Steps[0]})
	terminal(s.Compensated, lease, saga.StatusCompensated, CompensatedReason)

	s.Failed, lease = start()
	appendAll(s.Failed, lease, done(0),
		saga.Event{Kind: saga.EventStepFailed, Step: 1, StepName: Steps[1], Error: "card declined"},
		saga.Event{Kind: saga.EventCompensationStarted, Step: 0, StepName: Steps[0], Reason: "step charge failed permanently: card declined"},
		saga.Event{Kind: saga.EventCompensationFailed, Step: 0, StepName: Steps[0], Error: FailedError})
	terminal(s.Failed, lease, saga.StatusFailed, FailedError)

	s.Waiting, lease = start()
	appendAll(s.Waiting, lease, done(0),
		saga.Event{Kind: saga.EventStepAwaiting, Step: 1, StepName: Steps[1], CorrelationID: uuid.New(), AwaitFor: 10 * time.Minute})

	s.Running, lease = start()
	appendAll(s.Running, lease, done(0),
		saga.Event{Kind: saga.EventStepFailed, Step: 1, StepName: Steps[1], Error: RunningError, RetryIn: 30 * time.Second})
	return s
}
