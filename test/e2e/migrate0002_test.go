package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/compensa/compensa/migrations"
	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/relaytest"
	"github.com/compensa/compensa/test/testkit"
)

// plainSQLInsert is the statement README.md's producer section shows first:
// no id, the default outbox table fills it in.
const plainSQLInsert = `INSERT INTO outbox (tenant_id, aggregate_type, aggregate_id, event_type, payload)
VALUES ($1, 'research_brief', $2, 'research_brief.created', $3)`

// writeBriefPlainSQL commits a brief and its outbox row the way a Java, Python
// or psql producer does: the plain-SQL statement, no id invented.
func writeBriefPlainSQL(t *testing.T, pool interface {
	Begin(context.Context) (pgx.Tx, error)
}, title string) uuid.UUID {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	brief, tenant := uuid.New(), uuid.New()
	if _, err := tx.Exec(ctx, `INSERT INTO research_briefs (id, tenant_id, title, body) VALUES ($1, $2, $3, 'Plain SQL producers.')`,
		brief, tenant, title); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, plainSQLInsert, tenant, brief.String(), fmt.Sprintf(`{"brief_id": %q}`, brief)); err != nil {
		t.Fatalf("the plain-SQL outbox insert: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	return brief
}

func sagasForBriefs(t *testing.T, db *pgtest.DB, briefs []uuid.UUID) int {
	ids := make([]string, len(briefs))
	for i, b := range briefs {
		ids[i] = b.String()
	}
	return count(t, db, `SELECT count(*) FROM saga_instances i JOIN outbox o ON o.id = i.trigger_event_id
		WHERE o.aggregate_id = ANY($1)`, ids)
}

func TestPlainSQLOutboxRowsWithoutAnIDStartTheirSagas(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	p := relaytest.Start(t, nil, relayArgs(db)...)
	var briefs []uuid.UUID
	for i := 0; i < 5; i++ {
		briefs = append(briefs, writeBriefPlainSQL(t, db.Pool, fmt.Sprintf("plain SQL %d", i)))
	}
	testkit.WaitFor(t, 60*time.Second, "5 sagas started by plain-SQL rows", func() bool {
		return sagasForBriefs(t, db, briefs) == 5
	})
	p.Stop(30 * time.Second)
}

// migrateLikeTheFirstRelease applies what the previous release shipped (core
// 0001 only, recorded as its migrator recorded it), plus the example schema.
func migrateLikeTheFirstRelease(t *testing.T, ctx context.Context, conn *pgx.Conn) {
	t.Helper()
	core, err := migrations.List(migrations.Options{WithExamples: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE compensa_schema_migrations (
		set_name text NOT NULL, version integer NOT NULL, name text NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (set_name, version))`); err != nil {
		t.Fatal(err)
	}
	for _, m := range core {
		if m.Set == migrations.Core && m.Version > 1 {
			continue
		}
		if _, err := conn.Exec(ctx, m.SQL); err != nil {
			t.Fatalf("%s %d: %v", m.Set, m.Version, err)
		}
		if _, err := conn.Exec(ctx, `INSERT INTO compensa_schema_migrations (set_name, version, name) VALUES ($1, $2, $3)`,
			string(m.Set), m.Version, m.Name); err != nil {
			t.Fatal(err)
		}
	}
}

// A database the previous release migrated (0001 only), with outbox rows and
// a dead letter parked twice by a replay: `relay migrate` brings 0002, the
// old rows stay, the duplicate folds into one, and plain-SQL rows start sagas.
func TestMigration0002OnADatabaseOfThePreviousRelease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewEmptyDB(t)
	conn, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	migrateLikeTheFirstRelease(t, ctx, conn)
	if _, err := conn.Exec(ctx, plainSQLInsert, uuid.New(), "x", `{}`); err == nil || !strings.Contains(err.Error(), `"id"`) {
		t.Fatalf("before 0002 the plain insert should fail on the id, got %v", err)
	}
	old := uuid.New()
	if _, err := conn.Exec(ctx, `INSERT INTO outbox (id, event_type, payload) VALUES ($1, 'old.event', '{}')`, old); err != nil {
		t.Fatal(err)
	}
	parked := uuid.NewString()
	if _, err := conn.Exec(ctx, `INSERT INTO relay_dead_letters (event_id, event_type, lsn, reason, raw) VALUES
		($1, 't', '0/10', 'first', '{}'), ($1, 't', '0/20', 'replayed', '{}'), ('(no id) #1', 't', '0/10', 'a', '{}'), ('(no id) #1', 't', '0/20', 'b', '{}')`, parked); err != nil {
		t.Fatal(err)
	}

	out, code := relaytest.Run(t, nil, "migrate", "--with-examples", "--database-url", db.URL)
	if code != 0 || !strings.Contains(out, "applied core 0002_") || strings.Contains(out, "core 0001") {
		t.Fatalf("relay migrate on a 0001 database: code %d\n%s", code, out)
	}
	var def string
	if err := conn.QueryRow(ctx, `SELECT coalesce(column_default, '') FROM information_schema.columns
		WHERE table_name = 'outbox' AND column_name = 'id'`).Scan(&def); err != nil || def != "gen_random_uuid()" {
		t.Fatalf("outbox.id default = %q (%v), want gen_random_uuid()", def, err)
	}
	var n int
	conn.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE id = $1`, old).Scan(&n)
	if n != 1 {
		t.Fatalf("the old outbox row is gone")
	}
	var reasons string
	conn.QueryRow(ctx, `SELECT string_agg(reason, ',' ORDER BY id) FROM relay_dead_letters`).Scan(&reasons)
	if reasons != "first,a,b" {
		t.Fatalf("dead letters after 0002: %q, want first,a,b (a duplicate event folded into its first row; rows without id kept)", reasons)
	}

	pool, err := pgtest.Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	db.Pool = pool
	p := relaytest.Start(t, nil, relayArgs(db)...)
	var briefs []uuid.UUID
	for i := 0; i < 3; i++ {
		briefs = append(briefs, writeBriefPlainSQL(t, pool, fmt.Sprintf("after the upgrade %d", i)))
	}
	testkit.WaitFor(t, 60*time.Second, "3 sagas started by plain-SQL rows after the upgrade", func() bool {
		return sagasForBriefs(t, db, briefs) == 3
	})
	p.Stop(30 * time.Second)
}

// An outbox of the application's own is left as its owner made it: no
// public.outbox appears, and a mapped table named outbox gets no id default.
func TestMigrateLeavesTheApplicationsOwnOutboxAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("another schema", func(t *testing.T) {
		db := pgtest.NewEmptyDB(t)
		conn, err := pgx.Connect(ctx, db.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, `CREATE SCHEMA events; CREATE TABLE events.outbox (id uuid PRIMARY KEY, event_type text NOT NULL, payload jsonb NOT NULL)`); err != nil {
			t.Fatal(err)
		}
		out, code := relaytest.Run(t, nil, "migrate", "--database-url", db.URL, "--outbox-table", "events.outbox")
		if code != 0 {
			t.Fatalf("migrate: code %d\n%s", code, out)
		}
		var public bool
		conn.QueryRow(ctx, `SELECT to_regclass('public.outbox') IS NOT NULL`).Scan(&public)
		if public {
			t.Fatal("relay migrate --outbox-table events.outbox created public.outbox")
		}
		var def *string
		conn.QueryRow(ctx, `SELECT column_default FROM information_schema.columns WHERE table_schema = 'events' AND table_name = 'outbox' AND column_name = 'id'`).Scan(&def)
		if def != nil {
			t.Fatalf("events.outbox.id got a default %q", *def)
		}
	})

	t.Run("mapped columns", func(t *testing.T) {
		db := pgtest.NewEmptyDB(t)
		conn, err := pgx.Connect(ctx, db.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, `CREATE TABLE outbox (id uuid PRIMARY KEY, type text NOT NULL, payload jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
			CREATE INDEX outbox_created_at_idx ON outbox (created_at)`); err != nil {
			t.Fatal(err)
		}
		out, code := relaytest.Run(t, nil, "migrate", "--database-url", db.URL, "--outbox-columns", "event_type=type")
		if code != 0 || !strings.Contains(out, "applied core 0002_") {
			t.Fatalf("migrate: code %d\n%s", code, out)
		}
		var def *string
		conn.QueryRow(ctx, `SELECT column_default FROM information_schema.columns WHERE table_name = 'outbox' AND column_name = 'id'`).Scan(&def)
		if def != nil {
			t.Fatalf("the mapped outbox's id got a default %q", *def)
		}
	})
}
