package grouptest_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/test/pgtest"
)

// TestServerRefusedEntryIsAFailedAttempt: a step that writes nothing of its
// own leaves a state PostgreSQL's jsonb refuses (a number beyond numeric's
// range, which JSON allows) on its first attempt. The journal's own
// transaction fails on the server, so nothing was committed: the attempt is
// counted (step_failed) and the second attempt completes. Counted as "outcome
// unknown" instead, the instance would wait out its lease again and again
// with its attempts never counted. Single steps and group rounds both.
func TestServerRefusedEntryIsAFailedAttempt(t *testing.T) {
	for _, group := range []int{1, 8} {
		t.Run(map[int]string{1: "single", 8: "group"}[group], func(t *testing.T) {
			db := pgtest.NewDB(t)
			const n = 16
			startMany(t, db.Pool, n)
			var victim uuid.UUID
			var once sync.Once
			def := definition(&hooks{journalOnly: true, onFirst: func(_ context.Context, x *saga.StepTx, _ string) error {
				once.Do(func() { victim = x.Instance.ID })
				if x.Instance.ID == victim {
					x.State = json.RawMessage(`{"n": 1e1000000}`)
				}
				return nil
			}})
			runner(t, db.Pool, def, saga.RunnerConfig{Workers: 2, ClaimBatch: 8, GroupCommit: group, LeaseDuration: 20 * time.Second})
			waitCompleted(t, db.Pool, n, time.Minute)
			journalOnce(t, db.Pool, n)
			var msg string
			if err := db.Pool.QueryRow(context.Background(), `SELECT payload->>'error' FROM saga_events WHERE instance_id = $1 AND kind = 'step_failed'`, victim).Scan(&msg); err != nil {
				t.Fatalf("the victim's refused entry was not counted as a failed attempt: %v", err)
			}
			if got := count(t, db.Pool, `SELECT attempts FROM saga_steps WHERE saga_instance_id = $1 AND sequence = 0`, victim); got != 2 {
				t.Fatalf("the victim's first step completed on attempt %d, want 2", got)
			}
			t.Logf("recorded: %s", msg)
		})
	}
}

// TestSwallowedBeginFailsTheStep: Do's first statement cannot begin the
// step's transaction (its context is already cancelled) and Do ignores the
// error. What it meant to write is in no transaction, so its journal entry
// must not be written alone: the attempt fails and the next one completes.
func TestSwallowedBeginFailsTheStep(t *testing.T) {
	db := pgtest.NewDB(t)
	if _, err := db.Pool.Exec(context.Background(), sqlEffects); err != nil {
		t.Fatal(err)
	}
	const n = 1
	ids := startMany(t, db.Pool, n)
	def := definition(&hooks{journalOnly: true, onFirst: func(ctx context.Context, x *saga.StepTx, _ string) error {
		dead, cancel := context.WithCancel(ctx)
		cancel()
		_, _ = x.Tx.Exec(dead, `INSERT INTO effects (instance_id, step, attempt) VALUES ($1, 'one', 1)`, x.Instance.ID)
		return nil // swallowed
	}})
	runner(t, db.Pool, def, saga.RunnerConfig{Workers: 1, GroupCommit: 1})
	waitCompleted(t, db.Pool, n, time.Minute)
	var msg string
	if err := db.Pool.QueryRow(context.Background(), `SELECT payload->>'error' FROM saga_events WHERE instance_id = $1 AND kind = 'step_failed'`, ids[0]).Scan(&msg); err != nil {
		t.Fatalf("the step whose BEGIN failed was journaled as completed: %v", err)
	}
	if !strings.Contains(msg, "begin the step's transaction") {
		t.Fatalf("step_failed says %q", msg)
	}
}
