package pgjournal_test

import (
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/compensa/compensa/saga/pgjournal"
	"github.com/compensa/compensa/test/pgtest"
)

// TestClaimsAreSharedBetweenTenantsInTurn: tenant A's 200 due instances
// are all older than tenant B's 5; a claim of 8 still takes B's share, and
// with 1,000 tenants the claims serve them in turn, each reading a bounded
// number of index entries whatever the backlog. The oldest-first claim,
// for contrast, takes A's oldest.
func TestClaimsAreSharedBetweenTenantsInTurn(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	pool := oneConnPool(t, db.URL)
	a, b := uuid.MustParse("aaaaaaaa-0000-0000-0000-000000000000"), uuid.MustParse("bbbbbbbb-0000-0000-0000-000000000000")
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{`INSERT INTO saga_instances (tenant_id, saga_name, saga_version, trigger_event_id, next_attempt_at)
		  SELECT $1, 'fair', 1, gen_random_uuid(), now() - interval '1 hour' + g * interval '1 ms' FROM generate_series(1, 200) g`, []any{a}},
		{`INSERT INTO saga_instances (tenant_id, saga_name, saga_version, trigger_event_id, next_attempt_at)
		  SELECT $1, 'fair', 1, gen_random_uuid(), now() - interval '1 minute' FROM generate_series(1, 5) g`, []any{b}},
	} {
		if _, err := pool.Exec(ctx, q.sql, q.args...); err != nil {
			t.Fatal(err)
		}
	}
	byTenant := func(j *pgjournal.Journal, n int) map[uuid.UUID]int {
		t.Helper()
		got, err := j.ClaimPending(ctx, n, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		out := map[uuid.UUID]int{}
		for _, inst := range got {
			out[inst.TenantID]++
		}
		return out
	}
	oldest, err := pgjournal.New(pool, &pgjournal.Config{OldestFirst: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := byTenant(oldest, 8); got[a] != 8 {
		t.Fatalf("oldest first claimed %v, want 8 of A's", got)
	}
	fair, err := pgjournal.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := byTenant(fair, 8); got[a] != 4 || got[b] != 4 {
		t.Fatalf("a fair claim of 8 took %v, want 4 of each tenant's", got)
	}
	weighted, err := pgjournal.New(pool, &pgjournal.Config{TenantWeights: map[uuid.UUID]int{a: 3}})
	if err != nil {
		t.Fatal(err)
	}
	if got := byTenant(weighted, 8); got[a] != 6 || got[b] != 1 {
		t.Fatalf("with A weighing 3, a claim of 8 took %v, want 6 of A's and B's last one", got)
	}
	if _, err := pgjournal.New(pool, &pgjournal.Config{TenantWeights: map[uuid.UUID]int{a: 0}}); err == nil {
		t.Fatal("a weight of 0 was accepted")
	}

	// 1,000 tenants with 20 due instances each: claims of 64 serve 64
	// tenants each, in turn, without reading the backlog.
	if _, err := pool.Exec(ctx, `TRUNCATE saga_instances CASCADE`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO saga_instances (tenant_id, saga_name, saga_version, trigger_event_id, next_attempt_at)
		SELECT md5('t' || (g % 1000))::uuid, 'fair', 1, gen_random_uuid(), now() - random() * interval '1 hour' FROM generate_series(1, 20000) g`); err != nil {
		t.Fatal(err)
	}
	indexReads := func() int64 {
		return readStat(t, pool, `SELECT sum(idx_tup_read) FROM pg_stat_user_indexes WHERE relname = 'saga_instances'`)
	}
	fair, err = pgjournal.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	served := map[uuid.UUID]int{}
	var most int64
	for claim := range 1000 / 64 {
		before := indexReads()
		got := byTenant(fair, 64)
		read := indexReads() - before
		if len(got) != 64 {
			t.Fatalf("claim %d served %d tenants, want 64 (one instance each)", claim, len(got))
		}
		for tenant, n := range got {
			served[tenant] += n
		}
		// Per tenant: a descent to find it, one to see it is due, one to
		// claim, each reading a few entries (about 10 a tenant today):
		// never the 20 instances it holds, let alone the backlog.
		most = max(most, read)
		if read > 64*20 {
			t.Fatalf("claim %d read %d index entries for 64 instances", claim, read)
		}
	}
	t.Logf("a claim of 64 over 1,000 tenants with 20,000 due read at most %d index entries", most)
	for tenant, n := range served {
		if n != 1 {
			t.Fatalf("tenant %s was served %d times before every tenant was served once", tenant, n)
		}
	}
}
