package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/compensa/compensa/cdc"
	"github.com/compensa/compensa/correlator"
	"github.com/compensa/compensa/internal/tracing"
	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/pgjournal"
)

// stepsScenario is scenario 3: sagas of three trivial steps run by the step
// runner with its default settings, and pgbench running the shape of one
// step (one INSERT plus one UPDATE by primary key per transaction, 8
// clients) for the same time, alternating in slices (stepsRun); repeated,
// the ratio is the median of the passes' ratios.
func (r *run) stepsScenario(ctx context.Context) error {
	var runs []StepsResult
	var peers []peerRun
	for i := range r.sz.repeats {
		res, err := r.stepsRun(ctx, i)
		if err != nil {
			return err
		}
		runs = append(runs, res)
		if r.cfg.Peers != "" {
			p, err := r.runPeers(ctx, i)
			if err != nil {
				return err
			}
			peers = append(peers, p)
		}
	}
	pick := func(f func(StepsResult) float64) float64 {
		v := make([]float64, len(runs))
		for i, x := range runs {
			v[i] = f(x)
		}
		return median(v)
	}
	res := runs[0]
	res.Seconds = pick(func(x StepsResult) float64 { return x.Seconds })
	res.StepsPerSec = pick(func(x StepsResult) float64 { return x.StepsPerSec })
	res.PgbenchTPS = pick(func(x StepsResult) float64 { return x.PgbenchTPS })
	res.Ratio = pick(func(x StepsResult) float64 { return x.Ratio })
	ratios := make([]float64, len(runs))
	for i, x := range runs {
		ratios[i] = x.Ratio
		res.LoadAverages = append(res.LoadAverages, x.LoadAverages...)
	}
	res.RatioSpread = spread(ratios)
	res.Claims = int(pick(func(x StepsResult) float64 { return float64(x.Claims) }))
	res.PerClaim = pick(func(x StepsResult) float64 { return x.PerClaim })
	res.ClaimSeconds = pick(func(x StepsResult) float64 { return x.ClaimSeconds })
	res.HotShare = pick(func(x StepsResult) float64 { return x.HotShare })
	res.ServerMsPerStep = medianOf(runs, func(x StepsResult) *float64 { return x.ServerMsPerStep })
	res.PgbenchServerMsPerTx = medianOf(runs, func(x StepsResult) *float64 { return x.PgbenchServerMsPerTx })
	res.Statements = runs[len(runs)-1].Statements
	res.PgbenchStatements = runs[len(runs)-1].PgbenchStatements
	for _, x := range runs {
		res.StepsRuns = append(res.StepsRuns, x.StepsPerSec)
		res.PgbenchRuns = append(res.PgbenchRuns, x.PgbenchTPS)
	}
	if len(peers) > 0 {
		var d, rv, rf []float64
		for _, p := range peers {
			d, rv, rf = append(d, p.DBOS), append(rv, p.River), append(rf, p.RiverFast)
			res.PeerRuns = append(res.PeerRuns, fmt.Sprintf("dbos %.0f, river %.0f, river-fast %.0f", p.DBOS, p.River, p.RiverFast))
		}
		res.PeerDBOS, res.PeerRiver, res.PeerRiverFast = f64(median(d)), f64(median(rv)), f64(median(rf))
	}
	r.report.Steps = &res
	return nil
}

// stepSlices is how many alternating parts a steps pass has: the
// runner's sagas in that many slices, each followed by pgbench for as long
// as the slice took. Both are bound by the WAL's fsyncs, whose latency on
// a shared disk drifts by half within seconds (pg_test_fsync's fdatasync:
// 95 to 162 µs in consecutive 2-second windows); a pass of 20 seconds of
// ours then 20 of pgbench's paired the two across such a drift, and the
// step ratio of one run went from 0.95 to 1.72. Slices a few seconds long
// put both sides of a pair on the same disk.
const stepSlices = 4

