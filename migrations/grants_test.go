package migrations_test

import (
	"context"
	"errors"
	"net/url"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/compensa/compensa/migrations"
	"github.com/compensa/compensa/test/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// migratedDB is an empty database with the core schema applied by Apply, as
// `relay migrate` does, and a superuser connection to it.
func migratedDB(t *testing.T) (*pgtest.DB, *pgx.Conn) {
	t.Helper()
	ctx := context.Background()
	db := pgtest.NewEmptyDB(t)
	conn, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	if _, err := migrations.Apply(ctx, conn, migrations.Options{}); err != nil {
		t.Fatal(err)
	}
	return db, conn
}

// loginRole creates a LOGIN role with no privileges, dropped at the end, and
// returns its name and a URL that connects as it.
func loginRole(t *testing.T, db *pgtest.DB, conn *pgx.Conn) (string, string) {
	t.Helper()
	ctx := context.Background()
	role := db.Name + "_relay"
	if _, err := conn.Exec(ctx, `CREATE ROLE `+role+` LOGIN PASSWORD 'role-secret'`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		admin, err := pgx.Connect(ctx, db.Cluster.URL)
		if err != nil {
			return
		}
		defer admin.Close(ctx)
		pgtest.Drop(db.Cluster, db.Name)
		admin.Exec(ctx, `DROP ROLE IF EXISTS `+role)
	})
	u, err := url.Parse(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(role, "role-secret")
	return role, u.String()
}

// uncovered lists the tables and sequences of the relay's schema that the
// grant computation does not cover, and the functions it would have to
// grant EXECUTE on. Identity sequences need no grant (their nextval checks
// none); trigger functions need none either (EXECUTE is checked when the
// trigger is created, not when it fires).
func uncovered(t *testing.T, conn *pgx.Conn) []string {
	t.Helper()
	ctx := context.Background()
	req, err := migrations.Required(ctx, conn, "outbox", migrations.AllFeatures...)
	if err != nil {
		t.Fatal(err)
	}
	covered := map[string]bool{}
	for _, p := range req {
		covered[p.Kind+" "+p.Object] = true
	}
	rows, err := conn.Query(ctx, `
SELECT CASE c.relkind WHEN 'S' THEN 'sequence' ELSE 'table' END, c.oid::regclass::text
FROM pg_class c
WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p', 'S', 'v', 'm')
  AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_class'::regclass
                  AND d.objid = c.oid AND d.deptype = 'i')
UNION ALL
SELECT 'function', p.oid::regprocedure::text FROM pg_proc p
WHERE p.pronamespace = current_schema()::regnamespace AND p.prorettype <> 'trigger'::regtype
ORDER BY 1, 2`)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
		var kind, name string
		err := r.Scan(&kind, &name)
		return kind + " " + name, err
	})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, o := range objs {
		if !covered[o] {
			out = append(out, o)
		}
	}
	return out
}

// Every table, sequence and function the migrations create is covered by
// the grant computation: a migration that adds a table without adding its
// entry to migrations.Grants fails here.
func TestEveryObjectTheMigrationsCreateIsGranted(t *testing.T) {
	t.Parallel()
	_, conn := migratedDB(t)
	if u := uncovered(t, conn); len(u) > 0 {
		t.Fatalf("objects of the relay's schema that `relay migrate --grant-to` would not grant and `relay run` would not check: %v; add them to migrations.Grants", u)
	}
	// The serial column of relay_sink_parked is found in the catalog.
	req, err := migrations.Required(context.Background(), conn, "outbox", migrations.FeatureSinks)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(req, func(p migrations.Privilege) bool {
		return p.Kind == "sequence" && p.Object == "relay_sink_parked_seq_seq" && p.Privilege == "USAGE"
	}) {
		t.Fatalf("--sinks does not require USAGE on relay_sink_parked_seq_seq: %v", req)
	}
}

// The guard above is not vacuous: a table (with a serial column) added to
// the schema without an entry in the grant list is reported, and so is a
// function that is not a trigger function.
func TestATableAddedWithoutAGrantIsReported(t *testing.T) {
	t.Parallel()
	_, conn := migratedDB(t)
	ctx := context.Background()
	for _, st := range []string{
		`CREATE TABLE relay_new_feature (seq bigserial, note text)`,
		`CREATE TABLE relay_identity_only (id bigint GENERATED ALWAYS AS IDENTITY)`,
		`CREATE FUNCTION relay_new_function() RETURNS int LANGUAGE sql AS 'SELECT 1'`,
	} {
		if _, err := conn.Exec(ctx, st); err != nil {
			t.Fatal(err)
		}
	}
	got := uncovered(t, conn)
	want := []string{"function relay_new_function()", "sequence relay_new_feature_seq_seq", "table relay_identity_only", "table relay_new_feature"}
	if !slices.Equal(got, want) {
		t.Fatalf("uncovered objects: %v, want %v", got, want)
	}
}

