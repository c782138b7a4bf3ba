package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/relaytest"
	"github.com/compensa/compensa/test/testkit"
)

// TestResyncKilledMidwayResumes: with --on-slot-lost=resync, a relay SIGKILLed
// after it re-created the lost slot and before it re-read the outbox window
// leaves a marker in relay_checkpoints; the next relay finds a healthy slot,
// and still re-reads the window before streaming from it, so every outbox row
// of the window starts its saga exactly once. Without the marker the next
// start would stream from the new slot and never see those rows.
func TestResyncKilledMidwayResumes(t *testing.T) {
	t.Parallel()
	relaytest.Binary(t) // built once per test binary: not this test's time
	began := time.Now()
	db := pgtest.NewDB(t)
	ctx := context.Background()
	args := relayArgs(db, "--on-slot-lost", "resync", "--resync-margin", "1m")

	p := relaytest.Start(t, nil, args...)
	t.Logf("first relay serving after %s", time.Since(began).Round(time.Millisecond))
	first := createBrief(t, db, "before the slot is lost", true)
	testkit.WaitFor(t, 30*time.Second, "the first saga", func() bool { return instancesFor(t, db, first) == 1 })
	p.Stop(30 * time.Second)

	// The walsender of the stopped relay may linger a moment.
	testkit.WaitFor(t, 30*time.Second, "the slot to be dropped", func() bool {
		_, err := db.Pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, db.Slot)
		return err == nil
	})
	var window []uuid.UUID
	for range 20 {
		window = append(window, createBrief(t, db, "written while the slot is lost", true))
	}

	// The failpoint SIGKILLs the relay when the first batch of the re-read
	// reaches the correlator: the slot is new, the window unread.
	crashing := relaytest.Launch(t, []string{"RELAY_FAILPOINT=crash-before-snapshot-batch:1"}, args...)
	if _, exited := crashing.Wait(60 * time.Second); !exited {
		t.Fatalf("the relay with the failpoint did not die\n%s", crashing.Output())
	}
	t.Logf("the relay killed itself mid-resync after %s", time.Since(began).Round(time.Millisecond))
	if !strings.Contains(crashing.Output(), "replication slot lost: re-creating it") {
		t.Fatalf("the relay died before its resync began\n%s", crashing.Output())
	}
	if n := count(t, db, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, db.Slot); n != 1 {
		t.Fatalf("the killed resync had not re-created the slot yet (%d slots): the kill missed its moment\n%s", n, crashing.Output())
	}
	for _, ev := range window {
		if n := instancesFor(t, db, ev); n != 0 {
			t.Fatalf("a row of the window started its saga before the kill (%d): the kill missed its moment", n)
		}
	}
	if n := count(t, db, `SELECT count(*) FROM relay_checkpoints WHERE slot_name = $1 AND resync_checkpoint IS NOT NULL`, db.Slot); n != 1 {
		t.Errorf("no resync marker after the kill")
	}

	p = relaytest.Start(t, nil, args...)
	testkit.WaitFor(t, 45*time.Second, "every row of the window to start its saga", func() bool {
		return count(t, db, `SELECT count(*) FROM saga_instances WHERE trigger_event_id = ANY($1)`, window) >= len(window)
	})
	t.Logf("the window's sagas started after %s", time.Since(began).Round(time.Millisecond))
	for _, ev := range append([]uuid.UUID{first}, window...) {
		if n := instancesFor(t, db, ev); n != 1 {
			t.Errorf("trigger %s started %d sagas, want 1", ev, n)
		}
	}
	testkit.WaitFor(t, 10*time.Second, "the resync marker to be cleared", func() bool {
		return count(t, db, `SELECT count(*) FROM relay_checkpoints WHERE slot_name = $1 AND resync_checkpoint IS NOT NULL`, db.Slot) == 0
	})
	if !strings.Contains(p.Output(), "resuming a resync that did not finish") {
		t.Errorf("the restarted relay did not say it resumed the resync:\n%s", p.Output())
	}
	p.Stop(30 * time.Second)
}
