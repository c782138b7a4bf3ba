package cdc_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/compensa/compensa/cdc"
	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/testkit"
)

const plantedPassword = "planted-S3cret-pw"

// createRole creates a login role for this test's database only, with the
// given attributes and the planted password, dropped at the end.
func createRole(t *testing.T, db *pgtest.DB, suffix, attrs string) (role, dsn string) {
	t.Helper()
	role = db.Name + "_" + suffix
	q := pgx.Identifier{role}.Sanitize()
	exec(t, db.Pool, `CREATE ROLE `+q+` LOGIN `+attrs+` PASSWORD '`+plantedPassword+`'`)
	t.Cleanup(func() {
		ctx := context.Background()
		db.Pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1`, role)
		db.Pool.Exec(ctx, `DROP OWNED BY `+q)
		db.Pool.Exec(ctx, `DROP ROLE `+q)
	})
	u, err := url.Parse(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(role, plantedPassword)
	return role, u.String()
}

func rolePool(t *testing.T, dsn string) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// The stream runs as a role with LOGIN REPLICATION and two grants (read the
// outbox, read the checkpoint); the publication was made by the table's
// owner. The planted password appears in no log line and no error.
func TestLeastPrivilegeRoleStreams(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	role, dsn := createRole(t, db, "relay", "REPLICATION")
	q := pgx.Identifier{role}.Sanitize()
	exec(t, db.Pool, `GRANT SELECT ON outbox, relay_checkpoints TO `+q)
	exec(t, db.Pool, `CREATE PUBLICATION `+pgx.Identifier{db.Publication}.Sanitize()+` FOR TABLE outbox WITH (publish = 'insert')`)
	var super, replication bool
	if err := db.Pool.QueryRow(context.Background(), `SELECT rolsuper, rolreplication FROM pg_roles WHERE rolname = $1`, role).Scan(&super, &replication); err != nil || super || !replication {
		t.Fatalf("role: super %t replication %t err %v", super, replication, err)
	}

	cfg, logs := baseConfigLogs(t, db)
	cfg.DatabaseURL = dsn
	if err := cdc.Preflight(context.Background(), rolePool(t, dsn), cfg); err != nil {
		t.Fatalf("Preflight as %s: %v", role, err)
	}
	sink := newSink(t, db.Pool) // the sink is the correlator's business, with its own grants
	before := writeEvents(t, db.Pool, 5, "before")
	r := startStream(t, cfg, sink)
	testkit.WaitFor(t, 20*time.Second, "the first-start snapshot", func() bool { return countHandled(t, db.Pool) == 5 })
	after := writeEvents(t, db.Pool, 5, "after")
	testkit.WaitFor(t, 20*time.Second, "streamed events", func() bool { return countHandled(t, db.Pool) == 10 })
	assertExactlyOnce(t, db.Pool, append(before, after...))
	testkit.WaitFor(t, 10*time.Second, "a heartbeat", func() bool {
		for _, b := range sink.snapshot() {
			if b.Heartbeat {
				return true
			}
		}
		return false
	})
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(logs.String(), "permission denied") {
		t.Fatalf("the role lacked a privilege:\n%s", logs.String())
	}
	if strings.Contains(logs.String(), plantedPassword) {
		t.Fatal("the password appears in the logs")
	}
}

// Errors and logs never carry the password, whatever fails: a database that
// does not exist, a server that does not answer, a malformed URL.
func TestPasswordNeverInErrorsOrLogs(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	_, dsn := createRole(t, db, "leak", "REPLICATION")
	u, _ := url.Parse(dsn)

	noDB := *u
	noDB.Path = "/no_such_database"
	cfg, logs := baseConfigLogs(t, db)
	cfg.DatabaseURL = noDB.String()
	err, done := startStream(t, cfg, newSink(t, db.Pool)).wait(20 * time.Second)
	if !done || err == nil {
		t.Fatalf("Run against a missing database = %v (returned %t), want an error", err, done)
	}
	if strings.Contains(err.Error(), plantedPassword) {
		t.Fatalf("error carries the password: %v", err)
	}

	down := *u
	down.Host = "127.0.0.1:1"
	cfg.DatabaseURL = down.String()
	r := startStream(t, cfg, newSink(t, db.Pool))
	time.Sleep(time.Second) // a few reconnect attempts
	if err := r.stop(t); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if !strings.Contains(logs.String(), "reconnecting") {
		t.Fatalf("no reconnect attempt logged:\n%s", logs.String())
	}

	cfg.DatabaseURL = strings.Replace(dsn, "@127.0.0.1:", "@127.0.0.1:notaport", 1)
	_, err = cdc.NewStream(cfg, newSink(t, db.Pool))
	if !errors.Is(err, cdc.ErrConfig) || strings.Contains(err.Error(), plantedPassword) {
		t.Fatalf("NewStream with a malformed URL = %v", err)
	}
	if strings.Contains(logs.String(), plantedPassword) {
		t.Fatalf("the password appears in the logs:\n%s", logs.String())
	}
}

// A role without REPLICATION: Preflight says how to fix it, and Run stops
// instead of retrying for ever.
func TestRoleWithoutReplicationIsTold(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	role, dsn := createRole(t, db, "norepl", "")
	exec(t, db.Pool, `GRANT SELECT ON outbox, relay_checkpoints TO `+pgx.Identifier{role}.Sanitize())
	cfg := baseConfig(t, db)
	cfg.DatabaseURL = dsn
	err := cdc.Preflight(context.Background(), rolePool(t, dsn), cfg)
	if !errors.Is(err, cdc.ErrReplicationPrivilege) || !strings.Contains(err.Error(), "ALTER ROLE") || !strings.Contains(err.Error(), role) {
		t.Fatalf("Preflight = %v, want ErrReplicationPrivilege saying ALTER ROLE %s REPLICATION", err, role)
	}
	runErr, done := startStream(t, cfg, newSink(t, db.Pool)).wait(20 * time.Second)
	if !done || !errors.Is(runErr, cdc.ErrReplicationPrivilege) {
		t.Fatalf("Run = %v (returned %t), want ErrReplicationPrivilege", runErr, done)
	}
}

// A server without wal_level = logical: one line that says how to fix it.
func TestWALLevelNotLogicalIsTold(t *testing.T) {
	testkit.SkipShort(t, "starts a cluster of its own")
	t.Parallel()
	db := privateDB(t, map[string]string{"wal_level": "replica"})
	cfg := baseConfig(t, db)
	err := cdc.Preflight(context.Background(), db.Pool, cfg)
	if !errors.Is(err, cdc.ErrWALLevel) || !strings.Contains(err.Error(), "ALTER SYSTEM SET wal_level = logical") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("Preflight = %v, want one line with ALTER SYSTEM SET wal_level = logical", err)
	}
	runErr, done := startStream(t, cfg, newSink(t, db.Pool)).wait(20 * time.Second)
	if !done || !errors.Is(runErr, cdc.ErrWALLevel) {
		t.Fatalf("Run = %v (returned %t), want ErrWALLevel", runErr, done)
	}
}

// The DSN's sslmode applies to every connection the stream opens: require
// TLS from a server without it, and the stream never connects (it keeps
// retrying, saying why).
func TestSSLModeIsHonoured(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	if !strings.Contains(db.URL, "sslmode=disable") {
		t.Fatalf("test URL %q has no sslmode to change", db.URL)
	}
	cfg, logs := baseConfigLogs(t, db)
	cfg.DatabaseURL = strings.Replace(db.URL, "sslmode=disable", "sslmode=require", 1)
	r := startStream(t, cfg, newSink(t, db.Pool))
	testkit.WaitFor(t, 20*time.Second, "a refused connection", func() bool {
		l := strings.ToLower(logs.String())
		return strings.Contains(l, "reconnecting") && (strings.Contains(l, "tls") || strings.Contains(l, "ssl"))
	})
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, db.Slot).Scan(&n); err != nil || n != 0 {
		t.Fatalf("a slot was created over a connection that should not exist (%d, %v)", n, err)
	}
}

// A missing publication the role cannot create: the error names what the role
// lacks (owning the table, CREATE on the database) and the statement that
// fixes it, instead of sending the owner to run a command it cannot run.
func TestMissingPublicationNamesTheMissingPrivilege(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := context.Background()

	// The relay's role does not own the table.
	role, dsn := createRole(t, db, "notowner", "REPLICATION")
	exec(t, db.Pool, `GRANT SELECT ON outbox, relay_checkpoints TO `+pgx.Identifier{role}.Sanitize())
	cfg := baseConfig(t, db)
	cfg.DatabaseURL = dsn
	err := cdc.Preflight(ctx, rolePool(t, dsn), cfg)
	if !errors.Is(err, cdc.ErrPublication) || !strings.Contains(err.Error(), "does not own") ||
		!strings.Contains(err.Error(), `as "postgres" run CREATE PUBLICATION`) {
		t.Fatalf("not the owner: %v", err)
	}

	// The owner of the table, without CREATE on the database.
	owner, ownerDSN := createRole(t, db, "owner", "REPLICATION")
	exec(t, db.Pool, `CREATE TABLE owned_outbox (LIKE outbox INCLUDING ALL)`)
	exec(t, db.Pool, `ALTER TABLE owned_outbox OWNER TO `+pgx.Identifier{owner}.Sanitize())
	exec(t, db.Pool, `GRANT SELECT ON relay_checkpoints TO `+pgx.Identifier{owner}.Sanitize())
	cfg = baseConfig(t, db)
	cfg.DatabaseURL = ownerDSN
	cfg.Table.Name = "owned_outbox"
	err = cdc.Preflight(ctx, rolePool(t, ownerDSN), cfg)
	want := "GRANT CREATE ON DATABASE " + pgx.Identifier{db.Name}.Sanitize() + " TO " + pgx.Identifier{owner}.Sanitize()
	if !errors.Is(err, cdc.ErrPublication) || !strings.Contains(err.Error(), want) {
		t.Fatalf("owner without CREATE on the database: %v; want it to say %s", err, want)
	}
}
