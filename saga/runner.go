package saga

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/compensa/compensa/internal/logthrottle"
	"github.com/compensa/compensa/internal/tracing"
)

// Runner advances saga instances: it claims due instances in batches, runs
// one step (or one compensation) per transaction fenced by the instance's
// lease, schedules retries with capped backoff, compensates in reverse order
// and ends instances in their terminal status. Several runners, in one
// process or many, share the work through the journal's claim (FOR UPDATE
// SKIP LOCKED) and never advance the same instance at once.
type Runner struct {
	tracer   trace.Tracer // nil: tracing off
	journal  Journal
	pool     *pgxpool.Pool
	registry *Registry
	cfg      *RunnerConfig
	log      *slog.Logger
	// throttle keeps a failure that repeats in the runner's loops (the
	// database is down) to one log line per interval.
	throttle *logthrottle.Throttle

	mu      sync.Mutex
	started bool
	stopped bool

	// baseCtx carries Start's values and is never cancelled: leases and
	// compensations live under it.
	baseCtx context.Context
	// hardCtx is cancelled by a hard stop: forward steps run under it.
	hardCtx    context.Context
	hardCancel context.CancelFunc
	// stopping is closed when Stop begins: no new claim, no new step.
	stopping chan struct{}
	done     chan struct{}

	wake  chan struct{}
	freed chan struct{}
	work  chan []claim
	// busy counts the claimed instances handed to the workers (or waiting
	// for one) and not yet done; units counts them by unit of work (an
	// instance, or a group run by one worker).
	busy  atomic.Int64
	units atomic.Int64
	wg    sync.WaitGroup

	stuckMu   sync.Mutex
	stuckSeen map[stuckKey]struct{}
}

// NewRunner returns a runner over journal, running steps in transactions
// from pool with the definitions of registry. A nil cfg takes every default.
// journal must join the transaction carried by ContextWithTx (the PostgreSQL
// journal does), or a step's writes and its journal entry would not commit
// together.
//
// Steps with a Timeout should run on a pool whose connections cancel a
// statement on the server when its context ends (pool config:
// ConnConfig.BuildContextWatcherHandler returning a
// pgconn.CancelRequestContextWatcherHandler; package relay's pool does).
// With pgx's default a timed-out statement closes its connection, and the
// steps sharing a group commit's transaction with it lose their round and
// run again alone.
func NewRunner(journal Journal, pool *pgxpool.Pool, registry *Registry, cfg *RunnerConfig) (*Runner, error) {
	if journal == nil {
		return nil, Errorf(ErrInvalid, "NewRunner: journal is nil")
	}
	if pool == nil {
		return nil, Errorf(ErrInvalid, "NewRunner: pool is nil: steps run in transactions from it")
	}
	if registry == nil {
		return nil, Errorf(ErrInvalid, "NewRunner: registry is nil")
	}
	c := cfg.WithDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	return &Runner{
		journal:   journal,
		pool:      pool,
		registry:  registry,
		cfg:       c,
		log:       c.Logger,
		throttle:  logthrottle.New(c.Logger, 0),
		wake:      make(chan struct{}, 1),
		freed:     make(chan struct{}, 1),
		work:      make(chan []claim),
		stuckSeen: map[stuckKey]struct{}{},
		tracer:    tracing.Tracer(c.TracerProvider),
	}, nil
}

// Config returns the configuration in use, defaults filled.
func (r *Runner) Config() RunnerConfig { return *r.cfg }

// Start starts the workers, the claim loop and (unless disabled) the LISTEN
// connection, and returns once they run. ctx bounds the start-up only; its
// values reach the steps, but its cancellation does not stop the runner:
// Stop does, so that a signal context cancelled at shutdown does not turn a
// graceful stop into a hard one.
func (r *Runner) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.started {
		return Errorf(ErrInvalid, "runner already started: a Runner runs once")
	}
	var listenConn *pgx.Conn
	if !r.cfg.DisableListen {
		conn, err := r.connectListener(ctx)
		if err != nil {
			return err
		}
		listenConn = conn
	}
	r.started = true
	r.baseCtx = context.WithoutCancel(ctx)
	r.hardCtx, r.hardCancel = context.WithCancel(r.baseCtx)
	r.stopping = make(chan struct{})
	r.done = make(chan struct{})

	for range r.cfg.Workers {
		r.wg.Add(1)
		go r.worker()
	}
	r.wg.Add(1)
	go r.dispatch()
	if listenConn != nil {
		r.wg.Add(1)
		go r.listen(listenConn)
	}
	go func() {
		r.wg.Wait()
		r.hardCancel()
		close(r.done)
	}()
	r.log.Info("saga runner started", "config", r.cfg.String())
	return nil
}

// Stop stops the runner gracefully: no new claim and no new step; the steps
// and compensations in flight finish their transaction, and the leases of the
// instances this runner holds are released (or, with a journal that cannot
// release, expire). When ctx ends first, forward steps are cancelled (their
// transactions roll back, nothing is lost: the step runs again under the
// next claim, which records it as interrupted first, since a cancelled
// attempt may have called out) while a compensation in flight still
// finishes its transaction, bounded by its own timeout. Stop returns once every worker has returned;
// the error is ctx's when it had to cancel. Calling it again waits again.
func (r *Runner) Stop(ctx context.Context) error {
	r.mu.Lock()
	if !r.started {
		r.mu.Unlock()
		return nil
	}
	if !r.stopped {
		r.stopped = true
		close(r.stopping)
		r.log.Info("saga runner stopping")
	}
	r.mu.Unlock()
	select {
	case <-r.done:
		return nil
	case <-ctx.Done():
	}
	r.log.Warn("saga runner stop deadline passed: cancelling forward steps")
	r.hardCancel()
	<-r.done
	return ctx.Err()
}

