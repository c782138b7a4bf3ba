package journaltest

import (
	"testing"

	"github.com/google/uuid"

	"github.com/compensa/compensa/saga"
)

// testAppendGroup: each entry of a group is decided as Append (or, with
// Final, AppendTerminal) alone would decide it; a refused entry writes
// nothing of its instance and does not stop the others.
func testAppendGroup(t *testing.T, h Harness) {
	ga, ok := h.Journal.(saga.GroupAppender)
	if !ok {
		t.Skip("the journal does not implement saga.GroupAppender")
	}
	a, wrong, bad, ending := started(t, h), started(t, h), started(t, h), started(t, h)
	done := saga.Event{Kind: saga.EventStepCompleted, Step: 0}
	entries := []saga.GroupEntry{
		{InstanceID: a.ID, LeaseID: a.LeaseID.UUID, Event: done},
		{InstanceID: wrong.ID, LeaseID: uuid.New(), Event: done},
		{InstanceID: uuid.New(), LeaseID: uuid.New(), Event: done},
		{InstanceID: bad.ID, LeaseID: bad.LeaseID.UUID, Event: saga.Event{Kind: saga.EventCompleted, Step: 0}},
		{InstanceID: ending.ID, LeaseID: ending.LeaseID.UUID, Event: done, Final: saga.StatusCompleted},
	}
	if err := ga.AppendGroup(ctx, entries); err != nil {
		t.Fatalf("AppendGroup: %v", err)
	}
	if entries[0].Err != nil || entries[4].Err != nil {
		t.Fatalf("held leases refused: %v, %v", entries[0].Err, entries[4].Err)
	}
	isKind(t, "group entry with another lease id", entries[1].Err, saga.ErrLeaseLost)
	isKind(t, "group entry of an unknown instance", entries[2].Err, saga.ErrNotFound)
	isKind(t, "group entry of a kind Append refuses", entries[3].Err, saga.ErrInvalid)
	if entries[0].Version != 1 || entries[4].Version != 2 {
		t.Fatalf("versions %d and %d, want 1 (one event) and 2 (the step and the ending)", entries[0].Version, entries[4].Version)
	}
	for _, e := range entries[1:4] {
		if e.Version != 0 {
			t.Fatalf("a refused entry reports version %d", e.Version)
		}
	}
	if got := get(t, h.Journal, a.ID); got.Version != 1 || got.CurrentStep != 1 || got.Status != saga.StatusRunning {
		t.Fatalf("the written entry: %+v", got)
	}
	for _, inst := range []saga.Instance{wrong, bad} {
		if got := get(t, h.Journal, inst.ID); got.Version != 0 {
			t.Fatalf("a refused entry changed its instance: %+v", got)
		}
	}
	got := get(t, h.Journal, ending.ID)
	if got.Status != saga.StatusCompleted || got.Version != 2 || got.LeaseID.Valid {
		t.Fatalf("the entry with Final: status %s, version %d, lease %v; want COMPLETED, 2, released", got.Status, got.Version, got.LeaseID)
	}
	evs, err := h.Journal.Load(ctx, ending.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 2 || evs[0].Kind != saga.EventStepCompleted || evs[1].Kind != saga.EventCompleted {
		t.Fatalf("the ending's journal: %+v", evs)
	}
}
