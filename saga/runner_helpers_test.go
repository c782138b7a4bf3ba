package saga_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/pgjournal"
	"github.com/compensa/compensa/test/pgtest"
)

// rig is one test's world: a fresh database, its journal, a registry, and
// the tables the test steps write their effects to.
type rig struct {
	t       *testing.T
	db      *pgtest.DB
	journal saga.Journal
	reg     *saga.Registry
	tenant  uuid.UUID
	logs    *logBuffer
}

func newRig(t *testing.T) *rig {
	t.Helper()
	db := pgtest.NewDB(t)
	r := &rig{t: t, db: db, journal: newJournal(t, db.Pool), reg: saga.NewRegistry(), tenant: uuid.New(), logs: &logBuffer{}}
	// effects: one row per committed step effect; comp_log: one row per
	// committed compensation, in commit order.
	r.exec(`CREATE TABLE effects (id bigserial PRIMARY KEY, instance_id uuid NOT NULL, step text NOT NULL,
		attempt int NOT NULL, runner text NOT NULL DEFAULT '', at timestamptz NOT NULL DEFAULT clock_timestamp())`)
	r.exec(`CREATE TABLE comp_log (id bigserial PRIMARY KEY, instance_id uuid NOT NULL, step text NOT NULL,
		attempt int NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())`)
	t.Cleanup(func() {
		// The worker's copy of the projection must follow the journal's
		// without reading it back.
		if strings.Contains(r.logs.String(), "local advance refused") {
			t.Error("the runner's local projection diverged from the journal's")
		}
		if t.Failed() {
			t.Log("runner logs:\n" + r.logs.String())
		}
	})
	return r
}

func newJournal(t *testing.T, pool *pgxpool.Pool) saga.Journal {
	t.Helper()
	j, err := pgjournal.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

func (r *rig) exec(sql string, args ...any) {
	r.t.Helper()
	if _, err := r.db.Pool.Exec(context.Background(), sql, args...); err != nil {
		r.t.Fatalf("exec %q: %v", sql, err)
	}
}

func (r *rig) count(sql string, args ...any) int {
	r.t.Helper()
	var n int
	if err := r.db.Pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		r.t.Fatalf("query %q: %v", sql, err)
	}
	return n
}

// cfg is a runner configuration fit for tests: quick polls, a lease long
// enough for a loaded machine.
func (r *rig) cfg(c *saga.RunnerConfig) *saga.RunnerConfig {
	if c == nil {
		c = &saga.RunnerConfig{}
	}
	if c.PollInterval == 0 {
		c.PollInterval = 20 * time.Millisecond
	}
	if c.MaxPollInterval == 0 {
		c.MaxPollInterval = 200 * time.Millisecond
	}
	if c.LeaseDuration == 0 {
		c.LeaseDuration = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(r.logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	return c
}

// run starts a runner over pool (the rig's pool when nil) and stops it when
// the test ends.
func (r *rig) run(pool *pgxpool.Pool, journal saga.Journal, c *saga.RunnerConfig) *saga.Runner {
	r.t.Helper()
	if pool == nil {
		pool = r.db.Pool
	}
	if journal == nil {
		// Each "process" reaches the database through its own pool.
		journal = newJournal(r.t, pool)
	}
	run, err := saga.NewRunner(journal, pool, r.reg, r.cfg(c))
	if err != nil {
		r.t.Fatal(err)
	}
	if err := run.Start(context.Background()); err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := run.Stop(ctx); err != nil {
			r.t.Errorf("Stop: %v", err)
		}
	})
	return run
}

// pool opens a second pool on the test database: another "process".
func (r *rig) pool(size int32) *pgxpool.Pool {
	r.t.Helper()
	cfg, err := pgxpool.ParseConfig(r.db.URL)
	if err != nil {
		r.t.Fatal(err)
	}
	cfg.MaxConns = size
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(p.Close)
	return p
}

// start enqueues one instance of def with state as its context.
func (r *rig) start(def saga.Definition, state any, timeout time.Duration) uuid.UUID {
	r.t.Helper()
	b, err := json.Marshal(state)
	if err != nil {
		r.t.Fatal(err)
	}
	inst := saga.Instance{
		ID: uuid.New(), TenantID: r.tenant, SagaName: def.Name, SagaVersion: def.Version,
		Status: saga.StatusRunning, TriggerEventID: uuid.New(), Context: b,
		CorrelationID: uuid.NullUUID{UUID: uuid.New(), Valid: true},
	}
	if timeout > 0 {
		at := time.Now().Add(timeout)
		inst.TimeoutAt = &at
	}
	if err := r.journal.Enqueue(context.Background(), inst); err != nil {
		r.t.Fatal(err)
	}
	return inst.ID
}

