package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/relaytest"
	"github.com/compensa/compensa/test/testkit"
)

// shipSaga waits in a durable step (a command's reply) between two sql
// steps; version 2 appends a step, a renamed version renames the waiting
// step.
const shipSaga = `saga: ship_it
version: VERSION
triggers: [{event_type: ship_it.requested}]
steps:
  - name: accept
    sql: {query: "SELECT 1"}
  - name: WAITSTEP
    command:
      event_type: ship_it.ship
      aggregate_type: ship_it
      aggregate_id: "${ trigger.aggregate_id }"
      payload: {}
      reply_timeout: 10m
  - name: done
    sql: {query: "SELECT 1"}
EXTRA`

func shipVersion(version int, waitStep string, extra bool) string {
	s := strings.ReplaceAll(shipSaga, "VERSION", fmt.Sprint(version))
	s = strings.ReplaceAll(s, "WAITSTEP", waitStep)
	x := ""
	if extra {
		x = "  - name: notify\n    sql: {query: \"SELECT 1\"}\n"
	}
	return strings.ReplaceAll(s, "EXTRA", x)
}

// TestUpgradeInFlight: ten instances wait in a durable step; one is paused
// and stays PAUSED through a kill -9 of the relay. A version 2 that appends
// a step is loaded by SIGHUP; replay accepts it and refuses one that renames
// the step the journals ran (exit 1, naming it); upgrade --dry-run changes
// nothing; upgrade moves all ten. The nine unpaused finish with version 2's
// new step, the paused one only after it is resumed.
func TestUpgradeInFlight(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := context.Background()
	dir := t.TempDir()
	write := func(dir, name, body string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(dir, "ship_v1.yaml", shipVersion(1, "ship", false))
	args := relayArgs(db, "--sagas", dir)
	p := relaytest.Start(t, nil, args...)

	const n = 10
	triggers := make([]uuid.UUID, n)
	for i := range triggers {
		triggers[i] = uuid.New()
		if err := writeOutbox(ctx, db, outbox.Message{ID: triggers[i], EventType: "ship_it.requested",
			AggregateType: "ship_it", AggregateID: fmt.Sprintf("s-%d", i), Payload: map[string]int{"i": i}}); err != nil {
			t.Fatal(err)
		}
	}
	testkit.WaitFor(t, time.Minute, "ten instances waiting for their reply", func() bool {
		return count(t, db, `SELECT count(*) FROM saga_instances WHERE saga_name = 'ship_it' AND current_step = 1 AND awaiting_correlation_id IS NOT NULL`) == n
	})
	paused := instanceOf(t, db, triggers[0])
	relayCLI(t, db, 0, "sagas", "pause", paused.String(), "--reason", "hold this one")
	p.Kill()
	p = relaytest.Start(t, nil, args...)
	if got := count(t, db, `SELECT count(*) FROM saga_instances WHERE id = $1 AND status = 'PAUSED'`, paused); got != 1 {
		t.Fatalf("the paused instance is not PAUSED after a kill -9: %s", dump(t, db, paused))
	}

	// Version 2, loaded by SIGHUP.
	write(dir, "ship_v2.yaml", shipVersion(2, "ship", true))
	if err := p.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 30*time.Second, "version 2 stored", func() bool {
		return count(t, db, `SELECT count(*) FROM saga_definitions WHERE saga_name = 'ship_it' AND saga_version = 2`) == 1
	})

	// Replay: version 2 continues every journal; a renamed step does not.
	out := relayCLI(t, db, 0, "sagas", "replay", dir, "--saga", "ship_it")
	if !strings.Contains(out, fmt.Sprintf("%d instance(s) replayed, 0 diverge", n)) {
		t.Fatalf("replay of a compatible version said:\n%s", out)
	}
	renamed := t.TempDir()
	write(renamed, "ship_v2.yaml", shipVersion(2, "dispatch", true))
	out = relayCLI(t, db, 1, "sagas", "replay", renamed)
	if !strings.Contains(out, `DIVERGES`) || !strings.Contains(out, `"ship"`) || !strings.Contains(out, `"dispatch"`) {
		t.Fatalf("replay of a renamed step should diverge naming it:\n%s", out)
	}

	// A dry run moves nothing; the upgrade moves all ten.
	out = relayCLI(t, db, 0, "sagas", "upgrade", "ship_it", "--from-version", "1", "--to-version", "2", "--dry-run")
	if !strings.Contains(out, fmt.Sprintf("%d instance(s) would move from v1 to v2, 0 refused; nothing was changed", n)) {
		t.Fatalf("upgrade --dry-run said:\n%s", out)
	}
	if got := count(t, db, `SELECT count(*) FROM saga_instances WHERE saga_name = 'ship_it' AND saga_version = 1`); got != n {
		t.Fatalf("the dry run moved instances: %d left on v1", got)
	}
	out = relayCLI(t, db, 0, "sagas", "upgrade", "ship_it", "--from-version", "1", "--to-version", "2")
	if !strings.Contains(out, fmt.Sprintf("%d instance(s) moved from v1 to v2, 0 refused", n)) {
		t.Fatalf("upgrade said:\n%s", out)
	}
	if got := count(t, db, `SELECT count(*) FROM saga_events e JOIN saga_instances i ON i.id = e.instance_id
		WHERE i.saga_name = 'ship_it' AND i.saga_version = 2 AND e.kind = 'upgraded' AND e.payload->>'actor' LIKE 'cli:%'`); got != n {
		t.Fatalf("%d upgraded events journaled, want %d", got, n)
	}

	// Answer every command: the nine run version 2's new step.
	answer := func() {
		t.Helper()
		if _, err := db.Pool.Exec(ctx, `INSERT INTO outbox (id, tenant_id, aggregate_type, aggregate_id, event_type, payload, correlation_id)
			SELECT gen_random_uuid(), o.tenant_id, 'ship_it', o.aggregate_id, 'ship_it.shipped', '{}'::jsonb, o.id
			FROM outbox o WHERE o.event_type = 'ship_it.ship'
			  AND NOT EXISTS (SELECT 1 FROM outbox r WHERE r.event_type = 'ship_it.shipped' AND r.correlation_id = o.id)`); err != nil {
			t.Fatal(err)
		}
	}
	answer()
	notified := `SELECT count(*) FROM saga_instances i JOIN saga_steps s ON s.saga_instance_id = i.id
		WHERE i.saga_name = 'ship_it' AND i.status = 'COMPLETED' AND i.saga_version = 2 AND s.step_name = 'notify' AND s.status = 'COMPLETED'`
	testkit.WaitFor(t, time.Minute, "the nine unpaused instances to complete with version 2's new step", func() bool {
		return count(t, db, notified) == n-1
	})
	time.Sleep(time.Second)
	if got := count(t, db, `SELECT count(*) FROM saga_instances WHERE id = $1 AND status = 'PAUSED' AND saga_version = 2`, paused); got != 1 {
		t.Fatalf("the paused instance moved on: %s", dump(t, db, paused))
	}
	relayCLI(t, db, 0, "sagas", "resume", paused.String(), "--reason", "release it")
	testkit.WaitFor(t, time.Minute, "the resumed instance to complete with version 2's new step", func() bool {
		return count(t, db, notified) == n
	})
	p.Stop(30 * time.Second)
}