// GrantTo gives a bare LOGIN role what every feature needs and nothing
// more: a second call grants nothing; the role owns nothing and may create
// nothing. Then each privilege, taken away alone, is the one Lacking names,
// and the statement its message gives grants it back.
func TestGrantToAndEachMissingPrivilege(t *testing.T) {
	t.Parallel()
	db, conn := migratedDB(t)
	ctx := context.Background()
	role, _ := loginRole(t, db, conn)

	ran, err := migrations.GrantTo(ctx, conn, role, "outbox")
	if err != nil {
		t.Fatal(err)
	}
	if len(ran) == 0 || !slices.Contains(ran, `GRANT USAGE ON SEQUENCE relay_sink_parked_seq_seq TO "`+role+`";`) {
		t.Fatalf("GrantTo ran %v; want a grant of the parked rows' sequence among them", ran)
	}
	for _, st := range ran {
		if strings.Contains(st, "CREATE") || strings.Contains(st, "ALL") || strings.Contains(st, "OWNER") || strings.Contains(st, "TRUNCATE") {
			t.Errorf("GrantTo ran %q", st)
		}
	}
	again, err := migrations.GrantTo(ctx, conn, role, "outbox")
	if err != nil || len(again) != 0 {
		t.Fatalf("a second GrantTo ran %v (%v); want nothing", again, err)
	}
	var createSchema, createDB bool
	var owned int
	if err := conn.QueryRow(ctx, `SELECT has_schema_privilege($1, 'public', 'CREATE'), has_database_privilege($1, current_database(), 'CREATE'),
		(SELECT count(*) FROM pg_class WHERE relowner = (SELECT oid FROM pg_roles WHERE rolname = $1))`, role).Scan(&createSchema, &createDB, &owned); err != nil {
		t.Fatal(err)
	}
	if createSchema || createDB || owned != 0 {
		t.Fatalf("the granted role: CREATE on schema %v, CREATE on database %v, owns %d relations", createSchema, createDB, owned)
	}

	all, err := migrations.Required(ctx, conn, "outbox", migrations.AllFeatures...)
	if err != nil {
		t.Fatal(err)
	}
	tested := 0
	for _, p := range all {
		if p.Kind == "schema" {
			continue // USAGE on public comes from PUBLIC; revoking it from the role changes nothing
		}
		revoke := strings.Replace(strings.Replace(p.Statement(role), "GRANT ", "REVOKE ", 1), " TO ", " FROM ", 1)
		if _, err := conn.Exec(ctx, revoke); err != nil {
			t.Fatalf("%s: %v", revoke, err)
		}
		lack, err := migrations.Lacking(ctx, conn, role, all)
		if err != nil {
			t.Fatal(err)
		}
		if len(lack) != 1 || lack[0] != p {
			t.Fatalf("after %s, Lacking = %v; want only %v", revoke, lack, p)
		}
		msg := p.Missing(role)
		if !strings.HasPrefix(msg, "missing privilege: "+p.Privilege+" on ") || !strings.Contains(msg, "relay migrate --grant-to "+role) ||
			!strings.Contains(msg, strings.TrimSuffix(p.Statement(role), ";")) || !strings.Contains(msg, string(p.Feature)) {
			t.Fatalf("message %q does not name the privilege, the feature, --grant-to and the statement", msg)
		}
		if _, err := conn.Exec(ctx, p.Statement(role)); err != nil {
			t.Fatalf("the message's statement %s: %v", p.Statement(role), err)
		}
		tested++
	}
	if lack, err := migrations.Lacking(ctx, conn, role, all); err != nil || len(lack) != 0 {
		t.Fatalf("after granting back: lacking %v (%v)", lack, err)
	}
	if tested < 25 {
		t.Fatalf("only %d privileges tested", tested)
	}
}

