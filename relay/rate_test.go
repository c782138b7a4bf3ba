package relay_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/testkit"
)

// floodSagas: tenant A's flood goes through a step limited to 20 starts a
// second for every tenant (the shorthand); quick is another saga with no
// rate; fair's step is limited per tenant.
var floodSagas = map[string]string{
	"flood.yaml": `saga: flood
version: 1
triggers: [{event_type: flood.requested}]
steps:
  - name: call
    rate: 20/s
    sql: {query: "INSERT INTO rate_log (saga, at) VALUES ('flood', clock_timestamp())"}
`,
	"quick.yaml": `saga: quick
version: 1
triggers: [{event_type: quick.requested}]
steps:
  - name: only
    sql: {query: "SELECT 1"}
`,
	"fair.yaml": `saga: fair
version: 1
triggers: [{event_type: fair.requested}]
steps:
  - name: call
    rate: {limit: 20/s, per: tenant}
    sql: {query: "INSERT INTO rate_log (saga, at) VALUES ('fair', clock_timestamp())"}
`,
}

// writeTenantTriggers commits n outbox rows of eventType for tenant in one
// transaction, aggregate ids prefix-0 … prefix-(n-1).
func writeTenantTriggers(t *testing.T, db *pgtest.DB, tenant uuid.UUID, eventType, prefix string, n int) {
	t.Helper()
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = outbox.Message{TenantID: tenant, AggregateType: "job", AggregateID: fmt.Sprintf("%s-%d", prefix, i),
			EventType: eventType, Payload: []byte(`{}`)}
	}
	err := pgx.BeginFunc(t.Context(), db.Pool, func(tx pgx.Tx) error { return outbox.Write(t.Context(), tx, msgs...) })
	if err != nil {
		t.Fatal(err)
	}
}

// A rate turn is the instance's, not a worker's: 300 instances of tenant A
// waiting for the turns of a rate: 20/s step (15 seconds of turns) hold no
// worker, so tenant B's one-step saga of another kind, and B's instance of a
// step limited per tenant, finish while most of A's backlog still waits, on a
// relay with two workers (well under a second on a quiet machine). A worker
// that waited for its turn instead kept both workers waiting, and B's saga
// took as long as A's backlog.
func TestRateTurnHoldsNoWorker(t *testing.T) {
	testkit.SkipShort(t, "floods a rated step with 300 rows")
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := t.Context()
	dir := t.TempDir()
	for name, body := range floodSagas {
		writeSaga(t, dir, name, body)
	}
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE rate_log (saga text, at timestamptz)`); err != nil {
		t.Fatal(err)
	}
	r := flowRelay(t, db, dir)
	t.Cleanup(func() { r.Stop(context.Background()) })
	tenantA, tenantB := uuid.New(), uuid.New()
	writeTenantTriggers(t, db, tenantA, "flood.requested", "flood", 300)
	writeTenantTriggers(t, db, tenantA, "fair.requested", "fair-a", 100)
	// Wait until both floods are under way: their first turns were taken.
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var flood, fair int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE saga = 'flood'), count(*) FILTER (WHERE saga = 'fair') FROM rate_log`).Scan(&flood, &fair); err != nil {
			t.Fatal(err)
		}
		if flood >= 3 && fair >= 3 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the floods never started: %d and %d calls", flood, fair)
		}
	}
	began := time.Now()
	writeTenantTriggers(t, db, tenantB, "quick.requested", "quick-b", 1)
	writeTenantTriggers(t, db, tenantB, "fair.requested", "fair-b", 1)
	for _, agg := range []string{"quick-b-0", "fair-b-0"} {
		if status, _ := flowStatus(t, db, agg, 20*time.Second); status != "COMPLETED" {
			t.Fatalf("%s: %s", agg, status)
		}
	}
	took := time.Since(began)
	var pending int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM saga_instances WHERE saga_name = 'flood' AND status = 'RUNNING'`).Scan(&pending); err != nil {
		t.Fatal(err)
	}
	t.Logf("tenant B's sagas took %s with %d of tenant A's 300 rate-limited instances still waiting for their turns", took, pending)
	// A worker that waited for its turn made B wait behind the whole
	// backlog, 15 seconds of turns; a third of that leaves room for a
	// loaded machine and still tells the two apart.
	if took >= 5*time.Second {
		t.Errorf("tenant B's sagas took %s beside tenant A's rate-limited backlog (15 s of turns); want far less", took)
	}
	if pending < 200 {
		t.Errorf("only %d of A's instances still waiting: the rate of 20/s did not hold", pending)
	}
}
