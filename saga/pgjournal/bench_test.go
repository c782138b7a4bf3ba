package pgjournal_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/compensa/compensa/internal/pgcluster"
	"github.com/compensa/compensa/internal/pgcluster/pgdocker"
	"github.com/compensa/compensa/migrations"
	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/pgjournal"
	"github.com/compensa/compensa/test/pgtest"
)

// globalLockKey is the comparison's single advisory lock: the serialised
// design takes it before every append and holds it to commit, so that
// global_seq order is commit order. It exists only here.
const globalLockKey = 0x73616761 // "saga"

// BenchmarkAppendConcurrent measures appends per second with 8 concurrent
// writers, each appending to its own instance in its own transaction (as the
// runner does), for this journal ("xmin": tailers read below
// pg_snapshot_xmin, appends take no global lock) and for the serialised
// design ("global-lock": pg_advisory_xact_lock on one key before the append).
// Both run the same statements and round trips; the lock is the only
// difference. "fast" is the test cluster (fsync off); "durable" a cluster
// with fsync and synchronous_commit on, where the serialised design also
// serialises the commits' WAL flushes.
//
//	go test -run '^$' -bench AppendConcurrent -benchtime 5s ./saga/pgjournal/
func BenchmarkAppendConcurrent(b *testing.B) {
	clusters := []struct {
		name string
		url  func(b *testing.B) string
	}{
		{"fast", func(b *testing.B) string { return pgtest.NewDB(b).URL }},
		{"durable", durableDB},
	}
	for _, c := range clusters {
		b.Run(c.name, func(b *testing.B) {
			url := c.url(b)
			for _, lock := range []bool{false, true} {
				name := "xmin"
				if lock {
					name = "global-lock"
				}
				b.Run(name, func(b *testing.B) { benchAppends(b, url, lock) })
			}
		})
	}
}

const writers = 8

func benchAppends(b *testing.B, url string, globalLock bool) {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = writers
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	j, _ := pgjournal.New(pool, nil)
	insts := make([]saga.Instance, 0, writers)
	for range writers {
		inst := saga.Instance{ID: uuid.New(), TenantID: uuid.New(), SagaName: "bench", SagaVersion: 1, TriggerEventID: uuid.New()}
		if err := j.Enqueue(ctx, inst); err != nil {
			b.Fatal(err)
		}
	}
	for len(insts) < writers {
		got, err := j.ClaimPending(ctx, writers, time.Hour)
		if err != nil {
			b.Fatal(err)
		}
		insts = append(insts, got...)
	}
	// The no-op keeps both designs at the same number of round trips.
	pre := `SELECT 1`
	if globalLock {
		pre = fmt.Sprintf(`SELECT pg_advisory_xact_lock(%d)`, globalLockKey)
	}
	ev := saga.Event{Kind: saga.EventStepFailed, Step: 0, Error: "bench"}
	var left atomic.Int64
	left.Store(int64(b.N))
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	b.ResetTimer()
	for _, inst := range insts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for left.Add(-1) >= 0 {
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, pre); err != nil {
						return err
					}
					_, err := j.Append(saga.ContextWithTx(ctx, tx), inst.ID, inst.LeaseID.UUID, ev)
					return err
				})
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "appends/s")
}

// durableDB starts a cluster with fsync and synchronous_commit on and
// returns a migrated database on it.
func durableDB(b *testing.B) string {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := pgdocker.Start(ctx, pgcluster.Options{Durable: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Stop() })
	admin, err := pgx.Connect(ctx, c.URL)
	if err != nil {
		b.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, `CREATE DATABASE journal_bench`); err != nil {
		b.Fatal(err)
	}
	url := c.DSN("journal_bench")
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := migrations.Apply(ctx, conn, migrations.Options{}); err != nil {
		b.Fatal(err)
	}
	return url
}

// BenchmarkGroupStepsCPU measures the CPU a step costs on both sides, which
// does not depend on how busy the machine is: b.N three-step sagas claimed
// 64 at a time and advanced in groups of 8 (AppendGroup, the last step with
// its ending), as the runner does with its defaults, on one connection.
// "server-µs/step" is the backend's CPU time (from /proc/PID/schedstat: its
// statements' planning and execution, the protocol, WAL inserts; not the
// WAL writer's flushes), "client-µs/step" this process's.
//
//	go test -run '^$' -bench GroupStepsCPU -benchtime 4000x ./saga/pgjournal/
func BenchmarkGroupStepsCPU(b *testing.B) {
	const claim, group, steps = 64, 8, 3
	db := pgtest.NewDB(b)
	pool := oneConnPool(b, db.URL)
	j, _ := pgjournal.New(pool, nil)
	for range b.N {
		inst := saga.Instance{ID: uuid.New(), TenantID: uuid.New(), SagaName: "bench", SagaVersion: 1, TriggerEventID: uuid.New(),
			Context: []byte(`{"currency": "EUR", "amount_cents": 4200}`)}
		if err := j.Enqueue(ctx, inst); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `ANALYZE saga_instances`); err != nil { // as the steps scenario does
		b.Fatal(err)
	}
	var pid int
	if err := pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		b.Fatal(err)
	}
	server := func() time.Duration {
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
		if err != nil {
			b.Skipf("the backend's CPU time is not readable here: %v", err)
		}
		ns, err := strconv.ParseInt(strings.Fields(string(raw))[0], 10, 64)
		if err != nil {
			b.Fatal(err)
		}
		return time.Duration(ns)
	}
	client := func() time.Duration {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			b.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	out := saga.Event{Output: []byte(`{"ok": true}`)}
	s0, c0 := server(), client()
	b.ResetTimer()
	for done := 0; done < b.N; {
		got, err := j.ClaimPending(ctx, claim, time.Minute)
		if err != nil {
			b.Fatal(err)
		}
		if len(got) == 0 {
			b.Fatalf("%d of %d sagas done and none left to claim", done, b.N)
		}
		for lo := 0; lo < len(got); lo += group {
			g := got[lo:min(lo+group, len(got))]
			for step := range steps {
				entries := make([]saga.GroupEntry, len(g))
				for i, in := range g {
					ev := out
					ev.Kind, ev.Step = saga.EventStepCompleted, step
					entries[i] = saga.GroupEntry{InstanceID: in.ID, LeaseID: in.LeaseID.UUID, Event: ev}
					if step == steps-1 {
						entries[i].Final = saga.StatusCompleted
					}
				}
				if err := j.AppendGroup(ctx, entries); err != nil {
					b.Fatal(err)
				}
				for _, e := range entries {
					if e.Err != nil {
						b.Fatal(e.Err)
					}
				}
			}
		}
		done += len(got)
	}
	b.StopTimer()
	n := float64(b.N * steps)
	b.ReportMetric(float64((server()-s0).Microseconds())/n, "server-µs/step")
	b.ReportMetric(float64((client()-c0).Microseconds())/n, "client-µs/step")
}
