package e2e

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/relaytest"
	"github.com/compensa/compensa/test/testkit"
)

// slowSaga calls a participant that takes 50 ms per call.
const slowSaga = `saga: slow_lane
version: 1
triggers: [{event_type: slow.requested}]
steps:
  - name: call
    http: { method: POST, url: "PAYSVC/work", body: {} }
`

// TestClaimsAreSharedBetweenTenants: tenant A writes a backlog of triggers
// for a saga whose step calls a 50 ms participant; once it is under way,
// tenant B writes 40. B's 40 finish while most of A's backlog still waits,
// and every one of A's completes in the end. The heavy run (20,000
// triggers) also runs the oldest-first claim, under which B's 40 finish
// only behind A's backlog.
func TestClaimsAreSharedBetweenTenants(t *testing.T) {
	t.Parallel()
	backlog := 1000
	orders := []string{"fair"}
	if testkit.Heavy() {
		backlog, orders = 20000, []string{"fair", "oldest"}
	}
	for _, order := range orders {
		t.Run(order, func(t *testing.T) { testClaimOrder(t, order, backlog) })
	}
}

func testClaimOrder(t *testing.T, order string, backlog int) {
	db := pgtest.NewDB(t)
	ctx := context.Background()
	participant := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(50 * time.Millisecond)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{}`))
	}))
	defer participant.Close()
	dir := t.TempDir()
	writeSaga(t, dir, "slow.yaml", slowSaga, participant.URL)
	p := relaytest.Start(t, nil, relayArgs(db, "--sagas", dir, "--workers", "8", "--claim-order", order)...)

	tenantA, tenantB := uuid.New(), uuid.New()
	write := func(tenant uuid.UUID, n int) {
		t.Helper()
		if _, err := db.Pool.Exec(ctx, `INSERT INTO outbox (id, tenant_id, aggregate_type, aggregate_id, event_type, payload)
			SELECT gen_random_uuid(), $1, 'lane', 'l-' || g, 'slow.requested', '{}'::jsonb FROM generate_series(1, $2) g`, tenant, n); err != nil {
			t.Fatal(err)
		}
	}
	completed := func(tenant uuid.UUID) int {
		return count(t, db, `SELECT count(*) FROM saga_instances WHERE tenant_id = $1 AND status = 'COMPLETED'`, tenant)
	}
	write(tenantA, backlog)
	testkit.WaitFor(t, 2*time.Minute, "tenant A's backlog under way", func() bool { return completed(tenantA) >= 50 })
	began := time.Now()
	write(tenantB, 40)
	testkit.WaitFor(t, time.Duration(backlog)*50*time.Millisecond/4+time.Minute, "tenant B's 40 to complete", func() bool { return completed(tenantB) == 40 })
	took := time.Since(began)
	doneA := completed(tenantA)
	t.Logf("claim order %s: tenant B's 40 completed %s after they were written, while tenant A had %d of %d done", order, took.Round(10*time.Millisecond), doneA, backlog)
	if order == "oldest" {
		if doneA < backlog*9/10 {
			t.Errorf("oldest first: tenant A had only %d of %d done when B's 40 completed", doneA, backlog)
		}
	} else if doneA > backlog/2 {
		t.Fatalf("tenant A had %d of its %d done when B's 40 completed: B waited behind A's backlog", doneA, backlog)
	}
	testkit.WaitFor(t, time.Duration(backlog)*50*time.Millisecond/4+time.Minute, "all of tenant A's backlog to complete", func() bool {
		return completed(tenantA) == backlog
	})
	if n := count(t, db, `SELECT count(*) FROM saga_instances WHERE status <> 'COMPLETED'`); n != 0 {
		t.Fatalf("%d instances did not complete", n)
	}
	p.Stop(30 * time.Second)
}
