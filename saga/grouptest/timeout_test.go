package grouptest_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/compensa/compensa/internal/dbconn"
	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/test/pgtest"
)

// TestGroupCommitStepTimeoutLeavesBatchMatesCommitted: a step whose
// statement outlives its timeout inside a group round (pg_sleep past
// Step.Timeout) has its statement cancelled on the server, not its
// connection closed: it rolls back to its savepoint and is recorded as a
// timed-out attempt (reason "timeout": it may have acted), its batch-mates
// commit in the same transaction, and it succeeds on its retry. On the pool
// the relay runs steps on (dbconn.OpenStepPool).
func TestGroupCommitStepTimeoutLeavesBatchMatesCommitted(t *testing.T) {
	db := pgtest.NewDB(t)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, sqlEffects); err != nil {
		t.Fatal(err)
	}
	pool, err := dbconn.OpenStepPool(ctx, db.URL, 8)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	const n = 24
	startMany(t, pool, n)
	var (
		once      sync.Once
		victim    uuid.UUID
		victimXID string
		slept     time.Duration
	)
	def := definition(&hooks{onFirst: func(ctx context.Context, x *saga.StepTx, xid string) error {
		once.Do(func() { victim, victimXID = x.Instance.ID, xid })
		if x.Instance.ID != victim {
			return nil
		}
		began := time.Now()
		_, err := x.Tx.Exec(ctx, `SELECT pg_sleep(30)`)
		slept = time.Since(began)
		return err
	}})
	const timeout = 2 * time.Second
	def.Steps[0].Timeout = timeout
	runner(t, pool, def, saga.RunnerConfig{Workers: 2, ClaimBatch: 8, GroupCommit: 8})
	waitCompleted(t, pool, n, 2*time.Minute)
	exactlyOnce(t, pool, n)
	if victimXID == "" {
		t.Fatal("the victim's first attempt never ran")
	}
	if slept > 20*time.Second {
		t.Fatalf("the victim's pg_sleep ran %s: its statement was not cancelled at the step's timeout (%s)", slept, timeout)
	}
	if m := mates(t, pool, victimXID, victim); m == 0 {
		t.Fatalf("no batch-mate committed its first step in the victim's transaction %s: the timeout broke the round", victimXID)
	}
	if got := count(t, pool, `SELECT attempt FROM effects WHERE instance_id = $1 AND step = 'one'`, victim); got != 2 {
		t.Fatalf("the victim's step committed on attempt %d, want 2 (attempt 1 rolled back to its savepoint)", got)
	}
	if got := count(t, pool, `SELECT count(*) FROM saga_events WHERE instance_id = $1 AND kind = 'step_failed' AND payload->>'reason' = 'timeout'`, victim); got != 1 {
		t.Fatalf("%d step_failed events with reason timeout for the victim, want 1", got)
	}
	if got := count(t, pool, `SELECT count(*) FROM saga_events WHERE kind = 'step_failed'`); got != 1 {
		t.Fatalf("%d step_failed events in all, want 1 (the victim's): the timeout failed its batch-mates", got)
	}
}
