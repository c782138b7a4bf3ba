package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"

	"github.com/compensa/compensa/cdc"
	"github.com/compensa/compensa/correlator"
	"github.com/compensa/compensa/migrations"
	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/pgjournal"
)

// runCompensa (group: RunnerConfig.GroupCommit, 0 for the default of 8, 1
// for one step per transaction always) starts n three-step sagas through the correlator (the real
// start path, 1,000 trigger events per transaction, all submitted at t0 like
// River's backlog) while the step runner, with its default settings, runs
// them. Completion is the commit of the saga's last step (OnTerminal is
// called after it).
func runCompensa(ctx context.Context, dsn string, n, group int) (Result, error) {
	res := Result{Mode: "backlog: all started at t0 through the correlator, runner defaults (8 workers, group commit of 8 while a backlog exists)"}
	if group == 1 {
		res.Mode = "the same, without group commit (RunnerConfig.GroupCommit 1: one step per transaction)"
	}
	rt := &roundTrips{}
	cfg := (&saga.RunnerConfig{}).WithDefaults()
	pool, err := newPool(ctx, dsn, int32(cfg.Workers+8), rt)
	if err != nil {
		return res, err
	}
	defer pool.Close()
	if _, err := migrations.Apply(ctx, pool, migrations.Options{}); err != nil {
		return res, fmt.Errorf("migrate: %w", err)
	}
	m := newMeter(dsn, rt, n)
	var index sync.Map // trigger event id -> process, then instance id -> process
	noop := func(context.Context, *saga.StepTx) error { return nil }
	reg := saga.NewRegistry()
	reg.MustRegister(saga.Definition{
		Name: "peers", Version: 1,
		Triggers: []saga.Trigger{{EventType: "peers.started"}},
		Steps: []saga.Step{
			{Name: "one", Do: func(_ context.Context, x *saga.StepTx) error {
				if p, ok := index.Load(x.Instance.TriggerEventID); ok {
					index.Store(x.Instance.ID, p)
				}
				return nil
			}},
			{Name: "two", Do: noop},
			{Name: "three", Do: noop},
		},
	})
	all := make(chan struct{})
	var left sync.WaitGroup
	left.Add(n)
	go func() { left.Wait(); close(all) }()
	journal, err := pgjournal.New(pool, nil)
	if err != nil {
		return res, err
	}
	runner, err := saga.NewRunner(journal, pool, reg, &saga.RunnerConfig{GroupCommit: group, Hooks: saga.Hooks{
		OnTerminal: func(ev saga.TerminalEvent) {
			if ev.Status != saga.StatusCompleted {
				return
			}
			if p, ok := index.Load(ev.InstanceID); ok && m.done[p.(int)].CompareAndSwap(0, time.Now().UnixNano()) {
				left.Done()
			}
		},
	}})
	if err != nil {
		return res, err
	}
	if err := runner.Start(ctx); err != nil {
		return res, err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_ = runner.Stop(sctx)
	}()
	corr, err := correlator.New(pool, &correlator.Config{Registry: reg, Wake: runner.Wake})
	if err != nil {
		return res, err
	}
	tenant := uuid.New()
	if err := m.start(ctx); err != nil {
		return res, err
	}
	var lsn pglogrepl.LSN = 0x10000000
	for done := 0; done < n; {
		size := min(1000, n-done)
		evs := make([]outbox.Event, size)
		for j := range evs {
			p := done + j
			id := uuid.New()
			index.Store(id, p)
			evs[j] = outbox.Event{ID: id, TenantID: tenant, AggregateType: "process", AggregateID: fmt.Sprint(p),
				EventType: "peers.started", Payload: fmt.Appendf(nil, `{"p": %d}`, p)}
		}
		lsn += 0x1000
		at := time.Now().UnixNano()
		for j := range evs {
			m.submit[done+j].Store(at)
		}
		if err := corr.HandleBatch(ctx, cdc.Batch{Slot: "peers", Events: evs, CommitLSN: lsn, EndLSN: lsn + 0x10, CommitTime: time.Now()}); err != nil {
			return res, err
		}
		done += size
	}
	if err := wait(ctx, all, n); err != nil {
		return res, err
	}
	return res, m.stop(ctx, &res)
}

// wait waits for every process to complete, at most 10 minutes.
func wait(ctx context.Context, all <-chan struct{}, n int) error {
	t := time.NewTimer(10 * time.Minute)
	defer t.Stop()
	select {
	case <-all:
		return nil
	case <-t.C:
		return fmt.Errorf("not all %d processes completed within 10 minutes", n)
	case <-ctx.Done():
		return ctx.Err()
	}
}
