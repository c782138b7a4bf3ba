package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// stepJob is one step of one process: River has no multi-step workflow, so
// each step is a job, and a step's job inserts the next step's job and
// completes itself in one transaction (the durable hand-over).
type stepJob struct {
	Process int `json:"p"`
	Step    int `json:"s"`
}

func (stepJob) Kind() string { return "peers_step" }

type stepWorker struct {
	river.WorkerDefaults[stepJob]
	pool *pgxpool.Pool
	m    *meter
	left *sync.WaitGroup
}

func (w *stepWorker) Work(ctx context.Context, job *river.Job[stepJob]) error {
	tx, err := w.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	a := job.Args
	if a.Step < stepsPerProcess {
		client := river.ClientFromContext[pgx.Tx](ctx)
		if _, err := client.InsertTx(ctx, tx, stepJob{Process: a.Process, Step: a.Step + 1}, nil); err != nil {
			return err
		}
	}
	if _, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	if a.Step == stepsPerProcess && w.m.done[a.Process].CompareAndSwap(0, time.Now().UnixNano()) {
		w.left.Done()
	}
	return nil
}

// runRiver inserts n first-step jobs at t0 (InsertMany, 500 a call) and lets
// a River client with 100 workers on a pool of 20 run them. cooldown 0 keeps
// River's default fetch cooldown (100 ms).
func runRiver(ctx context.Context, dsn string, n int, cooldown time.Duration) (Result, error) {
	res := Result{Mode: "backlog: all inserted at t0, 100 workers, pool 20, default settings"}
	if cooldown > 0 {
		res.Mode = fmt.Sprintf("backlog: all inserted at t0, 100 workers, pool 20, FetchCooldown %s", cooldown)
	}
	rt := &roundTrips{}
	pool, err := newPool(ctx, dsn, 20, rt)
	if err != nil {
		return res, err
	}
	defer pool.Close()
	driver := riverpgxv5.New(pool)
	mig, err := rivermigrate.New(driver, nil)
	if err != nil {
		return res, err
	}
	if _, err := mig.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return res, fmt.Errorf("river migrate: %w", err)
	}
	m := newMeter(dsn, rt, n)
	var left sync.WaitGroup
	left.Add(n)
	all := make(chan struct{})
	go func() { left.Wait(); close(all) }()
	workers := river.NewWorkers()
	river.AddWorker(workers, &stepWorker{pool: pool, m: m, left: &left})
	client, err := river.NewClient(driver, &river.Config{
		Queues:        map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 100}},
		Workers:       workers,
		FetchCooldown: cooldown,
		Logger:        slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return res, err
	}
	if err := client.Start(ctx); err != nil {
		return res, err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = client.Stop(sctx)
	}()
	// Let the client elect its leader and start its producers.
	time.Sleep(500 * time.Millisecond)
	if err := m.start(ctx); err != nil {
		return res, err
	}
	for from := 0; from < n; from += 500 {
		to := min(from+500, n)
		params := make([]river.InsertManyParams, 0, to-from)
		at := time.Now().UnixNano()
		for p := from; p < to; p++ {
			m.submit[p].Store(at)
			params = append(params, river.InsertManyParams{Args: stepJob{Process: p, Step: 1}})
		}
		if _, err := client.InsertMany(ctx, params); err != nil {
			return res, fmt.Errorf("river insert: %w", err)
		}
	}
	if err := wait(ctx, all, n); err != nil {
		return res, err
	}
	return res, m.stop(ctx, &res)
}
