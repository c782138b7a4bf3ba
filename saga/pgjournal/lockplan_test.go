package pgjournal_test

import (
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/pgjournal"
	"github.com/compensa/compensa/test/pgtest"
)

// TestLockingReadIsPlannedOnceAndReadsByIndex: the group's locking read is
// planned once per connection, not for every call, and the plan made while
// saga_steps was empty (its statistics saying so) still reads the step
// records through saga_step_uq after the table has grown: no sequential
// scan of saga_steps or saga_instances, however many records there are.
// The control checks that the planner, left to itself, would scan the
// empty table, so that the test shows something.
func TestLockingReadIsPlannedOnceAndReadsByIndex(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	pool := oneConnPool(t, db.URL) // one backend: its prepared statements and counters are read below
	j, err := pgjournal.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`ALTER TABLE saga_steps SET (autovacuum_enabled = off)`,
		`ALTER TABLE saga_instances SET (autovacuum_enabled = off)`,
		`ANALYZE saga_steps`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	b := bundle{db: db, j: j}
	insts := make([]saga.Instance, 4)
	for i := range insts {
		insts[i] = b.claimed(t, time.Minute)
	}

	// Control: a plan made now, as the planner chooses, scans saga_steps.
	func() {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, `SET LOCAL plan_cache_mode = force_generic_plan`); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `PREPARE control_read (uuid[], timestamptz) AS `+pgjournal.SQLLockByIDs); err != nil {
			t.Fatal(err)
		}
		rows, err := tx.Query(ctx, `EXPLAIN EXECUTE control_read('{}', NULL)`, pgx.QueryExecModeSimpleProtocol)
		if err != nil {
			t.Fatal(err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		if plan := strings.Join(lines, "\n"); !strings.Contains(plan, "Seq Scan on saga_steps") {
			t.Fatalf("the planner would not scan the empty saga_steps, so this test shows nothing; plan:\n%s", plan)
		}
		if _, err := tx.Exec(ctx, `DEALLOCATE control_read`); err != nil {
			t.Fatal(err)
		}
	}()

	group := func(step int) { appendGroupStep(t, j, insts, step) }
	group(0) // the plan is made here, with saga_steps empty

	if _, err := pool.Exec(ctx, `INSERT INTO saga_steps (saga_instance_id, sequence, step_name, status)
		SELECT gen_random_uuid(), 0, 'other', 'COMPLETED' FROM generate_series(1, 20000)`); err != nil {
		t.Fatal(err)
	}
	scans := func() (steps, instances int64) {
		t.Helper()
		if _, err := pool.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `SELECT 1`); err != nil {
			t.Fatal(err)
		}
		err := pool.QueryRow(ctx, `SELECT
			(SELECT seq_scan FROM pg_stat_user_tables WHERE relname = 'saga_steps'),
			(SELECT seq_scan FROM pg_stat_user_tables WHERE relname = 'saga_instances')`).Scan(&steps, &instances)
		if err != nil {
			t.Fatal(err)
		}
		return steps, instances
	}
	steps0, inst0 := scans()
	const rounds = 10
	for s := 1; s <= rounds; s++ {
		group(s)
	}
	steps1, inst1 := scans()
	if steps1 != steps0 || inst1 != inst0 {
		t.Fatalf("%d locking reads scanned saga_steps %d times and saga_instances %d times, want index reads only",
			rounds, steps1-steps0, inst1-inst0)
	}

	var generic, custom int64
	err = pool.QueryRow(ctx, `SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = $1`,
		pgjournal.SQLLockByIDs).Scan(&generic, &custom)
	if err != nil {
		t.Fatalf("the group's locking read is not a prepared statement of the connection: %v", err)
	}
	if custom != 0 || generic < rounds+1 {
		t.Fatalf("the group's locking read ran %d times with a plan made for the call and %d with the one plan, want 0 and %d or more", custom, generic, rounds+1)
	}

	// The settings ended with the journal's transactions.
	for _, name := range []string{"plan_cache_mode", "enable_seqscan"} {
		var v, boot string
		if err := pool.QueryRow(ctx, `SELECT current_setting($1), reset_val FROM pg_settings WHERE name = $1`, name).Scan(&v, &boot); err != nil {
			t.Fatal(err)
		}
		if v != boot {
			t.Fatalf("%s is %q on the pool's connection after the journal's writes, want the session's %q", name, v, boot)
		}
	}
}

// TestGroupWriteReadsOnlyItsInstances: the group's write is planned once per
// connection (in the journal's transaction, as one generic plan), here while
// saga_instances holds four rows, and keeps reading only the group's own
// index entries after the table has grown to 20,000: the plan a nearly empty
// table suggests (every index entry, joined to the group's rows by hash)
// must not be what a relay that has run for a month still executes.
func TestGroupWriteReadsOnlyItsInstances(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	pool := oneConnPool(t, db.URL)
	j, err := pgjournal.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	// No autovacuum: its ANALYZE would make the plan anew, with the table's
	// new size, and hide the plan made while it was small.
	if _, err := pool.Exec(ctx, `ALTER TABLE saga_instances SET (autovacuum_enabled = off)`); err != nil {
		t.Fatal(err)
	}
	b := bundle{db: db, j: j}
	insts := make([]saga.Instance, 4)
	for i := range insts {
		insts[i] = b.claimed(t, 10*time.Minute)
	}
	if _, err := pool.Exec(ctx, `ANALYZE saga_instances`); err != nil {
		t.Fatal(err)
	}
	appendGroupStep(t, j, insts, 0) // the write's plan is made here

	const others = 20000
	if _, err := pool.Exec(ctx, `INSERT INTO saga_instances (tenant_id, saga_name, saga_version, trigger_event_id, status, completed_at)
		SELECT gen_random_uuid(), 'other', 1, gen_random_uuid(), 'COMPLETED', clock_timestamp() FROM generate_series(1, $1::int)`, others); err != nil {
		t.Fatal(err)
	}
	const read = `SELECT sum(idx_tup_read) FROM pg_stat_user_indexes WHERE relname = 'saga_instances'`
	const rounds = 5
	before := readStat(t, pool, read)
	for s := 1; s <= rounds; s++ {
		appendGroupStep(t, j, insts, s)
	}
	// Each round reads each of its instances by primary key twice (the
	// locking read and the write) and a few more for its neighbours; a
	// plan that walked the whole index would read 20,000 a round.
	if got, most := readStat(t, pool, read)-before, int64(rounds*len(insts)*10); got > most {
		t.Fatalf("%d group writes read %d index entries of saga_instances (%d instances in the table), want at most %d: the write walks the table's index instead of reading its group's rows",
			rounds, got, others+len(insts), most)
	}
}

// appendGroupStep appends step_completed for step to every instance of
// insts in one group, and fails the test on any refusal.
func appendGroupStep(t *testing.T, j *pgjournal.Journal, insts []saga.Instance, step int) {
	t.Helper()
	entries := make([]saga.GroupEntry, len(insts))
	for i, in := range insts {
		entries[i] = saga.GroupEntry{InstanceID: in.ID, LeaseID: in.LeaseID.UUID, Event: stepDone(step)}
	}
	if err := j.AppendGroup(ctx, entries); err != nil {
		t.Fatal(err)
	}
	for i, e := range entries {
		if e.Err != nil {
			t.Fatalf("step %d, entry %d: %v", step, i, e.Err)
		}
	}
}
