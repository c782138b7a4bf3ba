package pgjournal_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/compensa/compensa/internal/pgcluster"
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
	c, err := pgcluster.Start(ctx, pgcluster.Options{Durable: true})
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
