package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/declare"
	"github.com/compensa/compensa/saga/pgjournal"
)

// DeclaredResult is scenario "declared": the same three SQL steps run as a
// saga written in Go and as one declared in YAML with CEL parameters, on the
// same runner; Ratio (declared_step_ratio) is declared steps/s over Go
// steps/s, the median of paired runs.
type DeclaredResult struct {
	Sagas               int       `json:"sagas"`
	GoStepsPerSec       float64   `json:"go_steps_per_sec"`
	DeclaredStepsPerSec float64   `json:"declared_steps_per_sec"`
	Ratio               float64   `json:"declared_step_ratio"`
	GoRuns              []float64 `json:"go_runs,omitempty"`
	DeclaredRuns        []float64 `json:"declared_runs,omitempty"`
}

// The step both sagas run: one UPDATE by primary key, its parameter taken
// from the trigger's payload.
const (
	sqlDeclaredTable = `CREATE TABLE IF NOT EXISTS bench_declared (id integer PRIMARY KEY, n bigint NOT NULL DEFAULT 0);
INSERT INTO bench_declared (id) SELECT g FROM generate_series(0, 999) g ON CONFLICT DO NOTHING`
	sqlDeclaredStep = `UPDATE bench_declared SET n = n + 1 WHERE id = $1`
)

const declaredBenchSaga = `saga: bench_declared
version: 1
triggers: [{event_type: ` + benchEventType + `}]
steps:
  - name: reserve
    sql: { query: "` + sqlDeclaredStep + `", params: ["${ trigger.payload.seq % 1000 }"] }
  - name: charge
    sql: { query: "` + sqlDeclaredStep + `", params: ["${ trigger.payload.seq % 1000 }"] }
  - name: confirm
    sql: { query: "` + sqlDeclaredStep + `", params: ["${ trigger.payload.seq % 1000 }"] }
`

// goSQLRegistry is the Go twin of declaredBenchSaga: each step decodes the
// state, as a typed step does, and runs the same statement.
func goSQLRegistry() *saga.Registry {
	type state struct {
		Seq int `json:"seq"`
	}
	step := func(name string) saga.TypedStep[state] {
		return saga.TypedStep[state]{Name: name, Do: func(ctx context.Context, st *state, x *saga.StepTx) error {
			_, err := x.Tx.Exec(ctx, sqlDeclaredStep, st.Seq%1000)
			return err
		}}
	}
	reg := saga.NewRegistry()
	reg.MustRegister(saga.Define(saga.TypedDefinition[state]{
		Name: "bench_go_sql", Version: 1, Triggers: []saga.Trigger{{EventType: benchEventType}},
		Steps: []saga.TypedStep[state]{step("reserve"), step("charge"), step("confirm")},
	}))
	return reg
}

func declaredRegistry() (*saga.Registry, error) {
	s, probs := declare.LoadFile("bench_declared.yaml", []byte(declaredBenchSaga), declare.Options{})
	if probs != nil {
		return nil, probs
	}
	reg := saga.NewRegistry()
	return reg, reg.Register(s.Definition(nil))
}

func (r *run) declaredScenario(ctx context.Context) error {
	if _, err := r.env.pool.Exec(ctx, sqlDeclaredTable); err != nil {
		return fmt.Errorf("bench: declared table: %w", err)
	}
	res := DeclaredResult{Sagas: r.sz.stepSagas}
	var ratios []float64
	for i := range r.sz.repeats {
		declReg, err := declaredRegistry()
		if err != nil {
			return err
		}
		goRate, err := r.sqlStepsRun(ctx, goSQLRegistry(), fmt.Sprintf("declared: run %d/%d: Go steps", i+1, r.sz.repeats))
		if err != nil {
			return err
		}
		declRate, err := r.sqlStepsRun(ctx, declReg, fmt.Sprintf("declared: run %d/%d: declared steps", i+1, r.sz.repeats))
		if err != nil {
			return err
		}
		res.GoRuns = append(res.GoRuns, goRate)
		res.DeclaredRuns = append(res.DeclaredRuns, declRate)
		ratios = append(ratios, declRate/goRate)
		r.progress("declared: run %d/%d: Go %.0f steps/s, declared %.0f steps/s: ratio %.2f", i+1, r.sz.repeats, goRate, declRate, declRate/goRate)
	}
	res.GoStepsPerSec, res.DeclaredStepsPerSec, res.Ratio = median(res.GoRuns), median(res.DeclaredRuns), median(ratios)
	r.report.Declared = &res
	return nil
}

// sqlStepsRun starts stepSagas sagas of reg through the correlator, runs
// them with the runner's defaults and returns steps per second.
func (r *run) sqlStepsRun(ctx context.Context, reg *saga.Registry, what string) (float64, error) {
	e, n := r.env, r.sz.stepSagas
	if err := e.reset(ctx); err != nil {
		return 0, err
	}
	r.progress("%s: starting %d sagas", what, n)
	if err := seedSagas(ctx, e.pool, reg, e.slotName("seed"), n); err != nil {
		return 0, err
	}
	if _, err := e.pool.Exec(ctx, `ANALYZE saga_instances`); err != nil {
		return 0, err
	}
	cfg := (&saga.RunnerConfig{}).WithDefaults()
	pool, err := openRelayPool(ctx, e.url, cfg.Workers)
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	journal, err := pgjournal.New(pool, nil)
	if err != nil {
		return 0, err
	}
	var completed atomic.Int64
	var once sync.Once
	done := make(chan struct{})
	var doneAt time.Time
	var failed atomic.Value
	runner, err := saga.NewRunner(journal, pool, reg, &saga.RunnerConfig{
		Logger: r.log.With("component", "runner"),
		Hooks: saga.Hooks{OnTerminal: func(ev saga.TerminalEvent) {
			if ev.Status != saga.StatusCompleted {
				failed.Store(fmt.Sprintf("%s ended %s: %s", ev.InstanceID, ev.Status, ev.Reason))
			}
			if completed.Add(1) == int64(n) {
				once.Do(func() { doneAt = time.Now(); close(done) })
			}
		}},
	})
	if err != nil {
		return 0, err
	}
	began := time.Now()
	if err := runner.Start(ctx); err != nil {
		return 0, err
	}
	if err := r.waitSagas(ctx, runner, done, &completed, n, "%d of %d sagas ended after %s"); err != nil {
		return 0, err
	}
	if f, ok := failed.Load().(string); ok {
		return 0, fmt.Errorf("a saga did not complete: %s", f)
	}
	return rate(n*benchStepsPerSaga, doneAt.Sub(began)), nil
}
