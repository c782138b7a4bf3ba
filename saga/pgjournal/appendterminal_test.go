package pgjournal_test

import (
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/compensa/compensa/saga"
)

// TestAppendTerminalIsAppendThenMarkTerminal: the runner's one-write ending
// of a saga leaves the same projection and history as Append followed by
// MarkTerminal, and a writer without the lease changes nothing.
func TestAppendTerminalIsAppendThenMarkTerminal(t *testing.T) {
	b := setup(t)
	ev := saga.Event{Kind: saga.EventStepCompleted, Step: 0, StepName: "only", State: []byte(`{"done":true}`), Output: []byte(`"out"`)}

	two := b.claimed(t, time.Minute)
	if _, err := b.j.Append(ctx, two.ID, two.LeaseID.UUID, ev); err != nil {
		t.Fatal(err)
	}
	if ok, err := b.j.MarkTerminal(ctx, two.ID, two.LeaseID.UUID, saga.StatusCompleted, ""); !ok || err != nil {
		t.Fatalf("mark terminal: %t %v", ok, err)
	}

	one := b.claimed(t, time.Minute)
	v, err := b.j.AppendTerminal(ctx, one.ID, one.LeaseID.UUID, ev, saga.StatusCompleted, "")
	if err != nil {
		t.Fatal(err)
	}
	if v != 2 {
		t.Fatalf("version %d, want 2 (the step's event, then the terminal one)", v)
	}
	got, want := get(t, b, one.ID), get(t, b, two.ID)
	if got.Status != saga.StatusCompleted || got.Status != want.Status || got.CurrentStep != want.CurrentStep ||
		got.Version != want.Version || got.LeaseID.Valid || got.CompletedAt == nil || string(got.Context) != string(want.Context) {
		t.Fatalf("projection after AppendTerminal %+v, after Append+MarkTerminal %+v", got, want)
	}
	hg, hw := load(t, b, one.ID), load(t, b, two.ID)
	if len(hg) != 2 || len(hw) != 2 || hg[0].Kind != hw[0].Kind || hg[1].Kind != hw[1].Kind || hg[1].Kind != saga.EventCompleted {
		t.Fatalf("history %v, want %v", kinds(hg), kinds(hw))
	}
	steps, err := b.j.Steps(ctx, one.ID)
	if err != nil || len(steps) != 1 || steps[0].Status != saga.StepCompleted || string(steps[0].Output) != `"out"` {
		t.Fatalf("steps %+v %v", steps, err)
	}

	// A stale lease: nothing at all is written, not even the step's event.
	stale := b.claimed(t, time.Minute)
	_, err = b.j.AppendTerminal(ctx, stale.ID, uuid.New(), ev, saga.StatusCompleted, "")
	if !errors.Is(err, saga.ErrLeaseLost) {
		t.Fatalf("stale lease: %v, want ErrLeaseLost", err)
	}
	if p := get(t, b, stale.ID); p.Status != saga.StatusRunning || p.Version != 0 || p.CurrentStep != 0 {
		t.Fatalf("after a refused AppendTerminal: %+v", p)
	}
	// A status that is not terminal: refused, nothing written.
	_, err = b.j.AppendTerminal(ctx, stale.ID, stale.LeaseID.UUID, ev, saga.StatusRunning, "")
	if !errors.Is(err, saga.ErrInvalid) {
		t.Fatalf("non-terminal status: %v, want ErrInvalid", err)
	}
	if h := load(t, b, stale.ID); len(h) != 0 {
		t.Fatalf("history after refused writes: %v", kinds(h))
	}
}

func get(t *testing.T, b bundle, id uuid.UUID) saga.Instance {
	t.Helper()
	inst, err := b.j.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	return inst
}

func load(t *testing.T, b bundle, id uuid.UUID) []saga.RecordedEvent {
	t.Helper()
	h, err := b.j.Load(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func kinds(h []saga.RecordedEvent) []saga.EventKind {
	var out []saga.EventKind
	for _, e := range h {
		out = append(out, e.Kind)
	}
	return out
}
