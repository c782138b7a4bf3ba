package grouptest_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/pgjournal"
	"github.com/compensa/compensa/test/pgtest"
)

// childEnv names the database a child process runs the group runner on.
const childEnv = "COMPENSA_GROUPTEST_CHILD_URL"

func TestMain(m *testing.M) {
	if url := os.Getenv(childEnv); url != "" {
		os.Exit(runChild(url))
	}
	os.Exit(pgtest.Main(m))
}

// hooks lets a test act inside a step (on its first attempt of step 0).
type hooks struct {
	onFirst func(ctx context.Context, x *saga.StepTx, xid string) error
	// journalOnly: the steps write nothing through their transaction, so
	// that a group's entries go to the journal together (AppendGroup).
	journalOnly bool
}

// definition is three steps that each record their effect in effects, in
// the step's transaction (its savepoint, in a group); the hook is told the
// transaction id step 0's first attempt ran in.
func definition(h *hooks) saga.Definition {
	step := func(name string) saga.Step {
		return saga.Step{
			Name:  name,
			Retry: saga.RetryPolicy{MaxAttempts: 5, Base: 10 * time.Millisecond, Factor: 1, Max: 10 * time.Millisecond, Jitter: -1},
			Do: func(ctx context.Context, x *saga.StepTx) error {
				if h != nil && h.journalOnly {
					if h.onFirst != nil && x.Step == 0 && x.Attempt == 1 {
						return h.onFirst(ctx, x, "")
					}
					return nil
				}
				var xid string
				if err := x.Tx.QueryRow(ctx, `SELECT pg_current_xact_id()::text`).Scan(&xid); err != nil {
					return err
				}
				if _, err := x.Tx.Exec(ctx, `INSERT INTO effects (instance_id, step, attempt) VALUES ($1, $2, $3)`, x.Instance.ID, name, x.Attempt); err != nil {
					return err
				}
				if h != nil && h.onFirst != nil && x.Step == 0 && x.Attempt == 1 {
					return h.onFirst(ctx, x, xid)
				}
				return nil
			},
		}
	}
	return saga.Definition{Name: "grp", Version: 1, Triggers: []saga.Trigger{{EventType: "grp.started"}},
		Steps: []saga.Step{step("one"), step("two"), step("three")}}
}

const sqlEffects = `CREATE TABLE IF NOT EXISTS effects (id bigserial PRIMARY KEY, instance_id uuid NOT NULL, step text NOT NULL, attempt int NOT NULL)`

