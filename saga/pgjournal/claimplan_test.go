package pgjournal_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/pgjournal"
	"github.com/compensa/compensa/test/pgtest"
)

// TestClaimCostDoesNotGrowWithABacklogTheStatisticsMissed: a backlog of due
// instances arrives before the table's statistics have seen it (here: never
// analyzed, as after the first start or a TRUNCATE, before autovacuum's
// visit; on a live table, the statistics of a relay that kept up). The
// planner then expects a handful of due rows and, left to itself, reads and
// sorts every one of them (the control below checks that the situation is
// reproduced). A claim must still read saga_claim_idx in order and stop
// after its batch: it reads a few index entries, not the backlog.
func TestClaimCostDoesNotGrowWithABacklogTheStatisticsMissed(t *testing.T) {
	t.Parallel()
	const backlog = 20000
	pool := backlogPool(t,
		`INSERT INTO saga_instances (tenant_id, saga_name, saga_version, trigger_event_id, next_attempt_at)
		 SELECT gen_random_uuid(), 'plan', 1, gen_random_uuid(), now() - random() * interval '1 hour'
		 FROM generate_series(1, 20000)`)

	// Control: the planner's own choice reads the whole due set.
	// One sort is the claimed batch's, at the top; a second is the due
	// set's.
	if plan := explainClaim(t, pool, "EXPLAIN "); strings.Count(plan, "Sort Key:") < 2 {
		t.Fatalf("the statistics did not mislead the planner (no sort of the due set), so this test shows nothing; plan:\n%s", plan)
	}

	got, read := claimCounting(t, pool, `SELECT idx_tup_read FROM pg_stat_user_indexes WHERE indexrelname = 'saga_claim_idx'`)
	if len(got) != 10 {
		t.Fatalf("claimed %d instances, want 10", len(got))
	}
	for i := 1; i < len(got); i++ {
		if got[i].NextAttemptAt.Before(got[i-1].NextAttemptAt) {
			t.Fatalf("claim not in next_attempt_at order at %d", i)
		}
	}
	if read > 100 {
		t.Fatalf("the claim of 10 read %d entries of saga_claim_idx with %d due: it read the backlog instead of its batch", read, backlog)
	}
	// The settings ended with the claim's transaction.
	for _, name := range []string{"enable_sort", "jit", "plan_cache_mode"} {
		var v string
		if err := pool.QueryRow(ctx, `SELECT current_setting($1)`, name).Scan(&v); err != nil {
			t.Fatal(err)
		}
		var boot string
		if err := pool.QueryRow(ctx, `SELECT reset_val FROM pg_settings WHERE name = $1`, name).Scan(&boot); err != nil {
			t.Fatal(err)
		}
		if v != boot {
			t.Fatalf("%s is %q on the pool's connection after a claim, want the session's %q", name, v, boot)
		}
	}
	// Under the claim's settings the statement is neither sorted below
	// the batch nor compiled (the penalty on the batch's own sort would
	// pass the JIT thresholds: 300 ms a claim).
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, pgjournal.SQLClaimPlan); err != nil {
		t.Fatal(err)
	}
	plan := explainClaim(t, tx, "EXPLAIN (ANALYZE) ")
	if strings.Count(plan, "Sort Key:") != 1 || strings.Contains(plan, "JIT") {
		t.Fatalf("the claim's plan sorts the due set or is compiled:\n%s", plan)
	}
}

