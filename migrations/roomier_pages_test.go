package migrations_test

import (
	"context"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/compensa/compensa/migrations"
	"github.com/compensa/compensa/test/pgtest"
)

// 0013 upgrades a database that holds instances in place: their rows stay
// where they are, and pages written from then on are filled to 50 %.
func TestRoomierInstancePagesUpgradeADatabaseWithSagas(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewEmptyDB(t)
	conn, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if err := migrations.ApplyThrough(ctx, conn, 12); err != nil {
		t.Fatal(err)
	}
	insert := func(n int) {
		t.Helper()
		if _, err := conn.Exec(ctx, `INSERT INTO saga_instances (tenant_id, saga_name, saga_version, trigger_event_id, context)
			SELECT gen_random_uuid(), 's', 1, gen_random_uuid(), '{"seq": 1, "currency": "EUR", "amount_cents": 4200}'
			FROM generate_series(1, $1::int)`, n); err != nil {
			t.Fatal(err)
		}
	}
	// rowsPerPage is the most instances a page holds.
	rowsPerPage := func() int {
		t.Helper()
		var n int
		if err := conn.QueryRow(ctx, `SELECT max(c) FROM (SELECT count(*) AS c FROM saga_instances
			GROUP BY (ctid::text::point)[0]) p`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	insert(200)
	before := rowsPerPage()
	var ctids []string
	if err := conn.QueryRow(ctx, `SELECT array_agg(ctid::text ORDER BY ctid) FROM saga_instances`).Scan(&ctids); err != nil {
		t.Fatal(err)
	}

	ran, err := migrations.Apply(ctx, conn, migrations.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(ran, func(m migrations.Applied) bool { return m.Version == 13 }) {
		t.Fatalf("Apply ran %v, want 0013 among them", ran)
	}
	var after []string
	if err := conn.QueryRow(ctx, `SELECT array_agg(ctid::text ORDER BY ctid) FROM saga_instances`).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ctids, after) {
		t.Fatal("the upgrade moved the instances' rows (a rewrite of the table)")
	}
	var opts []string
	if err := conn.QueryRow(ctx, `SELECT reloptions::text[] FROM pg_class WHERE oid = 'saga_instances'::regclass`).Scan(&opts); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(opts, "fillfactor=50") {
		t.Fatalf("saga_instances' options are %v, want fillfactor=50", opts)
	}
	// New pages hold fewer instances: room for the next versions.
	if _, err := conn.Exec(ctx, `TRUNCATE saga_instances`); err != nil {
		t.Fatal(err)
	}
	insert(200)
	if now := rowsPerPage(); now*10 > before*8 {
		t.Fatalf("a page holds %d instances after the upgrade, %d before: want at most 80 %% of it", now, before)
	}
}