func startMany(t *testing.T, pool *pgxpool.Pool, n int) []uuid.UUID {
	t.Helper()
	rows, err := pool.Query(context.Background(), `
		INSERT INTO saga_instances (tenant_id, saga_name, saga_version, trigger_event_id, context)
		SELECT gen_random_uuid(), 'grp', 1, gen_random_uuid(), '{}'::jsonb FROM generate_series(1, $1) RETURNING id`, n)
	if err != nil {
		t.Fatal(err)
	}
	var ids []uuid.UUID
	for rows.Next() {
		var id uuid.UUID
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

func runner(t *testing.T, pool *pgxpool.Pool, def saga.Definition, cfg saga.RunnerConfig) *saga.Runner {
	t.Helper()
	j, err := pgjournal.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	reg := saga.NewRegistry()
	reg.MustRegister(def)
	cfg.PollInterval, cfg.MaxPollInterval = 20*time.Millisecond, 200*time.Millisecond
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	r, err := saga.NewRunner(j, pool, reg, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := r.Stop(ctx); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	return r
}

func count(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func waitCompleted(t *testing.T, pool *pgxpool.Pool, n int, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for count(t, pool, `SELECT count(*) FROM saga_instances WHERE status = 'COMPLETED'`) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d sagas COMPLETED after %s", count(t, pool, `SELECT count(*) FROM saga_instances WHERE status = 'COMPLETED'`), n, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// exactlyOnce checks that every instance has one effect per step and the
// journal 1..4 (three steps, then completed), no more.
func exactlyOnce(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	if got := count(t, pool, `SELECT count(*) FROM (SELECT instance_id, step FROM effects GROUP BY 1, 2 HAVING count(*) <> 1) d`); got != 0 {
		t.Fatalf("%d (instance, step) pairs whose effect committed other than once", got)
	}
	if got := count(t, pool, `SELECT count(*) FROM effects`); got != 3*n {
		t.Fatalf("%d effects, want %d", got, 3*n)
	}
	if got := count(t, pool, `SELECT count(*) FROM saga_events WHERE kind IN ('step_completed', 'completed')`); got != 4*n {
		t.Fatalf("%d step_completed/completed events, want %d", got, 4*n)
	}
}

// journalOnce checks, for steps that write nothing of their own, that every
// instance has each step's completion and its ending in the journal once.
func journalOnce(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	if got := count(t, pool, `SELECT count(*) FROM (SELECT instance_id, step, kind FROM saga_events WHERE kind IN ('step_completed', 'completed') GROUP BY 1, 2, 3 HAVING count(*) <> 1) d`); got != 0 {
		t.Fatalf("%d (instance, step) completions journaled other than once", got)
	}
	if got := count(t, pool, `SELECT count(*) FROM saga_events WHERE kind IN ('step_completed', 'completed')`); got != 4*n {
		t.Fatalf("%d step_completed/completed events, want %d", got, 4*n)
	}
}

// grouped counts the transactions that wrote the first step of two or more
// instances: group commits.
func grouped(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	return count(t, pool, `SELECT count(*) FROM (SELECT xid FROM saga_events WHERE kind = 'step_completed' AND step = 0 GROUP BY xid HAVING count(*) > 1) g`)
}

// mates are the instances whose first step committed in transaction xid
// (their journal entry for it has that xid: the first event of an instance
// takes its writer's transaction id).
func mates(t *testing.T, pool *pgxpool.Pool, xid string, except uuid.UUID) int {
	t.Helper()
	return count(t, pool, `SELECT count(*) FROM saga_events WHERE version = 1 AND xid::text = $1 AND instance_id <> $2`, xid, except)
}

// TestGroupCommitFailingStepLeavesBatchMatesCommitted: a step that fails
// inside a group rolls back to its savepoint: its own effect is gone, the
// steps of its batch-mates commit in that transaction, and it is retried.
func TestGroupCommitFailingStepLeavesBatchMatesCommitted(t *testing.T) {
	db := pgtest.NewDB(t)
	if _, err := db.Pool.Exec(context.Background(), sqlEffects); err != nil {
		t.Fatal(err)
	}
	const n = 24
	startMany(t, db.Pool, n)
	// The victim is the first instance to run: the first claim comes back
	// full (a backlog), so it runs in a group.
	var victim uuid.UUID
	var once sync.Once
	boom := errors.New("boom")
	var victimXID string
	def := definition(&hooks{onFirst: func(_ context.Context, x *saga.StepTx, xid string) error {
		once.Do(func() { victim, victimXID = x.Instance.ID, xid })
		if x.Instance.ID == victim {
			return boom
		}
		return nil
	}})
	runner(t, db.Pool, def, saga.RunnerConfig{Workers: 2, ClaimBatch: 8, GroupCommit: 8})
	waitCompleted(t, db.Pool, n, 2*time.Minute)
	exactlyOnce(t, db.Pool, n)
	x := victimXID
	if x == "" {
		t.Fatal("the victim's first attempt never ran")
	}
	if m := mates(t, db.Pool, x, victim); m == 0 {
		t.Fatalf("no batch-mate committed its first step in the victim's transaction %s: the failure was not inside a group", x)
	}
	if got := count(t, db.Pool, `SELECT attempt FROM effects WHERE instance_id = $1 AND step = 'one'`, victim); got != 2 {
		t.Fatalf("the victim's step committed on attempt %d, want 2 (attempt 1 rolled back to its savepoint)", got)
	}
	if got := count(t, db.Pool, `SELECT count(*) FROM saga_events WHERE instance_id = $1 AND kind = 'step_failed'`, victim); got != 1 {
		t.Fatalf("%d step_failed events for the victim, want 1", got)
	}
}

// TestGroupCommitLostLeaseRollsBackOnlyItsSavepoint: an instance whose lease
// is lost while its group runs has its step rolled back (its savepoint
// only); the batch-mates commit; it runs again under a new claim.
func TestGroupCommitLostLeaseRollsBackOnlyItsSavepoint(t *testing.T) {
	db := pgtest.NewDB(t)
	if _, err := db.Pool.Exec(context.Background(), sqlEffects); err != nil {
		t.Fatal(err)
	}
	const n = 24
	startMany(t, db.Pool, n)
	var victim uuid.UUID // the first instance to run (in a group: see above)
	var lost atomic.Int64
	var fired atomic.Bool
	var victimXID string
	def := definition(&hooks{onFirst: func(ctx context.Context, x *saga.StepTx, xid string) error {
		if !fired.CompareAndSwap(false, true) {
			return nil
		}
		victim, victimXID = x.Instance.ID, xid
		// Another party takes the lease away (its expiry in the past), on
		// a connection of its own: the victim's journal write is fenced.
		_, err := db.Pool.Exec(ctx, `UPDATE saga_instances SET lease_expires_at = clock_timestamp() - interval '1 second' WHERE id = $1`, x.Instance.ID)
		return err
	}})
	cfg := saga.RunnerConfig{Workers: 2, ClaimBatch: 8, GroupCommit: 8}
	cfg.Hooks.OnStep = func(ev saga.StepEvent) {
		if ev.Outcome == saga.OutcomeLeaseLost {
			lost.Add(1)
		}
	}
	runner(t, db.Pool, def, cfg)
	waitCompleted(t, db.Pool, n, 2*time.Minute)
	exactlyOnce(t, db.Pool, n)
	if lost.Load() != 1 {
		t.Fatalf("%d lease-lost outcomes, want 1", lost.Load())
	}
	x := victimXID
	if x == "" {
		t.Fatal("the victim's first attempt never ran")
	}
	if m := mates(t, db.Pool, x, victim); m == 0 {
		t.Fatalf("no batch-mate committed its first step in the victim's transaction %s (victim %s)", x, victim)
	}
	if got := count(t, db.Pool, `SELECT count(*) FROM saga_events WHERE instance_id = $1 AND xid::text = $2`, victim, x); got != 0 {
		t.Fatalf("the victim has %d journal entries from the transaction that lost its lease", got)
	}
}

// TestGroupCommitKilledMidBatchLosesAndDoublesNothing: a runner process
// doing group commits is killed with SIGKILL while it works through a
// backlog; another runner takes over once the leases expire. Every saga
// completes with each step's effect and journal entry exactly once.
func TestGroupCommitKilledMidBatchLosesAndDoublesNothing(t *testing.T) {
	db := pgtest.NewDB(t)
	if _, err := db.Pool.Exec(context.Background(), sqlEffects); err != nil {
		t.Fatal(err)
	}
	const n = 300
	startMany(t, db.Pool, n)
	done := killChildMidway(t, db, n, `SELECT count(*) FROM effects`, n/2)
	runner(t, db.Pool, definition(nil), saga.RunnerConfig{Workers: 2, ClaimBatch: 8, GroupCommit: 8, LeaseDuration: time.Second})
	waitCompleted(t, db.Pool, n, 3*time.Minute)
	exactlyOnce(t, db.Pool, n)
	t.Logf("killed with %d of %d sagas completed", done, n)
}

// TestGroupCommitJournalOnlyFailingStep: steps that write nothing of their
// own go to the journal as one group (AppendGroup, two round trips and one
// commit for the round). A step that fails in such a round is not written,
// its batch-mates are, and it is retried.
func TestGroupCommitJournalOnlyFailingStep(t *testing.T) {
	db := pgtest.NewDB(t)
	const n = 24
	startMany(t, db.Pool, n)
	var victim uuid.UUID
	var once sync.Once
	def := definition(&hooks{journalOnly: true, onFirst: func(_ context.Context, x *saga.StepTx, _ string) error {
		once.Do(func() { victim = x.Instance.ID })
		if x.Instance.ID == victim {
			return errors.New("boom")
		}
		return nil
	}})
	runner(t, db.Pool, def, saga.RunnerConfig{Workers: 2, ClaimBatch: 8, GroupCommit: 8})
	waitCompleted(t, db.Pool, n, 2*time.Minute)
	journalOnce(t, db.Pool, n)
	if g := grouped(t, db.Pool); g == 0 {
		t.Fatal("no transaction wrote the first step of two instances: no group commit happened")
	}
	if got := count(t, db.Pool, `SELECT count(*) FROM saga_events WHERE instance_id = $1 AND kind = 'step_failed'`, victim); got != 1 {
		t.Fatalf("%d step_failed events for the victim, want 1", got)
	}
	if got := count(t, db.Pool, `SELECT attempts FROM saga_steps WHERE saga_instance_id = $1 AND sequence = 0`, victim); got != 2 {
		t.Fatalf("the victim's first step completed on attempt %d, want 2", got)
	}
}

// TestGroupCommitJournalOnlyLostLease: an instance whose lease is taken away
// while its round runs is refused by the journal's fence (its entry alone);
// the round's other entries commit; it runs again under a new claim.
func TestGroupCommitJournalOnlyLostLease(t *testing.T) {
	db := pgtest.NewDB(t)
	const n = 24
	startMany(t, db.Pool, n)
	var victim uuid.UUID
	var fired atomic.Bool
	var lost atomic.Int64
	def := definition(&hooks{journalOnly: true, onFirst: func(ctx context.Context, x *saga.StepTx, _ string) error {
		if !fired.CompareAndSwap(false, true) {
			return nil
		}
		victim = x.Instance.ID
		_, err := db.Pool.Exec(ctx, `UPDATE saga_instances SET lease_expires_at = clock_timestamp() - interval '1 second' WHERE id = $1`, x.Instance.ID)
		return err
	}})
	cfg := saga.RunnerConfig{Workers: 2, ClaimBatch: 8, GroupCommit: 8}
	cfg.Hooks.OnStep = func(ev saga.StepEvent) {
		if ev.Outcome == saga.OutcomeLeaseLost {
			lost.Add(1)
		}
	}
	runner(t, db.Pool, def, cfg)
	waitCompleted(t, db.Pool, n, 2*time.Minute)
	journalOnce(t, db.Pool, n)
	if lost.Load() != 1 {
		t.Fatalf("%d lease-lost outcomes, want 1", lost.Load())
	}
	if g := grouped(t, db.Pool); g == 0 {
		t.Fatal("no group commit happened")
	}
	// The victim's first step was written once, by a later claim: its
	// attempt counter says a second attempt (the first was fenced out).
	if got := count(t, db.Pool, `SELECT count(*) FROM saga_events WHERE instance_id = $1 AND kind = 'step_completed' AND step = 0`, victim); got != 1 {
		t.Fatalf("the victim's first step journaled %d times, want 1", got)
	}
}

// TestGroupCommitJournalOnlyKilledMidBatch is the kill test for rounds that
// go to the journal as one group.
func TestGroupCommitJournalOnlyKilledMidBatch(t *testing.T) {
	db := pgtest.NewDB(t)
	const n = 600
	startMany(t, db.Pool, n)
	done := killChildMidway(t, db, n, `SELECT count(*) FROM saga_events WHERE kind = 'step_completed'`, n, childJournalOnlyEnv+"=1")
	runner(t, db.Pool, definition(&hooks{journalOnly: true}), saga.RunnerConfig{Workers: 2, ClaimBatch: 8, GroupCommit: 8, LeaseDuration: time.Second})
	waitCompleted(t, db.Pool, n, 3*time.Minute)
	journalOnce(t, db.Pool, n)
	if g := grouped(t, db.Pool); g == 0 {
		t.Fatal("no group commit happened")
	}
	t.Logf("killed with %d of %d sagas completed", done, n)
}

// killChildMidway starts the child runner (env added to its environment),
// kills it with SIGKILL once progressSQL counts at least at, and returns how
// many of the n sagas were COMPLETED then (fewer than n: some were in flight).
func killChildMidway(t *testing.T, db *pgtest.DB, n int, progressSQL string, at int, env ...string) int {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), childEnv+"="+db.URL), env...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for count(t, db.Pool, progressSQL) < at {
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatal("the child runner made no progress")
		}
		time.Sleep(2 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	done := count(t, db.Pool, `SELECT count(*) FROM saga_instances WHERE status = 'COMPLETED'`)
	if done == n {
		t.Fatalf("all %d sagas completed before the kill: nothing was in flight", n)
	}
	return done
}

// childJournalOnlyEnv makes the child run steps that write nothing.
const childJournalOnlyEnv = "COMPENSA_GROUPTEST_CHILD_JOURNAL_ONLY"

// runChild is the child process of the kill test: a group-commit runner
// with a short lease, until it is killed.
func runChild(url string) int {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	j, err := pgjournal.New(pool, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	reg := saga.NewRegistry()
	reg.MustRegister(definition(&hooks{journalOnly: os.Getenv(childJournalOnlyEnv) != ""}))
	r, err := saga.NewRunner(j, pool, reg, &saga.RunnerConfig{Workers: 2, ClaimBatch: 8, GroupCommit: 8, LeaseDuration: time.Second,
		PollInterval: 20 * time.Millisecond, MaxPollInterval: 200 * time.Millisecond})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := r.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	select {} // until SIGKILL
}

// TestClaimMoreThanIdleWorkersIsSharedInGroups: a claim that returns more
// instances than there are idle workers, though fewer than it asked for (no
// backlog), hands them out in groups, one per idle worker, so that each
// instance takes its first step in the first round of a group commit
// instead of waiting for whole instances run one per transaction.
func TestClaimMoreThanIdleWorkersIsSharedInGroups(t *testing.T) {
	db := pgtest.NewDB(t)
	if _, err := db.Pool.Exec(context.Background(), sqlEffects); err != nil {
		t.Fatal(err)
	}
	const n = 10
	startMany(t, db.Pool, n) // due before the runner's first claim
	runner(t, db.Pool, definition(nil), saga.RunnerConfig{Workers: 2, ClaimBatch: 64, GroupCommit: 8})
	waitCompleted(t, db.Pool, n, time.Minute)
	exactlyOnce(t, db.Pool, n)
	// Two idle workers, ten instances: two groups of five.
	if got := count(t, db.Pool, `SELECT count(DISTINCT xid) FROM saga_events WHERE kind = 'step_completed' AND step = 0`); got != 2 {
		t.Fatalf("the first steps of %d instances committed in %d transactions, want 2 (one group per idle worker)", n, got)
	}
	if got := count(t, db.Pool, `SELECT max(c) FROM (SELECT count(*) AS c FROM saga_events WHERE kind = 'step_completed' AND step = 0 GROUP BY xid) g`); got != 5 {
		t.Fatalf("the largest group had %d instances, want 5 (the claim split evenly)", got)
	}
}
