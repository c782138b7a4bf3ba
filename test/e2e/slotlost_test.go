package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/relaytest"
	"github.com/compensa/compensa/test/testkit"
)

// A slot dropped under a running relay stops it, at once and non-zero, with a
// message that names the slot; the relay does not re-create it.
func TestDroppedSlotStopsTheRelay(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := context.Background()
	p := relaytest.Start(t, nil, relayArgs(db)...)
	ev := createBrief(t, db, "before the slot is lost", true)
	testkit.WaitFor(t, 30*time.Second, "the first saga", func() bool { return instancesFor(t, db, ev) == 1 })

	dropped := time.Now()
	testkit.WaitFor(t, 30*time.Second, "the slot to be dropped", func() bool {
		db.Pool.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, db.Slot)
		_, err := db.Pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, db.Slot)
		return err == nil
	})
	code, exited := p.Wait(20 * time.Second)
	if !exited {
		t.Fatalf("the relay kept running after its slot was dropped\n%s", p.Output())
	}
	if code != 1 {
		t.Fatalf("exit code %d, want 1\n%s", code, p.Output())
	}
	if took := time.Since(dropped); took > 15*time.Second {
		t.Errorf("the relay took %s to stop", took)
	}
	out := p.Output()
	if !strings.Contains(out, db.Slot) || !strings.Contains(out, "skipped") {
		t.Fatalf("the message should name the slot and say events may have been skipped:\n%s", out)
	}
	if n := count(t, db, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, db.Slot); n != 0 {
		t.Fatal("the relay re-created the slot by itself")
	}
}