// Wake makes the runner claim now instead of at its next poll. It never
// blocks; wake-ups coalesce.
func (r *Runner) Wake() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

func (r *Runner) isStopping() bool {
	select {
	case <-r.stopping:
		return true
	default:
		return false
	}
}

// claim is an instance a claim query returned, with the local time the query
// returned: with the lease's expiry it places the instance on the journal's
// clock (see work.now).
type claim struct {
	inst Instance
	at   time.Time
}

// dispatch claims due instances for idle workers, one query per batch.
func (r *Runner) dispatch() {
	defer r.wg.Done()
	defer close(r.work)
	idle := r.cfg.PollInterval
	group := max(1, r.cfg.GroupCommit)
	backlog := false
	for {
		if r.isStopping() {
			return
		}
		// Without a backlog, claim for the idle workers only, up to a group
		// each. While a backlog exists (the last claim came back full), claim
		// up to ClaimBatch ahead of the workers: claims one group at a time,
		// as workers free up, would cost a claim query per group. The extra
		// claims wait for a worker briefly; their leases run meanwhile, which
		// costs nothing unless steps outlast the lease.
		n := (r.cfg.Workers - int(r.units.Load())) * group
		if backlog {
			n = r.cfg.Workers*group + r.cfg.ClaimBatch - int(r.busy.Load())
		}
		n = min(n, r.cfg.ClaimBatch)
		if n <= 0 {
			select {
			case <-r.stopping:
				return
			case <-r.freed:
				continue
			}
		}
		began := time.Now()
		ctx, cancel := context.WithTimeout(r.hardCtx, r.cfg.LeaseDuration)
		claimed, err := r.journal.ClaimPending(ctx, n, r.cfg.LeaseDuration)
		cancel()
		at := time.Now()
		if err != nil {
			r.throttle.Error("claim", "saga claim failed", "err", err)
			idle = r.waitIdle(idle)
			continue
		}
		r.throttle.Recovered("claim", "saga claims work again")
		got := len(claimed)
		if got > 0 && r.cfg.Hooks.OnClaim != nil {
			r.cfg.Hooks.OnClaim(got, at.Sub(began))
		}
		units := r.split(got, group)
		for _, k := range units {
			g := make([]claim, k)
			for i, inst := range claimed[:k] {
				g[i] = claim{inst: inst, at: at}
			}
			claimed = claimed[k:]
			r.units.Add(1)
			r.busy.Add(int64(k))
			r.work <- g
		}
		backlog = got == n
		switch {
		case got == n:
			// A full batch: more may be due. Claim again as soon as a
			// worker is free.
			idle = r.cfg.PollInterval
		case got > 0:
			// Not before the next instance falls due, which may be well
			// within a poll interval: an instance given back until its
			// rate turn starts on time, not with the next poll's batch.
			idle = r.cfg.PollInterval
			r.waitIdle(r.untilDue(idle))
		default:
			idle = r.waitIdle(r.untilDue(idle))
		}
	}
}

// split divides got claimed instances into the units of work handed to the
// workers: one instance per unit while there is an idle worker for each, so
// that a runner that keeps up keeps the latency of one step per
// transaction; else groups of at most group instances, as few and as even
// as that allows, so that each instance takes its first step in the first
// round of a group commit instead of queueing behind whole instances run one
// per transaction, and the workers left idle take the next starts at once.
func (r *Runner) split(got, group int) []int {
	if got == 0 {
		return nil
	}
	u := got
	if got > max(1, r.cfg.Workers-int(r.units.Load())) {
		u = (got + group - 1) / group
	}
	sizes := make([]int, u)
	for i := range sizes {
		sizes[i] = got / u
		if i < got%u {
			sizes[i]++
		}
	}
	return sizes
}

// untilDue shortens an idle wait to the next instance that falls due, when
// the journal can tell (DueReporter).
func (r *Runner) untilDue(idle time.Duration) time.Duration {
	dr, ok := r.journal.(DueReporter)
	if !ok {
		return idle
	}
	ctx, cancel := context.WithTimeout(r.hardCtx, r.cfg.LeaseDuration)
	d, found, err := dr.NextDue(ctx)
	cancel()
	if err != nil || !found {
		return idle
	}
	return max(time.Millisecond, min(idle, d))
}

// waitIdle waits d (or a wake-up, or Stop) and returns the next idle wait:
// doubled after a full wait, reset by a wake-up.
func (r *Runner) waitIdle(d time.Duration) time.Duration {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-r.stopping:
		return d
	case <-r.wake:
		return r.cfg.PollInterval
	case <-t.C:
		return min(2*d, r.cfg.MaxPollInterval)
	}
}

func (r *Runner) worker() {
	defer r.wg.Done()
	for g := range r.work {
		if len(g) == 1 {
			r.process(g[0])
		} else {
			r.processGroup(g)
		}
		r.busy.Add(-int64(len(g)))
		r.units.Add(-1)
		select {
		case r.freed <- struct{}{}:
		default:
		}
	}
}

// execer is what NotifyRunners needs: a transaction, a connection or a pool.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// NotifyRunners wakes every runner listening on WakeChannel. Called inside a
// transaction, the notification is delivered when it commits, so a runner
// never claims before the instances it is woken for are visible.
func NotifyRunners(ctx context.Context, db execer) error {
	if _, err := db.Exec(ctx, `SELECT pg_notify($1, '')`, WakeChannel); err != nil {
		return fmt.Errorf("saga: notify runners on %s: %w", WakeChannel, err)
	}
	return nil
}