// startMany inserts n instances in one statement (as the correlator does)
// and returns their ids.
func (r *rig) startMany(def saga.Definition, n int) []uuid.UUID {
	r.t.Helper()
	rows, err := r.db.Pool.Query(context.Background(), `
		INSERT INTO saga_instances (tenant_id, saga_name, saga_version, trigger_event_id, context)
		SELECT $1, $2, $3, gen_random_uuid(), '{}'::jsonb FROM generate_series(1, $4)
		RETURNING id`, r.tenant, def.Name, def.Version, n)
	if err != nil {
		r.t.Fatal(err)
	}
	var ids []uuid.UUID
	for rows.Next() {
		var id uuid.UUID
		if err := rows.Scan(&id); err != nil {
			r.t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		r.t.Fatal(err)
	}
	return ids
}

// wait polls until the instance reaches want (a terminal status), and fails
// the test with its history if it does not within d.
func (r *rig) wait(id uuid.UUID, want saga.Status, d time.Duration) saga.Instance {
	r.t.Helper()
	deadline := time.Now().Add(d)
	for {
		inst, err := r.journal.Get(context.Background(), id)
		if err != nil {
			r.t.Fatal(err)
		}
		if inst.Status == want {
			return inst
		}
		if inst.Status.Terminal() || time.Now().After(deadline) {
			r.t.Fatalf("instance %s is %s (step %d, last error %q), want %s\n%s", id, inst.Status, inst.CurrentStep, inst.LastError, want, r.history(id))
		}
		time.Sleep(15 * time.Millisecond)
	}
}

// waitAll polls until no instance is RUNNING or COMPENSATING.
func (r *rig) waitAll(d time.Duration) {
	r.t.Helper()
	deadline := time.Now().Add(d)
	for {
		n := r.count(`SELECT count(*) FROM saga_instances WHERE status IN ('RUNNING','COMPENSATING')`)
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("%d instances still running after %s", n, d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (r *rig) history(id uuid.UUID) string {
	evs, err := r.journal.Load(context.Background(), id)
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, e := range evs {
		fmt.Fprintf(&b, "  v%d %s step=%d reason=%q error=%q retry_in=%s\n", e.Version, e.Kind, e.Step, e.Reason, e.Error, e.RetryIn)
	}
	return b.String()
}

// kinds lists the kinds of an instance's events, "kind:step" each.
func (r *rig) kinds(id uuid.UUID) []string {
	r.t.Helper()
	evs, err := r.journal.Load(context.Background(), id)
	if err != nil {
		r.t.Fatal(err)
	}
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = fmt.Sprintf("%s:%d", e.Kind, e.Step)
	}
	return out
}

func (r *rig) steps(id uuid.UUID) []saga.StepRecord {
	r.t.Helper()
	recs, err := r.journal.Steps(context.Background(), id)
	if err != nil {
		r.t.Fatal(err)
	}
	return recs
}

// compOrder lists the steps compensated for id, in commit order.
func (r *rig) compOrder(id uuid.UUID) []string {
	r.t.Helper()
	rows, err := r.db.Pool.Query(context.Background(), `SELECT step FROM comp_log WHERE instance_id = $1 ORDER BY id`, id)
	if err != nil {
		r.t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			r.t.Fatal(err)
		}
		out = append(out, s)
	}
	return out
}

// trail is the typed state of the test sagas: the steps that ran, in order.
type trail struct {
	Visited []string `json:"visited"`
	Hits    int      `json:"hits,omitempty"`
}

// effectStep is a typed step that records its effect in effects and its
// name in the state; its compensation records itself in comp_log.
func effectStep(name string) saga.TypedStep[trail] {
	return saga.TypedStep[trail]{
		Name: name,
		Do: func(ctx context.Context, s *trail, x *saga.StepTx) error {
			s.Visited = append(s.Visited, name)
			_, err := x.Tx.Exec(ctx, `INSERT INTO effects (instance_id, step, attempt) VALUES ($1, $2, $3)`, x.Instance.ID, name, x.Attempt)
			return err
		},
		Compensate: compensateInto(name),
	}
}

func compensateInto(name string) func(ctx context.Context, s trail, x *saga.StepTx) error {
	return func(ctx context.Context, s trail, x *saga.StepTx) error {
		_, err := x.Tx.Exec(ctx, `INSERT INTO comp_log (instance_id, step, attempt) VALUES ($1, $2, $3)`, x.Instance.ID, name, x.Attempt)
		return err
	}
}

func typedDef(name string, steps ...saga.TypedStep[trail]) saga.Definition {
	return saga.Define(saga.TypedDefinition[trail]{
		Name: name, Version: 1,
		Triggers: []saga.Trigger{{EventType: name + ".requested"}},
		Steps:    steps,
	})
}

// hookLog collects the runner's hook events.
type hookLog struct {
	mu    sync.Mutex
	steps []saga.StepEvent
	ends  []saga.TerminalEvent
	stuck []string
}

func (h *hookLog) hooks() saga.Hooks {
	return saga.Hooks{
		OnStep: func(e saga.StepEvent) {
			h.mu.Lock()
			h.steps = append(h.steps, e)
			h.mu.Unlock()
		},
		OnTerminal: func(e saga.TerminalEvent) {
			h.mu.Lock()
			h.ends = append(h.ends, e)
			h.mu.Unlock()
		},
		OnStuck: func(inst saga.Instance, reason string) {
			h.mu.Lock()
			h.stuck = append(h.stuck, reason)
			h.mu.Unlock()
		},
	}
}

func (h *hookLog) outcomes(step string, comp bool) []saga.Outcome {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []saga.Outcome
	for _, e := range h.steps {
		if e.StepName == step && e.Compensation == comp {
			out = append(out, e.Outcome)
		}
	}
	return out
}

func (h *hookLog) count(o saga.Outcome) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, e := range h.steps {
		if e.Outcome == o {
			n++
		}
	}
	return n
}

// logBuffer keeps the runner's logs for a failing test's report.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.b.Len() > 1<<20 {
		return len(p), nil
	}
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func equal[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
