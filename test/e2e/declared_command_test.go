package e2e

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/relaytest"
	"github.com/compensa/compensa/test/testkit"
)

const shippingSaga = `saga: shipping
version: 1
triggers: [{event_type: parcel.ready}]
steps:
  - name: hold
    emit: [{event_type: parcel.held, payload: {parcel: "${ trigger.payload.parcel }"}}]
    compensate:
      emit: [{event_type: parcel.released, payload: {parcel: "${ trigger.payload.parcel }"}}]
  - name: ship
    command:
      event_type: shipping.requested
      aggregate_type: parcel
      aggregate_id: "${ trigger.aggregate_id }"
      payload: { parcel: "${ trigger.payload.parcel }" }
      reply_timeout: 1s
    retry: { max_attempts: 2, initial: 50ms }
    output: { tracking: "${ reply.tracking }" }
  - name: done
    emit: [{event_type: parcel.shipped, payload: {tracking: "${ steps.ship.tracking }"}}]
`

func emitEvent(t *testing.T, db *pgtest.DB, m outbox.Message) {
	t.Helper()
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := outbox.Write(ctx, tx, m); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// commandsFor lists the ids of the shipping.requested commands sent for a
// parcel, oldest first.
func commandsFor(t *testing.T, db *pgtest.DB, eventType, parcel string) []uuid.UUID {
	rows, err := db.Pool.Query(context.Background(),
		`SELECT id FROM outbox WHERE event_type = $1 AND payload->>'parcel' = $2 ORDER BY created_at, id`, eventType, parcel)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var ids []uuid.UUID
	for rows.Next() {
		var id uuid.UUID
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

// TestDeclaredCommandStep: a participant answers the command with an outbox
// row correlated by the command's id; a participant that never answers makes
// the step retry with a new command id, then compensate; a late reply to
// the old command is ignored.
func TestDeclaredCommandStep(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	dir := t.TempDir()
	writeSaga(t, dir, "shipping.yaml", shippingSaga, "")
	p := relaytest.Start(t, nil, relayArgs(db, "--sagas", dir)...)

	// The participant: answers the commands for p-ok, ignores p-silent.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		answered := map[uuid.UUID]bool{}
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			for _, id := range commandsFor(t, db, "shipping.requested", "p-ok") {
				if answered[id] {
					continue
				}
				answered[id] = true
				emitEvent(t, db, outbox.Message{EventType: "shipping.done", CorrelationID: id,
					Payload: map[string]any{"ok": true, "tracking": "T-p-ok"}})
			}
		}
	}()
	defer func() { close(stop); wg.Wait() }()

	okEvent, silentEvent := uuid.New(), uuid.New()
	emitEvent(t, db, outbox.Message{ID: okEvent, EventType: "parcel.ready", AggregateType: "parcel", AggregateID: "p-ok", Payload: map[string]any{"parcel": "p-ok"}})
	emitEvent(t, db, outbox.Message{ID: silentEvent, EventType: "parcel.ready", AggregateType: "parcel", AggregateID: "p-silent", Payload: map[string]any{"parcel": "p-silent"}})
	testkit.WaitFor(t, 60*time.Second, "both parcels' sagas to end", func() bool {
		return statusOf(t, db, okEvent) == "COMPLETED" && statusOf(t, db, silentEvent) == "COMPENSATED"
	})
	var payload string
	if err := db.Pool.QueryRow(context.Background(), `SELECT payload::text FROM outbox WHERE event_type = 'parcel.shipped'`).Scan(&payload); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(payload, "T-p-ok") {
		t.Fatalf("parcel.shipped payload %s; want the tracking from the reply", payload)
	}
	silent := commandsFor(t, db, "shipping.requested", "p-silent")
	if len(silent) != 2 || silent[0] == silent[1] {
		t.Fatalf("the silent parcel got commands %v; want 2 with different ids (one per attempt)", silent)
	}
	if n := len(commandsFor(t, db, "parcel.released", "p-silent")); n != 1 {
		t.Fatalf("the silent parcel was released %d times; want 1 (compensation)", n)
	}
	if n := len(commandsFor(t, db, "parcel.released", "p-ok")); n != 0 {
		t.Fatalf("the shipped parcel was released")
	}
	// A late reply to the first command: recorded as late, changes nothing.
	late := uuid.New()
	emitEvent(t, db, outbox.Message{ID: late, EventType: "shipping.done", CorrelationID: silent[0],
		Payload: map[string]any{"ok": true, "tracking": "T-late"}})
	testkit.WaitFor(t, 30*time.Second, "the late reply to be recorded", func() bool {
		return count(t, db, `SELECT count(*) FROM relay_inbox WHERE event_id = $1 AND outcome = 'late'`, late) == 1
	})
	if st := statusOf(t, db, silentEvent); st != "COMPENSATED" {
		t.Fatalf("after a late reply the instance is %s", st)
	}
	if n := count(t, db, `SELECT count(*) FROM outbox WHERE event_type = 'parcel.shipped'`); n != 1 {
		t.Fatalf("%d parcel.shipped rows after the late reply; want 1", n)
	}
	p.Stop(30 * time.Second)
}

const pinnedV1 = `saga: pinned
version: 1
triggers: [{event_type: pin.start}]
steps:
  - name: wait
    command: { event_type: pin.cmd, payload: { n: "${ trigger.payload.n }" }, reply_timeout: 5m }
  - name: finish
    emit: [{event_type: pin.done, payload: { version: 1, n: "${ trigger.payload.n }" }}]
`

// TestDeclaredVersionPinning: an instance started on version 1 finishes on
// version 1 after its file was replaced by version 2 and the relay
// restarted; new triggers start version 2; a changed body under a stored
// version is refused with the message that says what to do.
func TestDeclaredVersionPinning(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	dir := t.TempDir()
	writeSaga(t, dir, "pinned.yaml", pinnedV1, "")
	p := relaytest.Start(t, nil, relayArgs(db, "--sagas", dir)...)
	first := uuid.New()
	emitEvent(t, db, outbox.Message{ID: first, EventType: "pin.start", Payload: map[string]any{"n": 1}})

	testkit.WaitFor(t, 30*time.Second, "version 1's command", func() bool {

		return count(t, db, `SELECT count(*) FROM outbox WHERE event_type = 'pin.cmd'`) == 1
	})
	p.Stop(30 * time.Second)

	v2 := strings.Replace(strings.Replace(pinnedV1, "version: 1", "version: 2", 1), "version: 1, n:", "version: 2, n:", 1)
	writeSaga(t, dir, "pinned.yaml", v2, "")
	p = relaytest.Start(t, nil, relayArgs(db, "--sagas", dir)...)
	var cmd uuid.UUID
	if err := db.Pool.QueryRow(context.Background(), `SELECT id FROM outbox WHERE event_type = 'pin.cmd'`).Scan(&cmd); err != nil {
		t.Fatal(err)
	}
	emitEvent(t, db, outbox.Message{EventType: "pin.reply", CorrelationID: cmd, Payload: map[string]any{"ok": true}})
	second := uuid.New()
	emitEvent(t, db, outbox.Message{ID: second, EventType: "pin.start", Payload: map[string]any{"n": 2}})
	testkit.WaitFor(t, 30*time.Second, "the first instance to complete", func() bool { return statusOf(t, db, first) == "COMPLETED" })
	var version int
	var done json.RawMessage
	if err := db.Pool.QueryRow(context.Background(), `SELECT saga_version FROM saga_instances WHERE trigger_event_id = $1`, first).Scan(&version); err != nil {
		t.Fatal(err)
	}
	if err := db.Pool.QueryRow(context.Background(), `SELECT payload FROM outbox WHERE event_type = 'pin.done'`).Scan(&done); err != nil {
		t.Fatal(err)
	}
	if version != 1 || !strings.Contains(string(done), `"version": 1`) {
		t.Fatalf("the first instance ran on version %d and emitted %s; want version 1 throughout", version, done)
	}
	testkit.WaitFor(t, 30*time.Second, "the second trigger to start an instance", func() bool { return statusOf(t, db, second) != "" })
	if err := db.Pool.QueryRow(context.Background(), `SELECT saga_version FROM saga_instances WHERE trigger_event_id = $1`, second).Scan(&version); err != nil {
		t.Fatal(err)
	}
	if version != 2 {
		t.Fatalf("a new trigger started version %d; want 2", version)
	}
	p.Stop(30 * time.Second)

	// Version 2 edited in place: refused, nothing starts.
	writeSaga(t, dir, "pinned.yaml", strings.Replace(v2, "reply_timeout: 5m", "reply_timeout: 4m", 1), "")
	out, code := relaytest.Run(t, nil, append([]string{"run", "--http-addr", "127.0.0.1:0"}, relayArgs(db, "--sagas", dir)...)...)
	if code != 2 || !strings.Contains(out, "pinned version 2 changed since it was first loaded; give the new definition version 3") {
		t.Fatalf("a changed body under version 2: exit %d\n%s", code, out)
	}
}
