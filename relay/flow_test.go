package relay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/relay"
	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/admin"
	"github.com/compensa/compensa/saga/pgjournal"
	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/testkit"
)

// flowRelay starts a relay over db that runs the declared sagas of dir.
func flowRelay(t *testing.T, db *pgtest.DB, dir string) *relay.Relay {
	t.Helper()
	ctx := t.Context()
	r, err := relay.New(ctx, relay.Config{
		DatabaseURL: db.URL, Registry: saga.NewRegistry(), Slot: db.Slot, Publication: db.Publication,
		Workers: 2, StatusInterval: 200 * time.Millisecond, Sagas: dir, HTTPAddr: "127.0.0.1:0",
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return r
}

func writeSaga(t *testing.T, dir, name, body string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
}

func writeTrigger(t *testing.T, db *pgtest.DB, eventType, aggregateID, payload string) {
	t.Helper()
	ctx := t.Context()
	err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		return outbox.Write(ctx, tx, outbox.Message{AggregateType: "order", AggregateID: aggregateID, EventType: eventType, Payload: []byte(payload)})
	})
	if err != nil {
		t.Fatal(err)
	}
}

// waitStatus waits until the instance started by the trigger of aggregate
// id agg ends, and returns its status.
func flowStatus(t *testing.T, db *pgtest.DB, agg string, within time.Duration) (string, string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		var status, id string
		err := db.Pool.QueryRow(t.Context(), `SELECT i.status::text, i.id::text FROM saga_instances i
			JOIN outbox o ON o.id = i.trigger_event_id WHERE o.aggregate_id = $1`, agg).Scan(&status, &id)
		if err == nil && (status == "COMPLETED" || status == "COMPENSATED" || status == "FAILED" || status == "TIMED_OUT") {
			return status, id
		}
		if time.Now().After(deadline) {
			t.Fatalf("instance of %s after %s: %q (%v)", agg, within, status, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func notesOf(t *testing.T, db *pgtest.DB, agg string) string {
	t.Helper()
	rows, err := db.Pool.Query(t.Context(), `SELECT note FROM flow_notes WHERE agg = $1 ORDER BY seq`, agg)
	if err != nil {
		t.Fatal(err)
	}
	notes, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(notes, ",")
}

func stepStatuses(t *testing.T, db *pgtest.DB, id string) string {
	t.Helper()
	rows, err := db.Pool.Query(t.Context(), `SELECT step_name || '=' || status::text FROM saga_steps WHERE saga_instance_id = $1 ORDER BY sequence`, id)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(out, " ")
}

func eventKinds(t *testing.T, db *pgtest.DB, id string) string {
	t.Helper()
	rows, err := db.Pool.Query(t.Context(), `SELECT kind FROM saga_events WHERE instance_id = $1 ORDER BY version`, id)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(out, " ")
}

// TestDeclaredWhen runs a declared saga with when on a real PostgreSQL
// through the relay: a step whose when is false is journaled skipped, the
// saga goes on, a skipped last step completes the saga, and a compensation
// passes over a skipped step without running its compensate.
func TestDeclaredWhen(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := t.Context()
	dir := t.TempDir()
	writeSaga(t, dir, "gifts.yaml", `saga: gifts
version: 1
triggers: [{event_type: order.placed}]
steps:
  - name: reserve
    sql: {query: "INSERT INTO flow_notes (agg, note) VALUES ($1, 'reserve')", params: ["${ trigger.aggregate_id }"]}
    compensate:
      sql: {query: "INSERT INTO flow_notes (agg, note) VALUES ($1, 'undo reserve')", params: ["${ trigger.aggregate_id }"]}
  - name: gift
    when: "${ trigger.payload.gift }"
    sql: {query: "INSERT INTO flow_notes (agg, note) VALUES ($1, 'gift')", params: ["${ trigger.aggregate_id }"]}
    compensate:
      sql: {query: "INSERT INTO flow_notes (agg, note) VALUES ($1, 'undo gift')", params: ["${ trigger.aggregate_id }"]}
  - name: check
    sql: {query: "SELECT 1 WHERE $1 = 'ok'", params: ["${ trigger.payload.outcome }"], expect: one_row}
  - name: thank
    when: "${ trigger.payload.thank }"
    sql: {query: "INSERT INTO flow_notes (agg, note) VALUES ($1, 'thank')", params: ["${ trigger.aggregate_id }"]}
`)
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE flow_notes (seq bigserial, agg text, note text)`); err != nil {
		t.Fatal(err)
	}
	r := flowRelay(t, db, dir)
	t.Cleanup(func() { r.Stop(context.Background()) })

	writeTrigger(t, db, "order.placed", "skip-last", `{"gift": false, "outcome": "ok", "thank": false}`)
	writeTrigger(t, db, "order.placed", "skip-compensate", `{"gift": false, "outcome": "bad", "thank": true}`)
	writeTrigger(t, db, "order.placed", "all", `{"gift": true, "outcome": "ok", "thank": true}`)

	cases := []struct{ agg, status, notes, steps, events string }{
		{"skip-last", "COMPLETED", "reserve", "reserve=COMPLETED gift=SKIPPED check=COMPLETED thank=SKIPPED",
			"step_completed step_skipped step_completed step_skipped completed"},
		{"skip-compensate", "COMPENSATED", "reserve,undo reserve", "reserve=COMPENSATED gift=SKIPPED check=FAILED",
			"step_completed step_skipped step_failed compensation_started compensation_skipped step_compensated compensated"},
		{"all", "COMPLETED", "reserve,gift,thank", "reserve=COMPLETED gift=COMPLETED check=COMPLETED thank=COMPLETED",
			"step_completed step_completed step_completed step_completed completed"},
	}
	for _, c := range cases {
		status, id := flowStatus(t, db, c.agg, 30*time.Second)
		if status != c.status {
			t.Errorf("%s: status %s, want %s", c.agg, status, c.status)
		}
		if got := notesOf(t, db, c.agg); got != c.notes {
			t.Errorf("%s: notes %q, want %q", c.agg, got, c.notes)
		}
		if got := stepStatuses(t, db, id); got != c.steps {
			t.Errorf("%s: steps %q, want %q", c.agg, got, c.steps)
		}
		if got := eventKinds(t, db, id); got != c.events {
			t.Errorf("%s: events %q, want %q", c.agg, got, c.events)
		}
	}
	var reasons string
	if err := db.Pool.QueryRow(ctx, `SELECT string_agg(DISTINCT payload->>'reason', ',') FROM saga_events WHERE kind = 'step_skipped'`).Scan(&reasons); err != nil || reasons != "when is false" {
		t.Errorf("step_skipped reasons %q (%v), want \"when is false\"", reasons, err)
	}
}

// TestDeclaredWaitSurvivesRestart runs a wait: {duration: 5s} step on a
// real PostgreSQL through the relay, stops the relay during the wait and
// starts another: no worker holds the instance while it waits (no lease,
// due at the wait's end, no attempt counted), and the new relay resumes it
// within a second of the wait's end. A wait until a time that has passed
// goes on at once.
func TestDeclaredWaitSurvivesRestart(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := t.Context()
	dir := t.TempDir()
	writeSaga(t, dir, "cool_off.yaml", `saga: cool_off
version: 1
triggers: [{event_type: order.placed}]
steps:
  - name: before
    sql: {query: "INSERT INTO flow_notes (agg, note) VALUES ($1, 'before')", params: ["${ trigger.aggregate_id }"]}
  - name: pause
    wait: {duration: 5s}
  - name: past
    wait: {until: "${ trigger.payload.past }"}
  - name: after
    sql: {query: "INSERT INTO flow_notes (agg, note) VALUES ($1, 'after')", params: ["${ trigger.aggregate_id }"]}
`)
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE flow_notes (seq bigserial, agg text, note text)`); err != nil {
		t.Fatal(err)
	}
	r1 := flowRelay(t, db, dir)
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			r1.Stop(context.Background())
		}
	})
	writeTrigger(t, db, "order.placed", "w1", `{"past": "2001-01-01T00:00:00Z"}`)

	// The wait is journaled with its end, and nobody holds the instance.
	var id string
	var until time.Time
	deadline := time.Now().Add(30 * time.Second)
	for {
		var payload []byte
		err := db.Pool.QueryRow(ctx, `SELECT e.instance_id::text, e.payload FROM saga_events e WHERE e.kind = 'step_waiting'`).Scan(&id, &payload)
		if err == nil {
			var ev saga.Event
			if err := json.Unmarshal(payload, &ev); err != nil || ev.Until.IsZero() || ev.StepName != "pause" {
				t.Fatalf("step_waiting payload %s (%v): want the step and its until", payload, err)
			}
			until = ev.Until
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no step_waiting after 30s: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Stop the relay during the wait.
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	if err := r1.Stop(stopCtx); err != nil {
		t.Fatal(err)
	}
	cancel()
	stopped = true
	var leased bool
	var next time.Time
	var attempt int
	var status string
	if err := db.Pool.QueryRow(ctx, `SELECT lease_id IS NOT NULL AND lease_expires_at >= now(), next_attempt_at, attempt, status::text FROM saga_instances WHERE id = $1`, id).
		Scan(&leased, &next, &attempt, &status); err != nil {
		t.Fatal(err)
	}
	if leased || !next.Equal(until) || attempt != 0 || status != "RUNNING" {
		t.Fatalf("while waiting: leased %v, next_attempt_at %s (until %s), attempt %d, status %s: want no lease, due at the wait's end, no attempt", leased, next, until, attempt, status)
	}
	if time.Until(until) < time.Second {
		t.Fatalf("the relay took until %s to stop: the restart is not during the wait", time.Now())
	}
	if got := notesOf(t, db, "w1"); got != "before" {
		t.Fatalf("notes during the wait: %q", got)
	}

	// Let the new relay's poll interval grow first, so that only a timer
	// for the due instance wakes it on time.
	r2 := flowRelay(t, db, dir)
	t.Cleanup(func() { r2.Stop(context.Background()) })
	status, _ = flowStatus(t, db, "w1", 30*time.Second)
	if status != "COMPLETED" {
		t.Fatalf("status %s", status)
	}
	var resumed time.Time
	if err := db.Pool.QueryRow(ctx, `SELECT completed_at FROM saga_steps WHERE saga_instance_id = $1 AND step_name = 'pause'`, id).Scan(&resumed); err != nil {
		t.Fatal(err)
	}
	late := resumed.Sub(until)
	t.Logf("the wait ended %s after its deadline", late)
	if late < 0 || late > time.Second {
		t.Errorf("the wait step completed at %s, %s after its end %s: want within a second", resumed, late, until)
	}
	if got := notesOf(t, db, "w1"); got != "before,after" {
		t.Errorf("notes %q", got)
	}
	if got := stepStatuses(t, db, id); got != "before=COMPLETED pause=COMPLETED past=COMPLETED after=COMPLETED" {
		t.Errorf("steps %q", got)
	}
	if got := eventKinds(t, db, id); got != "step_completed step_waiting step_completed step_waiting step_completed step_completed completed" {
		t.Errorf("events %q", got)
	}
}

// TestDeclaredOnTimeout runs command steps nobody answers on a real
// PostgreSQL through the relay: on_timeout: compensate compensates at once
// after one command (the step counts as may-have-acted, so its own
// compensation runs); on_timeout: fail ends the instance FAILED with
// nothing compensated, and a manual retry then compensates.
func TestDeclaredOnTimeout(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := t.Context()
	dir := t.TempDir()
	for _, on := range []string{"compensate", "fail"} {
		writeSaga(t, dir, on+".yaml", `saga: ship_`+on+`
version: 1
triggers: [{event_type: ship.`+on+`}]
steps:
  - name: reserve
    sql: {query: "INSERT INTO flow_notes (agg, note) VALUES ($1, 'reserve')", params: ["${ trigger.aggregate_id }"]}
    compensate:
      sql: {query: "INSERT INTO flow_notes (agg, note) VALUES ($1, 'undo reserve')", params: ["${ trigger.aggregate_id }"]}
  - name: ship
    command: {event_type: ship.requested, aggregate_id: "${ trigger.aggregate_id }", reply_timeout: 1s, on_timeout: `+on+`}
    retry: {max_attempts: 5, initial: 100ms}
    compensate:
      sql: {query: "INSERT INTO flow_notes (agg, note) VALUES ($1, 'undo ship')", params: ["${ trigger.aggregate_id }"]}
`)
	}
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE flow_notes (seq bigserial, agg text, note text)`); err != nil {
		t.Fatal(err)
	}
	r := flowRelay(t, db, dir)
	t.Cleanup(func() { r.Stop(context.Background()) })
	writeTrigger(t, db, "ship.compensate", "c1", `{}`)
	writeTrigger(t, db, "ship.fail", "f1", `{}`)

	commands := func(agg string) int {
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE event_type = 'ship.requested' AND aggregate_id = $1`, agg).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	status, id := flowStatus(t, db, "c1", 30*time.Second)
	if status != "COMPENSATED" || notesOf(t, db, "c1") != "reserve,undo ship,undo reserve" || commands("c1") != 1 {
		t.Errorf("on_timeout compensate: status %s, notes %q, %d commands: want COMPENSATED, the shipment and the reservation undone, one command",
			status, notesOf(t, db, "c1"), commands("c1"))
	}
	if got := eventKinds(t, db, id); !strings.Contains(got, "step_awaiting step_failed compensation_started step_compensated") {
		t.Errorf("on_timeout compensate: events %q", got)
	}

	status, id = flowStatus(t, db, "f1", 30*time.Second)
	var lastErr string
	if err := db.Pool.QueryRow(ctx, `SELECT coalesce(last_error, '') FROM saga_instances WHERE id = $1`, id).Scan(&lastErr); err != nil {
		t.Fatal(err)
	}
	if status != "FAILED" || notesOf(t, db, "f1") != "reserve" || commands("f1") != 1 || !strings.Contains(lastErr, "nothing was compensated") {
		t.Fatalf("on_timeout fail: status %s, notes %q, %d commands, last error %q: want FAILED, nothing undone, one command, the reason",
			status, notesOf(t, db, "f1"), commands("f1"), lastErr)
	}
	j, err := pgjournal.New(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	uid, err := uuid.Parse(id)
	if err != nil {
		t.Fatal(err)
	}
	if err := j.RequestRetry(ctx, uid, "participant checked", "test"); err != nil {
		t.Fatal(err)
	}
	status, _ = flowStatus(t, db, "f1", 30*time.Second)
	for end := time.Now().Add(30 * time.Second); status == "FAILED" && time.Now().Before(end); {
		time.Sleep(50 * time.Millisecond)
		status, _ = flowStatus(t, db, "f1", 30*time.Second)
	}
	if status != "COMPENSATED" || notesOf(t, db, "f1") != "reserve,undo ship,undo reserve" {
		t.Errorf("after a retry: status %s, notes %q: want the shipment and the reservation undone", status, notesOf(t, db, "f1"))
	}
}

// concurrencySaga is a saga of three steps limited to one instance per
// aggregate at a time.
const concurrencySaga = `saga: per_account
version: 1
triggers: [{event_type: account.changed}]
concurrency: {key: "${ trigger.aggregate_id }", limit: 1}
steps:
  - name: begin
    sql: {query: "SELECT 1"}
  - name: work
    sql: {query: "SELECT pg_sleep(0.01)"}
  - name: finish
    sql: {query: "SELECT 1"}
`

// checkConcurrency reads the step records of every instance of
// per_account and checks that, per key, instances never overlap and ran in
// trigger order, and that keys progressed in parallel.
func checkConcurrency(t *testing.T, db *pgtest.DB, want int) {
	t.Helper()
	rows, err := db.Pool.Query(t.Context(), `
		SELECT i.concurrency_key, (o.payload->>'seq')::int, min(s.started_at), max(s.completed_at)
		FROM saga_instances i JOIN outbox o ON o.id = i.trigger_event_id JOIN saga_steps s ON s.saga_instance_id = i.id
		WHERE i.saga_name = 'per_account' AND i.status = 'COMPLETED'
		GROUP BY 1, 2 ORDER BY 1, 2`)
	if err != nil {
		t.Fatal(err)
	}
	type span struct {
		Key        string
		Seq        int
		Start, End time.Time
	}
	spans, err := pgx.CollectRows(rows, pgx.RowToStructByPos[span])
	if err != nil {
		t.Fatal(err)
	}
	if len(spans) != want {
		t.Fatalf("%d completed instances, want %d", len(spans), want)
	}
	for i := 1; i < len(spans); i++ {
		a, b := spans[i-1], spans[i]
		if a.Key != b.Key {
			continue
		}
		if !a.End.Before(b.Start) {
			t.Errorf("key %s: trigger %d ran %s..%s, trigger %d %s..%s: they overlap or ran out of trigger order",
				a.Key, a.Seq, a.Start.Format(time.StampMicro), a.End.Format(time.StampMicro), b.Seq, b.Start.Format(time.StampMicro), b.End.Format(time.StampMicro))
		}
	}
	overlaps := 0
	for i := range spans {
		for j := i + 1; j < len(spans); j++ {
			a, b := spans[i], spans[j]
			if a.Key != b.Key && a.Start.Before(b.End) && b.Start.Before(a.End) {
				overlaps++
			}
		}
	}
	t.Logf("%d pairs of instances of different keys ran at the same time", overlaps)
	if overlaps == 0 {
		t.Errorf("no two keys ever ran at the same time: keys did not progress in parallel")
	}
}

// TestDeclaredConcurrency runs a saga with concurrency {key, limit: 1} on a
// real PostgreSQL through two relays: 200 triggers over 10 keys; per key
// the instances never overlap and run in trigger order, while keys run in
// parallel.
func TestDeclaredConcurrency(t *testing.T) {
	testkit.SkipShort(t, "hundreds of instances under concurrency keys")
	t.Parallel()
	db := pgtest.NewDB(t)
	dir := t.TempDir()
	writeSaga(t, dir, "per_account.yaml", concurrencySaga)
	r1 := flowRelay(t, db, dir)
	t.Cleanup(func() { r1.Stop(context.Background()) })
	r2 := flowRelay(t, db, dir)
	t.Cleanup(func() { r2.Stop(context.Background()) })
	const n, keys = 200, 10
	// One transaction: the instances start together, and their order is
	// their place in it.
	err := pgx.BeginFunc(t.Context(), db.Pool, func(tx pgx.Tx) error {
		for i := range n {
			err := outbox.Write(t.Context(), tx, outbox.Message{AggregateType: "account", AggregateID: fmt.Sprintf("acct-%d", i%keys),
				EventType: "account.changed", Payload: []byte(fmt.Sprintf(`{"seq": %d}`, i))})
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for started := 0; started < n; time.Sleep(20 * time.Millisecond) {
		if err := db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM saga_instances`).Scan(&started); err != nil {
			t.Fatal(err)
		}
	}
	// Instances waiting for their key's turn are not stuck: of the due
	// instances nobody holds, at most the head of each key can be overdue.
	adm, err := admin.New(admin.Config{Pool: db.Pool, StuckAfter: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	waiting := 0
	if err := db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM saga_instances WHERE status = 'RUNNING'`).Scan(&waiting); err != nil {
		t.Fatal(err)
	}
	counts, err := adm.StuckCounts(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range counts {
		if c.Reason == admin.StuckOverdue && c.Count > keys {
			t.Errorf("%d instances called overdue while %d wait for their turn: want at most one per key (%d)", c.Count, waiting, keys)
		}
	}
	t.Logf("%d instances running or waiting; stuck counts %+v", waiting, counts)
	deadline := time.Now().Add(90 * time.Second)
	for {
		var done int
		if err := db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM saga_instances WHERE status = 'COMPLETED'`).Scan(&done); err != nil {
			t.Fatal(err)
		}
		if done == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 90s: %d of %d instances completed", done, n)
		}
		time.Sleep(100 * time.Millisecond)
	}
	checkConcurrency(t, db, n)
}

// TestDeclaredRate runs a step with rate: 20/s on a real PostgreSQL
// through two relays: its starts are spaced by 50ms across both, so no
// second holds more than 20 of them (one more for where a window's edges
// fall), where unlimited they would all run within a fraction of a second.
func TestDeclaredRate(t *testing.T) {
	testkit.SkipShort(t, "40 calls at 20 a second through two relays")
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := t.Context()
	dir := t.TempDir()
	writeSaga(t, dir, "gentle.yaml", `saga: gentle
version: 1
triggers: [{event_type: ping}]
steps:
  - name: call
    rate: 20/s
    sql: {query: "INSERT INTO rate_log (at) VALUES (clock_timestamp())"}
`)
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE rate_log (at timestamptz)`); err != nil {
		t.Fatal(err)
	}
	const n = 40
	for i := range n {
		writeTrigger(t, db, "ping", fmt.Sprint(i), `{}`)
	}
	r1 := flowRelay(t, db, dir)
	t.Cleanup(func() { r1.Stop(context.Background()) })
	r2 := flowRelay(t, db, dir)
	t.Cleanup(func() { r2.Stop(context.Background()) })
	deadline := time.Now().Add(60 * time.Second)
	for count := 0; count < n; time.Sleep(100 * time.Millisecond) {
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM rate_log`).Scan(&count); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 60s: %d of %d calls", count, n)
		}
	}
	var span float64
	var busiest int
	if err := db.Pool.QueryRow(ctx, `SELECT EXTRACT(EPOCH FROM max(at) - min(at)),
		(SELECT max(c) FROM (SELECT (SELECT count(*) FROM rate_log b WHERE b.at >= a.at AND b.at < a.at + interval '1 second') AS c FROM rate_log a) w)
		FROM rate_log`).Scan(&span, &busiest); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d calls over %.2fs, at most %d in one second", n, span, busiest)
	if busiest > 21 || span < 1.8 {
		t.Errorf("%d calls over %.2fs, %d in the busiest second: want at most 21 a second, so at least 1.95s for 40", n, span, busiest)
	}
}

// tenantKeyedSaga holds its key for an hour in a wait step, unless the
// trigger says quick.
const tenantKeyedSaga = `saga: per_customer
version: 1
triggers: [{event_type: customer.changed}]
concurrency: {key: "${ trigger.payload.customer }", limit: 1}
steps:
  - name: hold
    when: "${ trigger.payload.hold }"
    wait: {duration: 1h}
  - name: finish
    sql: {query: "SELECT 1"}
`

// A concurrency key is scoped by tenant: tenant A holding cust-42 for an
// hour does not delay tenant B's cust-42, while A's own second cust-42
// waits its turn; with scope: global the key is shared by every tenant.
func TestConcurrencyKeyIsPerTenant(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	dir := t.TempDir()
	writeSaga(t, dir, "per_customer.yaml", tenantKeyedSaga)
	writeSaga(t, dir, "shared_customer.yaml", strings.NewReplacer("per_customer", "shared_customer", "customer.changed", "shared.changed",
		"limit: 1}", "limit: 1, scope: global}").Replace(tenantKeyedSaga))
	r := flowRelay(t, db, dir)
	t.Cleanup(func() { r.Stop(context.Background()) })
	tenantA, tenantB := uuid.New(), uuid.New()
	write := func(tenant uuid.UUID, eventType, agg string, hold bool) {
		err := pgx.BeginFunc(t.Context(), db.Pool, func(tx pgx.Tx) error {
			return outbox.Write(t.Context(), tx, outbox.Message{TenantID: tenant, AggregateType: "customer", AggregateID: agg,
				EventType: eventType, Payload: []byte(fmt.Sprintf(`{"customer": "cust-42", "hold": %t}`, hold))})
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	// A takes cust-42 and holds it.
	write(tenantA, "customer.changed", "a-hold", true)
	write(tenantA, "shared.changed", "shared-a-hold", true)
	waitHeld := func(agg string) {
		for end := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			var n int
			db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM saga_instances i JOIN outbox o ON o.id = i.trigger_event_id
				WHERE o.aggregate_id = $1 AND i.awaiting_until IS NOT NULL`, agg).Scan(&n)
			if n == 1 {
				return
			}
			if time.Now().After(end) {
				t.Fatalf("the instance of %s never started its wait", agg)
			}
		}
	}
	waitHeld("a-hold")
	waitHeld("shared-a-hold")
	// B's cust-42 runs at once; A's second waits behind A's first.
	write(tenantB, "customer.changed", "b-quick", false)
	write(tenantA, "customer.changed", "a-quick", false)
	write(tenantB, "shared.changed", "shared-b-quick", false)
	if status, _ := flowStatus(t, db, "b-quick", 30*time.Second); status != "COMPLETED" {
		t.Fatalf("tenant B's cust-42: %s, want COMPLETED while tenant A holds its own cust-42", status)
	}
	time.Sleep(time.Second) // a claim round or more
	for _, agg := range []string{"a-quick", "shared-b-quick"} {
		var status string
		var steps int
		if err := db.Pool.QueryRow(t.Context(), `SELECT i.status::text, (SELECT count(*) FROM saga_steps s WHERE s.saga_instance_id = i.id)
			FROM saga_instances i JOIN outbox o ON o.id = i.trigger_event_id WHERE o.aggregate_id = $1`, agg).Scan(&status, &steps); err != nil {
			t.Fatal(err)
		}
		if status != "RUNNING" || steps != 0 {
			t.Errorf("%s: %s with %d steps run, want RUNNING and waiting for the key", agg, status, steps)
		}
	}
}
