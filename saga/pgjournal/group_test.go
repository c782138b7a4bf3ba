package pgjournal_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/compensa/compensa/saga"
)

// TestAppendGroupFencesEachEntryByItsOwnLease: of a group of four, one
// instance's lease has expired and one does not exist. Their entries are
// refused (ErrLeaseLost, ErrNotFound) and nothing of them is written; the
// two others are written and committed in ONE transaction (their events
// share a transaction id), one of them ended COMPLETED with its last step.
func TestAppendGroupFencesEachEntryByItsOwnLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a, lost, last := b.claimed(t, time.Minute), b.claimed(t, time.Minute), b.claimed(t, time.Minute)
	if _, err := b.db.Pool.Exec(ctx, `UPDATE saga_instances SET lease_expires_at = clock_timestamp() - interval '1 second' WHERE id = $1`, lost.ID); err != nil {
		t.Fatal(err)
	}
	missing := uuid.New()
	entries := []saga.GroupEntry{
		{InstanceID: a.ID, LeaseID: a.LeaseID.UUID, Event: stepDone(0)},
		{InstanceID: lost.ID, LeaseID: lost.LeaseID.UUID, Event: stepDone(0)},
		{InstanceID: missing, LeaseID: uuid.New(), Event: stepDone(0)},
		{InstanceID: last.ID, LeaseID: last.LeaseID.UUID, Event: stepDone(0), Final: saga.StatusCompleted},
	}
	if err := b.j.AppendGroup(ctx, entries); err != nil {
		t.Fatal(err)
	}
	for i, want := range []error{nil, saga.ErrLeaseLost, saga.ErrNotFound, nil} {
		if got := entries[i].Err; (want == nil) != (got == nil) || (want != nil && !errors.Is(got, want)) {
			t.Fatalf("entry %d: err %v, want %v", i, got, want)
		}
	}
	if entries[0].Version != 1 || entries[3].Version != 2 || entries[1].Version != 0 {
		t.Fatalf("versions %d, %d, %d: want 1 (one event), 0 (refused), 2 (step and ending)", entries[0].Version, entries[1].Version, entries[3].Version)
	}
	var xids int
	var lostEvents int
	var status string
	err := b.db.Pool.QueryRow(ctx, `SELECT
		(SELECT count(DISTINCT xid) FROM saga_events WHERE instance_id IN ($1, $2)),
		(SELECT count(*) FROM saga_events WHERE instance_id = $3),
		(SELECT status::text FROM saga_instances WHERE id = $2)`, a.ID, last.ID, lost.ID).Scan(&xids, &lostEvents, &status)
	if err != nil {
		t.Fatal(err)
	}
	if xids != 1 {
		t.Fatalf("the written entries committed in %d transactions, want 1", xids)
	}
	if lostEvents != 0 {
		t.Fatalf("the instance whose lease expired has %d events, want 0", lostEvents)
	}
	if status != "COMPLETED" {
		t.Fatalf("the entry with Final ended %s, want COMPLETED", status)
	}
}

// TestAppendGroupJoinsTheCallersTransaction: in the caller's transaction the
// group's entries are written there and vanish with its rollback.
func TestAppendGroupJoinsTheCallersTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a, c := b.claimed(t, time.Minute), b.claimed(t, time.Minute)
	tx := begin(t, b.db.Pool)
	entries := []saga.GroupEntry{
		{InstanceID: a.ID, LeaseID: a.LeaseID.UUID, Event: stepDone(0)},
		{InstanceID: c.ID, LeaseID: c.LeaseID.UUID, Event: stepDone(0)},
	}
	if err := b.j.AppendGroup(saga.ContextWithTx(ctx, tx), entries); err != nil {
		t.Fatal(err)
	}
	if entries[0].Err != nil || entries[1].Err != nil {
		t.Fatalf("refused: %v, %v", entries[0].Err, entries[1].Err)
	}
	var inTx, outside int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM saga_events WHERE instance_id IN ($1, $2)`, a.ID, c.ID).Scan(&inTx); err != nil {
		t.Fatal(err)
	}
	if err := b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM saga_events WHERE instance_id IN ($1, $2)`, a.ID, c.ID).Scan(&outside); err != nil {
		t.Fatal(err)
	}
	if inTx != 2 || outside != 0 {
		t.Fatalf("%d events inside the caller's transaction (want 2), %d visible outside before its commit (want 0)", inTx, outside)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM saga_events WHERE instance_id IN ($1, $2)`, a.ID, c.ID).Scan(&outside); err != nil || outside != 0 {
		t.Fatalf("%d events after the caller's rollback (err %v), want 0", outside, err)
	}
}

// TestHeartbeatGroupNeverWaitsForARowLock: one statement extends the held
// leases, reports a row locked by another transaction as busy (without
// waiting for it) and a lease not held as refused.
func TestHeartbeatGroupNeverWaitsForARowLock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	held, locked, stale := b.claimed(t, time.Minute), b.claimed(t, time.Minute), b.claimed(t, time.Minute)
	tx := begin(t, b.db.Pool)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM saga_instances WHERE id = $1 FOR UPDATE`, locked.ID); err != nil {
		t.Fatal(err)
	}
	hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	states, err := b.j.HeartbeatGroup(hctx, []saga.LeaseRef{
		{InstanceID: held.ID, LeaseID: held.LeaseID.UUID},
		{InstanceID: locked.ID, LeaseID: locked.LeaseID.UUID},
		{InstanceID: stale.ID, LeaseID: uuid.New()},
	}, time.Hour)
	if err != nil {
		t.Fatalf("HeartbeatGroup (it must not wait for the locked row): %v", err)
	}
	want := []saga.LeaseState{saga.LeaseExtended, saga.LeaseBusy, saga.LeaseRefused}
	for i := range want {
		if states[i] != want[i] {
			t.Fatalf("states %v, want %v", states, want)
		}
	}
	var left time.Duration
	if err := b.db.Pool.QueryRow(ctx, `SELECT extract(epoch FROM lease_expires_at - clock_timestamp()) * interval '1 second' FROM saga_instances WHERE id = $1`, held.ID).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left < 50*time.Minute {
		t.Fatalf("the held lease expires in %s, want about an hour", left)
	}
}

// TestAppendGroupRefusesAnInstanceTwice: a group naming an instance twice
// is refused whole, nothing written.
func TestAppendGroupRefusesAnInstanceTwice(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := b.claimed(t, time.Minute)
	e := saga.GroupEntry{InstanceID: a.ID, LeaseID: a.LeaseID.UUID, Event: stepDone(0)}
	err := b.j.AppendGroup(ctx, []saga.GroupEntry{e, e})
	if !errors.Is(err, saga.ErrInvalid) {
		t.Fatalf("err %v, want ErrInvalid", err)
	}
	var n int
	if err := b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM saga_events WHERE instance_id = $1`, a.ID).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d events written (err %v), want 0", n, err)
	}
}
