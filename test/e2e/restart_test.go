package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/relaytest"
	"github.com/compensa/compensa/test/testkit"
)

// restartSaga's second step fails with a data error (compensates at once)
// until restart_gate holds a row; every step and compensation logs itself.
const restartSaga = `saga: restart_me
version: 1
triggers: [{event_type: restart_me.requested}]
steps:
  - name: reserve
    sql: {query: "INSERT INTO restart_log (step) VALUES ('reserve')"}
    compensate:
      sql: {query: "INSERT INTO restart_log (step) VALUES ('unreserve')"}
  - name: charge
    sql: {query: "INSERT INTO restart_log (step) SELECT 'charge' WHERE 1 / (SELECT count(*) FROM restart_gate) = 1"}
  - name: ship
    sql: {query: "INSERT INTO restart_log (step) VALUES ('ship')"}
`

// TestRetryFromStep: an instance compensates when its second step fails; a
// restart from that step is refused while the first step is compensated,
// and with --rerun-earlier starts again at the first step; once the cause
// is fixed it completes. The restart is journaled.
func TestRetryFromStep(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE restart_log (n serial, step text); CREATE TABLE restart_gate (ok int)`); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	writeSaga(t, dir, "restart.yaml", restartSaga, "")
	p := relaytest.Start(t, nil, relayArgs(db, "--sagas", dir)...)
	trigger := uuid.New()
	if err := writeOutbox(ctx, db, outbox.Message{ID: trigger, EventType: "restart_me.requested", AggregateType: "r", AggregateID: "r-1", Payload: map[string]int{}}); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, time.Minute, "the instance to compensate", func() bool { return statusOf(t, db, trigger) == "COMPENSATED" })
	id := instanceOf(t, db, trigger)
	log := func() string {
		var s string
		if err := db.Pool.QueryRow(ctx, `SELECT coalesce(string_agg(step, ',' ORDER BY n), '') FROM restart_log`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	if got := log(); got != "reserve,unreserve" {
		t.Fatalf("log = %q before the restart", got)
	}

	out := relayCLI(t, db, 1, "sagas", "retry", id.String(), "--from-step", "charge", "--reason", "gate fixed")
	if !strings.Contains(out, "reserve") || !strings.Contains(out, "--rerun-earlier") {
		t.Fatalf("a restart past a compensated step should be refused naming it: %s", out)
	}
	relayCLI(t, db, 1, "sagas", "retry", id.String(), "--from-step", "nope", "--reason", "x")
	if _, err := db.Pool.Exec(ctx, `INSERT INTO restart_gate VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	out = relayCLI(t, db, 0, "sagas", "retry", id.String(), "--from-step", "charge", "--rerun-earlier", "--reason", "gate fixed")
	if !strings.Contains(out, "RUNNING at step 0") {
		t.Fatalf("restart said: %s", out)
	}
	testkit.WaitFor(t, time.Minute, "the restarted instance to complete", func() bool { return statusOf(t, db, trigger) == "COMPLETED" })
	if got := log(); got != "reserve,unreserve,reserve,charge,ship" {
		t.Fatalf("log = %q", got)
	}
	if n := count(t, db, `SELECT count(*) FROM saga_events WHERE instance_id = $1 AND kind = 'restarted' AND step = 0 AND payload->>'actor' LIKE 'cli:%' AND payload->>'reason' = 'gate fixed'`, id); n != 1 {
		t.Fatalf("%d restarted events", n)
	}
	p.Stop(30 * time.Second)
}
