package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dbos-inc/dbos-transact-golang/dbos"
)

// dbosInFlight is how many workflows the DBOS run keeps in flight: callers
// each start one workflow (RunWorkflow) and wait for its result before
// starting the next. DBOS runs a workflow in the caller's process as soon as
// it is started, so a closed loop is its natural way to carry a load.
const dbosInFlight = 100

// dbosProcess is the benchmarked workflow: three steps, each checkpointed
// by DBOS in its system database, each passing a value to the next.
func dbosProcess(ctx dbos.Context, p int) (int, error) {
	v := p
	for _, name := range []string{"one", "two", "three"} {
		var err error
		v, err = dbos.RunAsStep(ctx, func(context.Context) (int, error) { return v + 1, nil }, dbos.WithStepName(name))
		if err != nil {
			return 0, err
		}
	}
	return v, nil
}

// runDBOS runs n workflows, dbosInFlight at a time, on a pool of 20
// connections (DBOS's own default size). Completion is GetResult returning,
// which DBOS does after the workflow's final status commits.
func runDBOS(ctx context.Context, dsn string, n int) (Result, error) {
	res := Result{Mode: fmt.Sprintf("closed loop: %d callers, RunWorkflow + GetResult, pool 20", dbosInFlight)}
	rt := &roundTrips{}
	pool, err := newPool(ctx, dsn, 20, rt)
	if err != nil {
		return res, err
	}
	defer pool.Close()
	dctx, err := dbos.NewContext(ctx, dbos.Config{
		AppName: "peers", ApplicationVersion: "peers-1", SystemDBPool: pool,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return res, fmt.Errorf("dbos: %w", err)
	}
	dbos.RegisterWorkflow(dctx, dbosProcess, dbos.WithWorkflowName("peers"))
	if err := dbos.Launch(dctx); err != nil {
		return res, fmt.Errorf("dbos launch: %w", err)
	}
	defer func() { _ = dbos.Shutdown(dctx, 10*time.Second) }()

	m := newMeter(dsn, rt, n)
	if err := m.start(ctx); err != nil {
		return res, err
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	var firstErr error
	var errOnce sync.Once
	for range dbosInFlight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				p := int(next.Add(1) - 1)
				if p >= n || ctx.Err() != nil {
					return
				}
				m.submit[p].Store(time.Now().UnixNano())
				h, err := dbos.RunWorkflow(dctx, dbosProcess, p)
				var v int
				if err == nil {
					v, err = h.GetResult()
				}
				if err == nil && v != p+stepsPerProcess {
					err = fmt.Errorf("process %d returned %d, want %d", p, v, p+stepsPerProcess)
				}
				if err != nil {
					errOnce.Do(func() { firstErr = err })
					return
				}
				m.done[p].Store(time.Now().UnixNano())
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return res, fmt.Errorf("dbos: %w", firstErr)
	}
	return res, m.stop(ctx, &res)
}