// claimCounting claims 10 through a journal on pool (one backend) and
// returns them with how much the statistics counter read by counter grew
// meanwhile; the backend's counters are flushed before each reading.
func claimCounting(t *testing.T, pool *pgxpool.Pool, counter string) ([]saga.Instance, int64) {
	t.Helper()
	j, err := pgjournal.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	before := readStat(t, pool, counter)
	got, err := j.ClaimPending(ctx, 10, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return got, readStat(t, pool, counter) - before
}

// readStat reads a statistics counter after flushing the counters of the
// pool's one backend, on which the statements measured ran.
func readStat(t *testing.T, pool *pgxpool.Pool, counter string) int64 {
	t.Helper()
	if _, err := pool.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `SELECT 1`); err != nil {
		t.Fatal(err)
	}
	var n int64
	if err := pool.QueryRow(ctx, counter).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// backlogPool is a one-connection pool (see oneConnPool) on a database of
// its own, with autovacuum off on saga_instances and stmts run.
func backlogPool(t *testing.T, stmts ...string) *pgxpool.Pool {
	t.Helper()
	db := pgtest.NewDB(t)
	pool := oneConnPool(t, db.URL)
	for _, q := range append([]string{`ALTER TABLE saga_instances SET (autovacuum_enabled = off)`}, stmts...) {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	return pool
}

// oneConnPool is a pool of one connection to url, so that a test reads the
// counters and prepared statements of the backend its statements ran on.
// It is closed when the test ends.
func oneConnPool(tb testing.TB, url string) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		tb.Fatal(err)
	}
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

// explainClaim returns the plan of a claim of 10 as prefix, EXPLAIN with
// its options, prints it.
func explainClaim(t *testing.T, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, prefix string) string {
	t.Helper()
	rows, err := q.Query(context.Background(), prefix+pgjournal.SQLClaim, nil, 10, time.Minute.Microseconds())
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(lines, "\n") + "\n"
}

// TestFairClaimReadsOnlyTheTenantsItPasses: one tenant's backlog of due
// instances, older than the one due instance of another tenant. The claim
// shared between them first looks for the tenants with due work; that look
// must descend into each tenant's own entries, not read the backlog (a sort
// of every unfinished instance, or a walk of saga_claim_idx past the older
// tenant's whole backlog to reach the newer one).
func TestFairClaimReadsOnlyTheTenantsItPasses(t *testing.T) {
	t.Parallel()
	const backlog = 20000
	pool := backlogPool(t,
		`INSERT INTO saga_instances (tenant_id, saga_name, saga_version, trigger_event_id, next_attempt_at)
		 SELECT '00000000-0000-0000-0000-00000000000a', 'plan', 1, gen_random_uuid(), now() - interval '1 hour' + g * interval '1 millisecond'
		 FROM generate_series(1, 20000) g`,
		`INSERT INTO saga_instances (tenant_id, saga_name, saga_version, trigger_event_id, next_attempt_at)
		 VALUES ('00000000-0000-0000-0000-00000000000b', 'plan', 1, gen_random_uuid(), now() - interval '1 second')`,
		`VACUUM ANALYZE saga_instances`)
	got, read := claimCounting(t, pool, `SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0)
		FROM pg_stat_user_tables WHERE relname = 'saga_instances'`)
	tenants := map[string]int{}
	for _, inst := range got {
		tenants[inst.TenantID.String()]++
	}
	if tenants["00000000-0000-0000-0000-00000000000a"] == 0 || tenants["00000000-0000-0000-0000-00000000000b"] != 1 {
		t.Fatalf("claimed %d instances over tenants %v, want both tenants served", len(got), tenants)
	}
	if read > 200 {
		t.Fatalf("the fair claim of 10 read %d rows of saga_instances with %d due: it read the backlog instead of the tenants' heads", read, backlog)
	}
}

// TestTenantLookPassesOnlyUnfinishedInstances: a tenant's history of
// finished instances, and a saga_tenant_due_idx larger than
// saga_tenant_idx (its keys change with next_attempt_at, so retries and
// waits add entries to it that saga_tenant_idx does not get). The look for
// tenants with due work, before a claim, must pass the unfinished
// instances only, whichever index the statistics favour: a prepared
// statement's generic plan, which the server takes after five runs, chose
// saga_tenant_idx and read every finished instance of the tenant.
func TestTenantLookPassesOnlyUnfinishedInstances(t *testing.T) {
	t.Parallel()
	const history = 20000
	pool := backlogPool(t,
		`INSERT INTO saga_instances (tenant_id, saga_name, saga_version, trigger_event_id, next_attempt_at, created_at)
		 SELECT '00000000-0000-0000-0000-00000000000a', 'plan', 1, gen_random_uuid(), c, c
		 FROM generate_series(1, 20010) g, LATERAL (SELECT now() - interval '1 hour' + g * interval '1 millisecond' AS c) c`,
		`UPDATE saga_instances SET next_attempt_at = next_attempt_at + interval '1 millisecond'`,
		`UPDATE saga_instances SET next_attempt_at = next_attempt_at + interval '1 millisecond'`,
		`UPDATE saga_instances SET next_attempt_at = next_attempt_at + interval '1 millisecond'`,
		`ANALYZE saga_instances`,
		`UPDATE saga_instances SET status = 'COMPLETED', completed_at = now()
		 WHERE id IN (SELECT id FROM saga_instances ORDER BY created_at LIMIT 20000)`,
		`SET plan_cache_mode = force_generic_plan`)
	got, read := claimCounting(t, pool, `SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0)
		FROM pg_stat_user_tables WHERE relname = 'saga_instances'`)
	if len(got) != 10 {
		t.Fatalf("claimed %d instances, want 10", len(got))
	}
	if read > 200 {
		t.Fatalf("the claim of 10 read %d rows of saga_instances beside %d finished ones: it read the tenant's history", read, history)
	}
}