// stepsRun is one pass of the step scenario: stepSlices pairs of a slice
// of the sagas and pgbench for as long as it took, the pass's figures the
// sums of its slices.
func (r *run) stepsRun(ctx context.Context, i int) (StepsResult, error) {
	e := r.env
	n := r.sz.stepSagas
	res := StepsResult{Sagas: n, StepsPerSaga: benchStepsPerSaga, LoadAverages: []float64{loadAverage()}}
	if err := e.reset(ctx); err != nil {
		return res, err
	}
	reg := benchRegistry(nil)
	upd0, hot0 := e.instanceUpdates(ctx)
	cfg := (&saga.RunnerConfig{}).WithDefaults()
	res.Workers = cfg.Workers
	pool, err := openRelayPool(ctx, e.url, cfg.Workers)
	if err != nil {
		return res, err
	}
	defer pool.Close()
	journal, err := pgjournal.New(pool, nil)
	if err != nil {
		return res, err
	}
	// The OTEL_* variables trace the steps as they would in `relay run`
	// (to measure tracing's cost, e.g. sampled at 0); unset, tracing is off.
	tp, err := tracing.FromEnv(ctx)
	if err != nil {
		return res, err
	}
	var tracer trace.TracerProvider
	if tp != nil {
		defer tp.Shutdown(context.WithoutCancel(ctx))
		tracer = tp
		r.progress("steps: run %d/%d: tracing on (OTEL_* environment)", i+1, r.sz.repeats)
	}
	var took, pgTook time.Duration
	var pgTx, serverMs, pgServerMs float64
	var serverKnown bool
	var claims, claimed int64
	var claimNanos time.Duration
	for k := range stepSlices {
		size := n*(k+1)/stepSlices - n*k/stepSlices
		if size == 0 {
			continue
		}
		sl, err := r.stepsSlice(ctx, journal, pool, reg, tracer, k, size)
		if err != nil {
			return res, fmt.Errorf("steps: run %d/%d, slice %d: %w", i+1, r.sz.repeats, k+1, err)
		}
		took += sl.took
		claims, claimed, claimNanos = claims+sl.claims, claimed+sl.claimed, claimNanos+sl.claimNanos
		steps := size * benchStepsPerSaga
		if ms := e.serverMsPer(ctx, steps); ms != nil {
			serverKnown = true
			serverMs += *ms * float64(steps)
		}
		if k == stepSlices-1 {
			res.Statements = e.topStatements(ctx, 8, steps)
		}
		e.resetStatements(ctx)
		pg, err := e.runPgbenchSteps(ctx, sl.took, n)
		if err != nil {
			return res, err
		}
		tx := pg.TPS * pg.Duration.Seconds()
		pgTx, pgTook = pgTx+tx, pgTook+pg.Duration
		if ms := e.serverMsPer(ctx, max(1, int(tx))); ms != nil {
			pgServerMs += *ms * tx
		}
		if k == stepSlices-1 {
			res.PgbenchStatements = e.topStatements(ctx, 4, max(1, int(tx)))
		}
		res.PgbenchClients = pg.Clients
		r.progress("steps: run %d/%d, slice %d/%d: %.0f steps/s over %s, pgbench %.0f tps",
			i+1, r.sz.repeats, k+1, stepSlices, rate(steps, sl.took), sl.took.Round(10*time.Millisecond), pg.TPS)
	}
	var finished int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM saga_instances WHERE status = 'COMPLETED'`).Scan(&finished); err != nil {
		return res, err
	}
	if finished != n {
		return res, fmt.Errorf("%d of %d sagas COMPLETED in the database", finished, n)
	}
	res.Seconds, res.StepsPerSec = took.Seconds(), rate(n*benchStepsPerSaga, took)
	res.Claims, res.ClaimSeconds = int(claims), claimNanos.Seconds()
	if claims > 0 {
		res.PerClaim = float64(claimed) / float64(claims)
	}
	if serverKnown {
		res.ServerMsPerStep = f64(serverMs / float64(n*benchStepsPerSaga))
		res.PgbenchServerMsPerTx = f64(pgServerMs / max(1, pgTx))
	}
	if upd1, hot1 := e.instanceUpdates(ctx); upd1 > upd0 {
		res.HotShare = float64(hot1-hot0) / float64(upd1-upd0)
	}
	res.PgbenchSeconds = pgTook.Seconds()
	if pgTook > 0 {
		res.PgbenchTPS = pgTx / pgTook.Seconds()
	}
	if res.PgbenchTPS > 0 {
		res.Ratio = res.StepsPerSec / res.PgbenchTPS
	}
	r.progress("steps: run %d/%d: %.0f steps/s vs pgbench %.0f tps: ratio %.2f; %d claims of %.1f instances on average, %.1f s inside claim queries",
		i+1, r.sz.repeats, res.StepsPerSec, res.PgbenchTPS, res.Ratio, res.Claims, res.PerClaim, res.ClaimSeconds)
	return res, nil
}

// stepsSliceResult is what one slice of a steps pass measured.
type stepsSliceResult struct {
	took            time.Duration
	claims, claimed int64
	claimNanos      time.Duration
}

// stepsSlice starts size sagas through the correlator, then runs them with
// a runner of the default settings until all have completed, with
// pg_stat_statements reset at its start.
func (r *run) stepsSlice(ctx context.Context, journal *pgjournal.Journal, pool *pgxpool.Pool, reg *saga.Registry, tracer trace.TracerProvider, slice, size int) (stepsSliceResult, error) {
	e := r.env
	var out stepsSliceResult
	// A slot name of its own: the correlator's checkpoint for a slot would
	// take the next slice's synthetic LSNs for a replay.
	if err := seedSagas(ctx, e.pool, reg, e.slotName(fmt.Sprintf("seed%d", slice)), size); err != nil {
		return out, err
	}
	// Vacuumed as pgbench's table is before its slice: otherwise the
	// seed's inserts wake autovacuum at a moment of its own during some
	// slices and not others.
	if _, err := e.pool.Exec(ctx, `VACUUM ANALYZE saga_instances`); err != nil {
		return out, err
	}
	e.checkpoint(ctx)
	var completed, claims, claimed, claimNanos atomic.Int64
	var once sync.Once
	done := make(chan struct{})
	var doneAt time.Time
	runner, err := saga.NewRunner(journal, pool, reg, &saga.RunnerConfig{
		Logger: r.log.With("component", "runner"), TracerProvider: tracer,
		Hooks: saga.Hooks{
			OnTerminal: func(ev saga.TerminalEvent) {
				if ev.Status == saga.StatusCompleted && completed.Add(1) == int64(size) {
					once.Do(func() { doneAt = time.Now(); close(done) })
				}
			},
			OnClaim: func(k int, took time.Duration) {
				claims.Add(1)
				claimed.Add(int64(k))
				claimNanos.Add(int64(took))
			},
		},
	})
	if err != nil {
		return out, err
	}
	e.resetStatements(ctx)
	began := time.Now()
	if err := runner.Start(ctx); err != nil {
		return out, err
	}
	if err := r.waitSagas(ctx, runner, done, &completed, size, "%d of %d sagas completed after %s"); err != nil {
		return out, err
	}
	out.took = doneAt.Sub(began)
	out.claims, out.claimed, out.claimNanos = claims.Load(), claimed.Load(), time.Duration(claimNanos.Load())
	// A backend's statistics reach pg_stat when it is idle for a while or
	// exits: every connection of the slice is released before they are read.
	pool.Reset()
	return out, nil
}

// openRelayPool sizes a pool as `relay run` does: a connection per worker
// plus room for claims, heartbeats and the correlator.
func openRelayPool(ctx context.Context, url string, workers int) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = int32(workers + 8)
	return pgxpool.NewWithConfig(ctx, cfg)
}

// seedSagas starts n bench sagas through the correlator in batches of 1,000
// synthetic events: the real start path, without a stream.
func seedSagas(ctx context.Context, pool *pgxpool.Pool, reg *saga.Registry, slot string, n int) error {
	corr, err := correlator.New(pool, &correlator.Config{Registry: reg, DisableNotify: true})
	if err != nil {
		return err
	}
	tenant := uuid.MustParse(benchTenant)
	var lsn pglogrepl.LSN = 0x10000000
	for done := 0; done < n; {
		size := min(1000, n-done)
		evs := make([]outbox.Event, size)
		lsn += 0x1000
		for j := range evs {
			seq := done + j
			evs[j] = outbox.Event{ID: uuid.New(), TenantID: tenant, AggregateType: "order", AggregateID: fmt.Sprint(seq),
				EventType: benchEventType, Payload: fmt.Appendf(nil, `{"seq": %d, "currency": "EUR", "amount_cents": 4200}`, seq), LSN: uint64(lsn)}
		}
		if err := corr.HandleBatch(ctx, cdc.Batch{Slot: slot, Events: evs, CommitLSN: lsn, EndLSN: lsn + 0x10, CommitTime: time.Now()}); err != nil {
			return err
		}
		done += size
	}
	return nil
}

// instanceUpdates reads how many updates of saga_instances there were, and
// how many of them were HOT (no new index entries), from pg_stat.
func (e *env) instanceUpdates(ctx context.Context) (upd, hot int64) {
	time.Sleep(600 * time.Millisecond) // backends flush their statistics at most every 500 ms when idle
	_ = e.pool.QueryRow(ctx, `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'saga_instances'`).Scan(&upd, &hot)
	return upd, hot
}

func (e *env) resetStatements(ctx context.Context) {
	if e.statements {
		_, _ = e.pool.Exec(ctx, `SELECT pg_stat_statements_reset()`)
	}
}

// topStatements reads the n statements of this database with the most
// server time since the last reset, per step of the run.
func (e *env) topStatements(ctx context.Context, n, steps int) []StatementCost {
	if !e.statements || steps == 0 {
		return nil
	}
	rows, err := e.pool.Query(ctx, `
SELECT left(regexp_replace(s.query, '\s+', ' ', 'g'), 90), s.calls, s.total_exec_time, s.mean_exec_time, s.wal_bytes::float8
FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
WHERE d.datname = current_database() AND s.query NOT LIKE '%pg_stat%' AND s.calls >= 10
ORDER BY s.total_exec_time DESC LIMIT $1`, n)
	if err != nil {
		return nil
	}
	defer rows.Close()
	var out []StatementCost
	for rows.Next() {
		var c StatementCost
		var wal float64
		if rows.Scan(&c.Query, &c.Calls, &c.TotalMs, &c.MeanMs, &wal) != nil {
			return out
		}
		c.PerStepMs = c.TotalMs / float64(steps)
		c.WALBytesPerCall = wal / float64(max(c.Calls, 1))
		out = append(out, c)
	}
	return out
}

// serverMsPer is the server's time in every statement of this database
// since the last reset (pg_stat_statements' total_exec_time) over n (steps
// or transactions); nil when pg_stat_statements is not usable.
func (e *env) serverMsPer(ctx context.Context, n int) *float64 {
	if !e.statements || n == 0 {
		return nil
	}
	var total float64
	if e.pool.QueryRow(ctx, `
SELECT coalesce(sum(s.total_exec_time), 0)
FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
WHERE d.datname = current_database() AND s.query NOT LIKE '%pg_stat%'`).Scan(&total) != nil {
		return nil
	}
	return f64(total / float64(n))
}

// medianOf is the median of the runs' figures that were measured (nil when
// none was).
func medianOf(runs []StepsResult, f func(StepsResult) *float64) *float64 {
	var v []float64
	for _, x := range runs {
		if p := f(x); p != nil {
			v = append(v, *p)
		}
	}
	if len(v) == 0 {
		return nil
	}
	return f64(median(v))
}

// waitSagas waits until done closes (every saga of the run ended), the
// scenario's timeout passes (the error says how many ended, by format) or
// ctx ends, then stops the runner.
func (r *run) waitSagas(ctx context.Context, runner *saga.Runner, done <-chan struct{}, completed *atomic.Int64, n int, format string) error {
	timer := time.NewTimer(r.sz.timeout)
	defer timer.Stop()
	var waitErr error
	select {
	case <-done:
	case <-timer.C:
		waitErr = fmt.Errorf(format, completed.Load(), n, r.sz.timeout)
	case <-ctx.Done():
		waitErr = ctx.Err()
	}
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := runner.Stop(stopCtx); err != nil && waitErr == nil {
		waitErr = err
	}
	return waitErr
}
