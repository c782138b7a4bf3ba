package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/relaytest"
	"github.com/compensa/compensa/test/testkit"
)

const perAccountSaga = `saga: per_account
version: 1
triggers: [{event_type: account.changed}]
concurrency: {key: "${ trigger.aggregate_id }", limit: 1}
steps:
  - name: begin
    sql: {query: "SELECT 1"}
  - name: work
    sql: {query: "SELECT pg_sleep(0.02)"}
  - name: finish
    sql: {query: "SELECT 1"}
`

// TestDeclaredConcurrencySurvivesKill: 200 triggers over 10 keys of a saga
// with concurrency {key: aggregate id, limit: 1}, run by two relay
// processes, one of them killed with SIGKILL mid-run and another started:
// per key the instances never overlap (their step records' times) and run
// in trigger order, and the keys progress in parallel.
func TestDeclaredConcurrencySurvivesKill(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := context.Background()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "per_account.yaml"), []byte(perAccountSaga), 0o600); err != nil {
		t.Fatal(err)
	}
	args := relayArgs(db, "--sagas", dir, "--lease", "2s")
	p1 := relaytest.Start(t, nil, args...)
	p2 := relaytest.Start(t, nil, args...)

	const n, keys = 200, 10
	for i := range n {
		err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			return outbox.Write(ctx, tx, outbox.Message{AggregateType: "account", AggregateID: fmt.Sprintf("acct-%d", i%keys),
				EventType: "account.changed", Payload: []byte(fmt.Sprintf(`{"seq": %d}`, i))})
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	completed := func() int {
		return count(t, db, `SELECT count(*) FROM saga_instances WHERE saga_name = 'per_account' AND status = 'COMPLETED'`)
	}
	testkit.WaitFor(t, time.Minute, "a quarter of the instances to complete", func() bool { return completed() >= n/4 })
	p1.Kill()
	t.Logf("killed one relay with %d of %d instances completed", completed(), n)
	p3 := relaytest.Start(t, nil, args...)
	testkit.WaitFor(t, 3*time.Minute, "every instance to complete", func() bool { return completed() == n })
	p2.Stop(30 * time.Second)
	p3.Stop(30 * time.Second)

	rows, err := db.Pool.Query(ctx, `
		SELECT i.concurrency_key, (o.payload->>'seq')::int, min(s.started_at), max(s.completed_at)
		FROM saga_instances i JOIN outbox o ON o.id = i.trigger_event_id JOIN saga_steps s ON s.saga_instance_id = i.id
		WHERE i.saga_name = 'per_account'
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
	if len(spans) != n {
		t.Fatalf("%d instances with step records, want %d", len(spans), n)
	}
	for i := 1; i < len(spans); i++ {
		a, b := spans[i-1], spans[i]
		if a.Key == b.Key && !a.End.Before(b.Start) {
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
	t.Logf("%d instances over %d keys; %d pairs of instances of different keys ran at the same time", n, keys, overlaps)
	if overlaps == 0 {
		t.Errorf("no two keys ever ran at the same time: keys did not progress in parallel")
	}
}

// TestDeclaredWaitSurvivesKill: a wait: {duration: 5s} step outlives its
// relay process, killed with SIGKILL during the wait; a new process resumes
// the saga within a second of the wait's end.
func TestDeclaredWaitSurvivesKill(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := context.Background()
	dir := t.TempDir()
	body := `saga: cool_off
version: 1
triggers: [{event_type: order.placed}]
steps:
  - name: before
    sql: {query: "SELECT 1"}
  - name: pause
    wait: {duration: 5s}
  - name: after
    sql: {query: "SELECT 1"}
`
	if err := os.WriteFile(filepath.Join(dir, "cool_off.yaml"), []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	args := relayArgs(db, "--sagas", dir, "--lease", "2s")
	p1 := relaytest.Start(t, nil, args...)
	err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		return outbox.Write(ctx, tx, outbox.Message{AggregateType: "order", AggregateID: "o1", EventType: "order.placed", Payload: []byte(`{}`)})
	})
	if err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, time.Minute, "the wait to be journaled", func() bool {
		return count(t, db, `SELECT count(*) FROM saga_events WHERE kind = 'step_waiting'`) == 1
	})
	p1.Kill()
	var until time.Time
	if err := db.Pool.QueryRow(ctx, `SELECT (payload->>'until')::timestamptz FROM saga_events WHERE kind = 'step_waiting'`).Scan(&until); err != nil {
		t.Fatal(err)
	}
	if time.Until(until) < time.Second {
		t.Fatalf("the kill came %s before the wait's end: not during the wait", time.Until(until))
	}
	p2 := relaytest.Start(t, nil, args...)
	testkit.WaitFor(t, time.Minute, "the saga to complete", func() bool {
		return count(t, db, `SELECT count(*) FROM saga_instances WHERE status = 'COMPLETED'`) == 1
	})
	p2.Stop(30 * time.Second)
	var resumed time.Time
	if err := db.Pool.QueryRow(ctx, `SELECT completed_at FROM saga_steps WHERE step_name = 'pause'`).Scan(&resumed); err != nil {
		t.Fatal(err)
	}
	late := resumed.Sub(until)
	t.Logf("the wait ended %s after its deadline, in a new relay process", late)
	if late < 0 || late > time.Second {
		t.Errorf("the wait step completed %s after its end: want within a second", late)
	}
}