// `relay migrate` run by the relay's role (no CREATE anywhere) on an
// up-to-date schema is a no-op, not a permission error.
func TestMigrateAsTheGrantedRoleIsANoOp(t *testing.T) {
	t.Parallel()
	db, conn := migratedDB(t)
	ctx := context.Background()
	role, roleURL := loginRole(t, db, conn)
	if _, err := migrations.GrantTo(ctx, conn, role, "outbox"); err != nil {
		t.Fatal(err)
	}
	rc, err := pgx.Connect(ctx, roleURL)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close(ctx)
	ran, err := migrations.Apply(ctx, rc, migrations.Options{})
	if err != nil || len(ran) != 0 {
		t.Fatalf("Apply as %s on an up-to-date schema: ran %v, err %v", role, ran, err)
	}
	// A migration it would have to run is refused with the privilege named.
	if _, err := conn.Exec(ctx, `DELETE FROM compensa_schema_migrations WHERE version = 3`); err != nil {
		t.Fatal(err)
	}
	_, err = migrations.Apply(ctx, rc, migrations.Options{})
	if !errors.Is(err, migrations.ErrPrivilege) {
		t.Fatalf("Apply as %s with a migration to run: %v, want ErrPrivilege", role, err)
	}
}

// The trigger functions need no EXECUTE of the role: with PUBLIC's taken
// away, the role's insert into saga_instances still fires them.
func TestTriggerFunctionsNeedNoExecute(t *testing.T) {
	t.Parallel()
	db, conn := migratedDB(t)
	ctx := context.Background()
	role, roleURL := loginRole(t, db, conn)
	if _, err := migrations.GrantTo(ctx, conn, role, "outbox"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `REVOKE EXECUTE ON FUNCTION saga_status_count_insert(), saga_status_count_update(), saga_events_order_key() FROM PUBLIC`); err != nil {
		t.Fatal(err)
	}
	rc, err := pgx.Connect(ctx, roleURL)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close(ctx)
	if _, err := rc.Exec(ctx, `INSERT INTO saga_instances (tenant_id, saga_name, saga_version, trigger_event_id)
		VALUES (gen_random_uuid(), 's', 1, gen_random_uuid())`); err != nil {
		t.Fatalf("insert as %s with the trigger functions' EXECUTE revoked: %v", role, err)
	}
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM saga_status_deltas`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("the trigger wrote %d deltas (%v)", n, err)
	}
}

// Run by a role that owns the relay's tables but not the application's
// outbox table, GrantTo grants what it can and names each privilege it could
// not, with the statement the outbox's owner must run.
func TestGrantToNamesWhatOnlyTheOutboxOwnerCanGrant(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewEmptyDB(t)
	super, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer super.Close(ctx)
	relayRole, _ := loginRole(t, db, super)
	owner := db.Name + "_owner"
	for _, st := range []string{
		`CREATE ROLE ` + owner + ` LOGIN PASSWORD 'owner-secret'`,
		`GRANT CREATE ON SCHEMA public TO ` + owner,
		`CREATE TABLE app_events (id uuid PRIMARY KEY, event_type text NOT NULL, payload jsonb NOT NULL)`,
	} {
		if _, err := super.Exec(ctx, st); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		ctx := context.Background()
		admin, err := pgx.Connect(ctx, db.Cluster.URL)
		if err != nil {
			return
		}
		defer admin.Close(ctx)
		pgtest.Drop(db.Cluster, db.Name)
		admin.Exec(ctx, `DROP ROLE IF EXISTS `+owner)
	})
	u, _ := url.Parse(db.URL)
	u.User = url.UserPassword(owner, "owner-secret")
	oc, err := pgx.Connect(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer oc.Close(ctx)
	if _, err := migrations.Apply(ctx, oc, migrations.Options{CustomOutbox: true}); err != nil {
		t.Fatal(err)
	}
	ran, err := migrations.GrantTo(ctx, oc, relayRole, "app_events")
	if !errors.Is(err, migrations.ErrPrivilege) {
		t.Fatalf("GrantTo on an outbox the migrating role does not own: %v", err)
	}
	for _, w := range []string{
		`INSERT on table app_events (as the object's owner: GRANT INSERT ON app_events TO "` + relayRole + `";)`,
		`SELECT on table app_events (as the object's owner: GRANT SELECT ON app_events TO "` + relayRole + `";)`,
		`DELETE on table app_events (as the object's owner: GRANT DELETE ON app_events TO "` + relayRole + `";)`,
	} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("the error does not name %q: %v", w, err)
		}
	}
	if strings.Contains(err.Error(), "saga_instances") || !slices.Contains(ran, `GRANT SELECT, UPDATE, INSERT, DELETE ON saga_instances TO "`+relayRole+`";`) {
		t.Fatalf("the relay's own tables were not granted: ran %v, err %v", ran, err)
	}
}
