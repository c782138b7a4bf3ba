package migrations_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/compensa/compensa/migrations"
	"github.com/compensa/compensa/saga/pgjournal"
	"github.com/compensa/compensa/test/pgtest"
)

// 0023 adds open_step to a database that holds instances, some of them
// leased by a relay of the earlier release, without rewriting the table;
// those instances are claimed as before, with no step reported open (the
// earlier release kept no record of one).
func TestOpenStepUpgradesADatabaseWithLeasedSagas(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewEmptyDB(t)
	conn, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if err := migrations.ApplyThrough(ctx, conn, 22); err != nil {
		t.Fatal(err)
	}
	// Instances in the middle of a step, their leases run out (their relay
	// stopped for the upgrade).
	if _, err := conn.Exec(ctx, `INSERT INTO saga_instances (tenant_id, saga_name, saga_version, trigger_event_id,
			current_step, lease_id, lease_expires_at, next_attempt_at)
		SELECT gen_random_uuid(), 's', 1, gen_random_uuid(), 1, gen_random_uuid(), now() - interval '1 minute', now() - interval '1 minute'
		FROM generate_series(1, 50)`); err != nil {
		t.Fatal(err)
	}
	layout := func() (node uint32, ctids []string) {
		t.Helper()
		if err := conn.QueryRow(ctx, `SELECT pg_relation_filenode('saga_instances'), (SELECT array_agg(ctid::text ORDER BY ctid) FROM saga_instances)`).Scan(&node, &ctids); err != nil {
			t.Fatal(err)
		}
		return node, ctids
	}
	node, ctids := layout()

	ran, err := migrations.Apply(ctx, conn, migrations.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(ran, func(m migrations.Applied) bool { return m.Version == 23 }) {
		t.Fatalf("Apply ran %v, want 0023 among them", ran)
	}
	if n2, c2 := layout(); n2 != node || !slices.Equal(c2, ctids) {
		t.Fatal("adding open_step rewrote saga_instances")
	}
	var notNull, hasDefault bool
	var typ string
	if err := conn.QueryRow(ctx, `SELECT attnotnull, atthasdef, format_type(atttypid, atttypmod) FROM pg_attribute
		WHERE attrelid = 'saga_instances'::regclass AND attname = 'open_step' AND NOT attisdropped`).Scan(&notNull, &hasDefault, &typ); err != nil {
		t.Fatal(err)
	}
	if notNull || hasDefault || typ != "integer" {
		t.Fatalf("open_step: %s, not null %t, default %t; want a nullable integer without a default", typ, notNull, hasDefault)
	}
	var indexed int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
		WHERE i.indrelid = 'saga_instances'::regclass AND a.attname = 'open_step'`).Scan(&indexed); err != nil {
		t.Fatal(err)
	}
	if indexed != 0 {
		t.Fatal("open_step is indexed: the writes that set it would no longer be HOT updates")
	}

	pool, err := pgxpool.New(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	j, err := pgjournal.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := j.ClaimPending(ctx, 100, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 50 {
		t.Fatalf("claimed %d of the 50 instances", len(got))
	}
	for _, inst := range got {
		if inst.InterruptedStep != nil || inst.OpenStep == nil || *inst.OpenStep != 1 {
			t.Fatalf("claimed after the upgrade: open step %v, interrupted %v; want step 1 open and none reported", inst.OpenStep, inst.InterruptedStep)
		}
	}
}
