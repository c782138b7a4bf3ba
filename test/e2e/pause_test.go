package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/relaytest"
	"github.com/compensa/compensa/test/testkit"
)

// coolDownSaga holds each instance in a durable wait step, then sends a
// command whose reply it waits for.
const coolDownSaga = `saga: cool_down
version: 1
triggers: [{event_type: cool_down.requested}]
steps:
  - name: accept
    sql: {query: "SELECT 1"}
  - name: cool
    wait: {duration: 4s}
  - name: ship
    command:
      event_type: cool_down.ship
      aggregate_type: cool_down
      aggregate_id: "${ trigger.aggregate_id }"
      payload: {}
      reply_timeout: 10m
    output: { tracking: "${ reply.tracking }" }
  - name: done
    sql: {query: "SELECT 1"}
`

// TestPausedInstanceWaitsThroughAKillAndResumesWhereItStood: ten instances
// in a durable wait step; one is paused with the CLI, and stays PAUSED
// through a kill -9 of the relay and a restart while the nine others go on.
// Its wait ends while it is paused: resumed, it moves on at once. A second
// one is paused while it waits for a reply; the reply comes meanwhile
// through the correlator, is kept, and is used when it is resumed. Every
// pause and resume is in the journal with who and why.
func TestPausedInstanceWaitsThroughAKillAndResumesWhereItStood(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := context.Background()
	dir := t.TempDir()
	writeSaga(t, dir, "cool_down.yaml", coolDownSaga, "")
	args := relayArgs(db, "--sagas", dir)
	p := relaytest.Start(t, nil, args...)

	const n = 10
	triggers := make([]uuid.UUID, n)
	for i := range triggers {
		triggers[i] = uuid.New()
		if err := writeOutbox(ctx, db, outbox.Message{ID: triggers[i], EventType: "cool_down.requested",
			AggregateType: "cool_down", AggregateID: fmt.Sprintf("c-%d", i), Payload: map[string]int{"i": i}}); err != nil {
			t.Fatal(err)
		}
	}
	atStep := func(step int, status string) int {
		return count(t, db, `SELECT count(*) FROM saga_instances WHERE saga_name = 'cool_down' AND current_step = $1 AND status::text = $2`, step, status)
	}
	testkit.WaitFor(t, time.Minute, "ten instances in their wait step", func() bool { return atStep(1, "RUNNING") == n })
	paused := instanceOf(t, db, triggers[0])

	cli := func(want int, a ...string) string { t.Helper(); return relayCLI(t, db, want, a...) }
	out := cli(0, "sagas", "pause", paused.String(), "--reason", "customer on hold")
	if !strings.Contains(out, "PAUSED") {
		t.Fatalf("pause said: %s", out)
	}
	cli(0, "sagas", "pause", paused.String(), "--reason", "again") // already paused: nothing changes
	if out := cli(1, "sagas", "retry", paused.String(), "--reason", "x"); !strings.Contains(out, "resume") {
		t.Fatalf("a retry of a paused instance should say to resume it: %s", out)
	}

	// kill -9 and a new relay: the pause holds.
	p.Kill()
	p = relaytest.Start(t, nil, args...)

	// The nine others leave the wait and send their command; answer them.
	testkit.WaitFor(t, time.Minute, "nine commands sent", func() bool {
		return count(t, db, `SELECT count(*) FROM outbox WHERE event_type = 'cool_down.ship'`) == n-1
	})
	// Pause a second one while it waits for its reply, then answer all.
	waiting := instanceOf(t, db, triggers[1])
	cli(0, "sagas", "pause", waiting.String(), "--reason", "check the address")
	answer := func() {
		t.Helper()
		if _, err := db.Pool.Exec(ctx, `INSERT INTO outbox (id, tenant_id, aggregate_type, aggregate_id, event_type, payload, correlation_id)
			SELECT gen_random_uuid(), o.tenant_id, 'cool_down', o.aggregate_id, 'cool_down.shipped', jsonb_build_object('tracking', 'T-' || o.aggregate_id), o.id
			FROM outbox o WHERE o.event_type = 'cool_down.ship'
			  AND NOT EXISTS (SELECT 1 FROM outbox r WHERE r.event_type = 'cool_down.shipped' AND r.correlation_id = o.id)`); err != nil {
			t.Fatal(err)
		}
	}
	answer()
	testkit.WaitFor(t, time.Minute, "eight instances to complete", func() bool {
		return count(t, db, `SELECT count(*) FROM saga_instances WHERE saga_name = 'cool_down' AND status = 'COMPLETED'`) == n-2
	})
	testkit.WaitFor(t, 30*time.Second, "the reply to reach the paused instance", func() bool {
		return count(t, db, `SELECT count(*) FROM saga_instances WHERE id = $1 AND status = 'PAUSED' AND reply IS NOT NULL`, waiting) == 1
	})
	// The first one's wait has long passed: still PAUSED, at its wait step.
	time.Sleep(time.Second)
	if got := count(t, db, `SELECT count(*) FROM saga_instances WHERE id = $1 AND status = 'PAUSED' AND current_step = 1 AND paused_from = 'RUNNING'`, paused); got != 1 {
		t.Fatalf("the paused instance moved: %s", dump(t, db, paused))
	}

	// The bulk form's dry run counts both and changes nothing.
	out = cli(0, "sagas", "resume", "--filter", "saga=cool_down", "--filter", "status=PAUSED", "--reason", "go on", "--dry-run")
	if !strings.Contains(out, "2 instances match; 2 can be resumed") {
		t.Fatalf("dry run said: %s", out)
	}
	if got := count(t, db, `SELECT count(*) FROM saga_instances WHERE status = 'PAUSED'`); got != 2 {
		t.Fatalf("the dry run changed something: %d PAUSED", got)
	}
	cli(0, "sagas", "resume", paused.String(), "--reason", "customer is back")
	cli(0, "sagas", "resume", waiting.String(), "--reason", "address checked")
	answer() // the first one's command, once it is sent
	testkit.WaitFor(t, time.Minute, "all ten to complete", func() bool {
		answer()
		return count(t, db, `SELECT count(*) FROM saga_instances WHERE saga_name = 'cool_down' AND status = 'COMPLETED'`) == n
	})
	if got := count(t, db, `SELECT count(*) FROM saga_steps WHERE saga_instance_id = $1 AND step_name = 'ship' AND output->>'tracking' = 'T-c-1'`, waiting); got != 1 {
		t.Fatalf("the reply kept while paused was not used: %s", dump(t, db, waiting))
	}
	journal := count(t, db, `SELECT count(*) FROM saga_events WHERE instance_id = ANY($1) AND kind IN ('paused', 'resumed')
		AND payload->>'actor' LIKE 'cli:%' AND payload->>'reason' <> ''`, []uuid.UUID{paused, waiting})
	if journal != 4 {
		t.Fatalf("%d pause and resume events with actor and reason, want 4", journal)
	}
	if n := count(t, db, `SELECT count(*) FROM saga_instances WHERE status <> 'COMPLETED'`); n != 0 {
		t.Fatalf("%d instances did not complete", n)
	}
	p.Stop(30 * time.Second)
}

// relayCLI runs a relay command against db and checks its exit code.
func relayCLI(t *testing.T, db *pgtest.DB, want int, args ...string) string {
	t.Helper()
	out, code := relaytest.Run(t, nil, append(args, "--database-url", db.URL)...)
	if code != want {
		t.Fatalf("relay %s: exit %d, want %d:\n%s", strings.Join(args, " "), code, want, out)
	}
	return out
}

func instanceOf(t *testing.T, db *pgtest.DB, trigger uuid.UUID) uuid.UUID {
	t.Helper()
	var id uuid.UUID
	if err := db.Pool.QueryRow(context.Background(), `SELECT id FROM saga_instances WHERE trigger_event_id = $1`, trigger).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

func dump(t *testing.T, db *pgtest.DB, id uuid.UUID) string {
	var s string
	_ = db.Pool.QueryRow(context.Background(), `SELECT row_to_json(i)::text FROM saga_instances i WHERE id = $1`, id).Scan(&s)
	return s
}
