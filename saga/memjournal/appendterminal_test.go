package memjournal_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/journaltest"
	"github.com/compensa/compensa/saga/memjournal"
)

// TestAppendTerminalIsAppendThenMarkTerminal: the one-mutation ending of a
// saga leaves what Append then MarkTerminal leave; without the lease, or
// with a status that is not terminal, nothing is written.
func TestAppendTerminalIsAppendThenMarkTerminal(t *testing.T) {
	ctx := context.Background()
	clock := journaltest.NewClock(journaltest.Epoch)
	j := memjournal.New(clock.Now)
	claim := func() saga.Instance {
		t.Helper()
		inst := saga.Instance{ID: uuid.New(), TenantID: uuid.New(), SagaName: "m", SagaVersion: 1, TriggerEventID: uuid.New()}
		if err := j.Enqueue(ctx, inst); err != nil {
			t.Fatal(err)
		}
		got, err := j.ClaimPending(ctx, 1, time.Minute)
		if err != nil || len(got) != 1 || got[0].ID != inst.ID {
			t.Fatalf("claim: %v %v", got, err)
		}
		return got[0]
	}
	ev := saga.Event{Kind: saga.EventStepCompleted, Step: 0, StepName: "only", State: []byte(`{"done":true}`)}

	two := claim()
	if _, err := j.Append(ctx, two.ID, two.LeaseID.UUID, ev); err != nil {
		t.Fatal(err)
	}
	if ok, err := j.MarkTerminal(ctx, two.ID, two.LeaseID.UUID, saga.StatusCompleted, ""); !ok || err != nil {
		t.Fatalf("mark terminal: %t %v", ok, err)
	}
	one := claim()
	if v, err := j.AppendTerminal(ctx, one.ID, one.LeaseID.UUID, ev, saga.StatusCompleted, ""); err != nil || v != 2 {
		t.Fatalf("append terminal: version %d, %v", v, err)
	}
	got, _ := j.Get(ctx, one.ID)
	want, _ := j.Get(ctx, two.ID)
	if got.Status != saga.StatusCompleted || got.Version != want.Version || got.CurrentStep != want.CurrentStep || got.LeaseID.Valid {
		t.Fatalf("after AppendTerminal %+v, after Append+MarkTerminal %+v", got, want)
	}
	hg, _ := j.Load(ctx, one.ID)
	hw, _ := j.Load(ctx, two.ID)
	if len(hg) != 2 || len(hw) != 2 || hg[0].Kind != hw[0].Kind || hg[1].Kind != saga.EventCompleted || hw[1].Kind != saga.EventCompleted {
		t.Fatalf("histories %v and %v", hg, hw)
	}

	stale := claim()
	if _, err := j.AppendTerminal(ctx, stale.ID, uuid.New(), ev, saga.StatusCompleted, ""); !errors.Is(err, saga.ErrLeaseLost) {
		t.Fatalf("stale lease: %v, want ErrLeaseLost", err)
	}
	if _, err := j.AppendTerminal(ctx, stale.ID, stale.LeaseID.UUID, ev, saga.StatusRunning, ""); !errors.Is(err, saga.ErrInvalid) {
		t.Fatalf("non-terminal status: %v, want ErrInvalid", err)
	}
	if h, _ := j.Load(ctx, stale.ID); len(h) != 0 {
		t.Fatalf("history after refused writes: %v", h)
	}
}
