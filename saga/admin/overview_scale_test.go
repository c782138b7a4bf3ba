//go:build overviewscale

package admin_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sort"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/compensa/compensa/saga/admin"
)

// The overview at scale: `make overview-bench` (10,000,000 instances, the
// figure of BENCHMARKS.md); `make overview-bench ROWS=100000` for a short
// run. Behind a build tag: generating the rows takes minutes.
var (
	scaleRows = flag.Int("rows", 10_000_000, "instances to generate")
	scaleRuns = flag.Int("runs", 15, "overview calls to time")
)

func TestOverviewAtScale(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	began := time.Now()
	// One INSERT ... SELECT over generate_series: 30 days of history, five
	// sagas, 100 tenants; 95% COMPLETED, 2% COMPENSATED, 0.5% TIMED_OUT,
	// 0.5% FAILED (errors with ids and numbers in them), 2% RUNNING.
	// The secondary indexes are built after the load (a sorted bulk build
	// instead of 10 million inserts into each): the same indexes, with the
	// same definitions, exist when the overview is timed.
	rows, err := b.db.Pool.Query(ctx, `SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'saga_instances' AND indexname <> 'saga_instances_pkey'`)
	if err != nil {
		t.Fatal(err)
	}
	var names, defs []string
	for rows.Next() {
		var n, d string
		if err := rows.Scan(&n, &d); err != nil {
			t.Fatal(err)
		}
		names, defs = append(names, n), append(defs, d)
	}
	rows.Close()
	for _, n := range names {
		b.exec(t, `DROP INDEX `+n)
	}
	b.exec(t, fmt.Sprintf(`
INSERT INTO saga_instances (tenant_id, saga_name, saga_version, status, current_step, trigger_event_id,
                            created_at, updated_at, completed_at, next_attempt_at, last_error)
SELECT ('00000000-0000-0000-0000-' || lpad((g %% 100)::text, 12, '0'))::uuid,
       'saga_' || (g %% 5), 1 + (g %% 2),
       st.status::saga_status,
       CASE WHEN st.status = 'FAILED' THEN 1 ELSE 0 END,
       gen_random_uuid(),
       t.created, t.created,
       CASE WHEN st.status IN ('COMPLETED','COMPENSATED','TIMED_OUT','FAILED') THEN t.created + (g %% 600) * interval '100 milliseconds' END,
       t.created,
       CASE WHEN st.status = 'FAILED' THEN 'refund ' || g || ' refused by provider: timeout after ' || (g %% 30) || 's'
            WHEN st.status = 'RUNNING' AND g %% 7 = 0 THEN 'inventory service 503 for order ' || gen_random_uuid() END
FROM generate_series(1, %d) g,
     LATERAL (SELECT now() - (%d - g) * (interval '30 days' / %d) AS created) t,
     LATERAL (SELECT CASE WHEN g %% 1000 < 950 THEN 'COMPLETED'
                          WHEN g %% 1000 < 970 THEN 'COMPENSATED'
                          WHEN g %% 1000 < 975 THEN 'TIMED_OUT'
                          WHEN g %% 1000 < 980 THEN 'FAILED'
                          ELSE 'RUNNING' END AS status) st`, *scaleRows, *scaleRows, *scaleRows))
	t.Logf("inserted %d instances in %s; building %d indexes", *scaleRows, time.Since(began).Round(time.Second), len(defs))
	for _, d := range defs {
		b.exec(t, `SET maintenance_work_mem = '256MB'; `+d)
	}
	b.exec(t, `VACUUM ANALYZE saga_instances`)
	t.Logf("generated %d instances in %s", *scaleRows, time.Since(began).Round(time.Second))

	adm := b.adm
	// The first call folds the insert's count delta into the totals.
	if _, err := adm.Overview(ctx); err != nil {
		t.Fatal(err)
	}
	var times []time.Duration
	var o admin.Overview
	for range *scaleRuns {
		start := time.Now()
		var err error
		if o, err = adm.Overview(ctx); err != nil {
			t.Fatal(err)
		}
		times = append(times, time.Since(start))
	}
	sort.Slice(times, func(i, j int) bool { return times[i] < times[j] })
	var total int64
	for _, s := range o.Sagas {
		total += s.Total
	}
	if total != int64(*scaleRows) {
		t.Fatalf("overview counts %d instances, want %d", total, *scaleRows)
	}
	var startedLastHour int64
	for _, m := range o.PerMinute {
		startedLastHour += m.Started
	}
	median, worst := times[len(times)/2], times[len(times)-1]
	load, _ := os.ReadFile("/proc/loadavg")
	t.Logf("overview at %d instances: median %s, best %s, worst %s over %d calls (sagas %d, started in the last hour %d, top errors %d); loadavg %s",
		*scaleRows, median.Round(time.Millisecond), times[0].Round(time.Millisecond), worst.Round(time.Millisecond), len(times),
		len(o.Sagas), startedLastHour, len(o.TopErrors), load)

	// A tenant-scoped overview (one tenant of 100).
	scoped := adm.ForTenant(uuid.MustParse("00000000-0000-0000-0000-000000000001"))
	var stimes []time.Duration
	for range *scaleRuns {
		start := time.Now()
		if _, err := scoped.Overview(ctx); err != nil {
			t.Fatal(err)
		}
		stimes = append(stimes, time.Since(start))
	}
	sort.Slice(stimes, func(i, j int) bool { return stimes[i] < stimes[j] })
	t.Logf("tenant-scoped overview: median %s, worst %s", stimes[len(stimes)/2].Round(time.Millisecond), stimes[len(stimes)-1].Round(time.Millisecond))
	if median > 300*time.Millisecond {
		t.Errorf("overview median %s, want under 300ms", median)
	}
}
