package migrations_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/compensa/compensa/migrations"
	"github.com/compensa/compensa/test/pgtest"
)

// 0012 upgrades a database that holds sagas in place: the step records keep
// their rows under the new primary key, the journal keeps its order key for
// a writer that does not compute it, and deleting or truncating instances
// still takes their step records and events with them, without the foreign
// keys.
func TestCheaperStepsUpgradesADatabaseWithSagas(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewEmptyDB(t)
	conn, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if err := migrations.ApplyThrough(ctx, conn, 11); err != nil {
		t.Fatal(err)
	}
	exec := func(c *pgx.Conn, sql string, args ...any) {
		t.Helper()
		if _, err := c.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	count := func(sql string, args ...any) int {
		t.Helper()
		var n int
		if err := conn.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		return n
	}

	// Two instances with step records and events, as the release before
	// wrote them.
	var a, b string
	for _, id := range []*string{&a, &b} {
		if err := conn.QueryRow(ctx, `INSERT INTO saga_instances (tenant_id, saga_name, saga_version, trigger_event_id, current_version)
			VALUES (gen_random_uuid(), 's', 1, gen_random_uuid(), 2) RETURNING id::text`).Scan(id); err != nil {
			t.Fatal(err)
		}
	}
	exec(conn, `INSERT INTO saga_steps (saga_instance_id, step_name, sequence, status)
		VALUES ($1, 'one', 0, 'COMPLETED'), ($1, 'two', 1, 'RUNNING'), ($2, 'one', 0, 'RUNNING')`, a, b)
	exec(conn, `INSERT INTO saga_events (instance_id, version, kind, step) VALUES ($1, 1, 'step_completed', 0), ($1, 2, 'step_started', 1), ($2, 1, 'step_started', 0)`, a, b)

	ran, err := migrations.Apply(ctx, conn, migrations.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(ran, func(m migrations.Applied) bool { return m.Version == 12 }) {
		t.Fatalf("Apply ran %v, want 0012 among them", ran)
	}
	if n := count(`SELECT count(*) FROM saga_steps`); n != 3 {
		t.Fatalf("%d step records after the upgrade, want 3", n)
	}
	if n := count(`SELECT count(*) FROM saga_events`); n != 3 {
		t.Fatalf("%d events after the upgrade, want 3", n)
	}

	// The step record's key is (saga_instance_id, sequence), its only index.
	var key []string
	if err := conn.QueryRow(ctx, `
SELECT array_agg(a.attname::text ORDER BY k.ord)
FROM pg_index i CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = 'saga_steps'::regclass AND i.indisprimary`).Scan(&key); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(key, []string{"saga_instance_id", "sequence"}) {
		t.Fatalf("saga_steps' primary key is %v", key)
	}
	if n := count(`SELECT count(*) FROM pg_index WHERE indrelid = 'saga_steps'::regclass`); n != 1 {
		t.Fatalf("saga_steps has %d indexes, want 1 (its primary key)", n)
	}
	if n := count(`SELECT count(*) FROM pg_attribute WHERE attrelid = 'saga_steps'::regclass AND attname = 'id' AND NOT attisdropped`); n != 0 {
		t.Fatal("saga_steps still has its surrogate id")
	}
	if n := count(`SELECT count(*) FROM pg_constraint WHERE contype = 'f' AND conrelid IN ('saga_steps'::regclass, 'saga_events'::regclass)`); n != 0 {
		t.Fatalf("%d foreign keys left on saga_steps and saga_events", n)
	}
	_, err = conn.Exec(ctx, `INSERT INTO saga_steps (saga_instance_id, step_name, sequence) VALUES ($1, 'again', 0)`, a)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23505" {
		t.Fatalf("a second record of a step: %v, want a unique violation", err)
	}

	// A writer that inserts an event without its xid (a relay of the
	// earlier release, during a rolling update) still has it raised to the
	// previous event's: old took its transaction id first, and writes
	// version 4 after version 3 committed with a higher id.
	other, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(ctx)
	old, err := other.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Rollback(ctx)
	var oldXid string
	if err := old.QueryRow(ctx, `SELECT pg_current_xact_id()::text`).Scan(&oldXid); err != nil {
		t.Fatal(err)
	}
	exec(conn, `INSERT INTO saga_events (instance_id, version, kind, step) VALUES ($1, 3, 'step_completed', 1)`, a)
	if _, err := old.Exec(ctx, `INSERT INTO saga_events (instance_id, version, kind, step) VALUES ($1, 4, 'saga_completed', -1)`, a); err != nil {
		t.Fatal(err)
	}
	if err := old.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var v3, v4 string
	if err := conn.QueryRow(ctx, `SELECT (SELECT xid::text FROM saga_events WHERE instance_id = $1 AND version = 3),
		(SELECT xid::text FROM saga_events WHERE instance_id = $1 AND version = 4)`, a).Scan(&v3, &v4); err != nil {
		t.Fatal(err)
	}
	if v3 == oldXid || v4 != v3 {
		t.Fatalf("xids: version 3 %s, version 4 %s (its writer's %s): version 4's must be raised to version 3's", v3, v4, oldXid)
	}

	// Deleting an instance deletes its step records and events, and only
	// its own.
	exec(conn, `DELETE FROM saga_instances WHERE id = $1`, a)
	if n := count(`SELECT count(*) FROM saga_steps WHERE saga_instance_id = $1`, a) + count(`SELECT count(*) FROM saga_events WHERE instance_id = $1`, a); n != 0 {
		t.Fatalf("%d step records and events of a deleted instance are left", n)
	}
	if n := count(`SELECT count(*) FROM saga_steps WHERE saga_instance_id = $1`, b) + count(`SELECT count(*) FROM saga_events WHERE instance_id = $1`, b); n != 2 {
		t.Fatalf("the other instance has %d step records and events, want 2", n)
	}
	exec(conn, `TRUNCATE saga_instances`)
	if n := count(`SELECT count(*) FROM saga_steps`) + count(`SELECT count(*) FROM saga_events`); n != 0 {
		t.Fatalf("%d step records and events are left after TRUNCATE saga_instances", n)
	}
}
