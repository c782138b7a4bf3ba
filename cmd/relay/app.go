package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/compensa/compensa/cdc"
	"github.com/compensa/compensa/correlator"
	"github.com/compensa/compensa/internal/briefs"
	"github.com/compensa/compensa/internal/httpapi"
	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/declare"
	"github.com/compensa/compensa/saga/pgjournal"
)

// appConfig is everything `relay run` and `relay demo` assemble a relay from.
type appConfig struct {
	DatabaseURL string
	Slot        string
	Publication string
	HTTPAddr    string
	OutboxTable string
	// OutboxColumns is the raw --outbox-columns map.
	OutboxColumns     string
	NoStream          bool
	StatusInterval    time.Duration
	HeartbeatInterval time.Duration
	RecreateSlot      bool
	Retention         time.Duration
	Workers           int
	LeaseDuration     time.Duration
	StuckAfter        time.Duration
	APIToken          string
	// SagasDir holds declared saga definitions (*.yaml), loaded and
	// pinned before anything starts; empty runs only the built-in sagas.
	SagasDir string
	Logger   *slog.Logger
}

// app is a running relay: the stream (unless NoStream), the correlator, the
// step runner and the HTTP monitor, sharing one pool.
type app struct {
	cfg        appConfig
	pool       *pgxpool.Pool
	registry   *saga.Registry
	journal    saga.Journal
	runner     *saga.Runner
	correlator *correlator.Correlator
	stream     *cdc.Stream
	metrics    *httpapi.Metrics
	monitor    *httpapi.Server
	http       *http.Server
	httpAddr   string
	// declared is the set of declared sagas in force (--sagas), replaced
	// by a reload.
	declared []*declare.Saga
	rt       *declare.Runtime

	cancel context.CancelFunc
	// streamDone is closed when the stream's Run returned; streamErr is
	// what it returned. Both stay readable, so that Stop and the caller can
	// each look.
	streamDone chan struct{}
	streamErr  error
	wg         sync.WaitGroup
}

// defaultRegistry is the set of saga definitions this binary runs.
func defaultRegistry() *saga.Registry {
	reg := saga.NewRegistry()
	if err := briefs.Register(reg); err != nil {
		panic(err) // a definition shipped in this binary is invalid: a programming error
	}
	return reg
}

// startApp assembles and starts a relay. It returns once every part runs; a
// configuration or preflight error (wal_level, privileges, missing columns)
// comes back before anything starts.
func startApp(ctx context.Context, cfg appConfig) (*app, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	table, err := outbox.ParseTableName(cfg.OutboxTable)
	if err != nil {
		return nil, fmt.Errorf("--outbox-table: %w", err)
	}
	cols, err := outbox.ParseColumnMap(cfg.OutboxColumns)
	if err != nil {
		return nil, err
	}
	a := &app{cfg: cfg, registry: defaultRegistry()}
	workers := max(cfg.Workers, 1)
	pool, err := openPoolURL(ctx, cfg.DatabaseURL, int32(workers+8))
	if err != nil {
		return nil, err
	}
	a.pool = pool
	fail := func(err error) (*app, error) {
		pool.Close()
		return nil, err
	}
	if cfg.SagasDir != "" {
		a.rt = &declare.Runtime{Logger: log.With("component", "declared")}
		loaded, err := declare.Install(ctx, pool, a.registry, cfg.SagasDir, a.rt)
		if err != nil {
			return fail(err)
		}
		a.declared = loaded
		for _, s := range loaded {
			log.Info("declared saga loaded", "saga", s.Name, "version", s.Version, "file", s.File, "hash", s.Hash[:12])
		}
	}
	a.journal, err = pgjournal.New(pool, nil)
	if err != nil {
		return fail(err)
	}
	if a.metrics, err = httpapi.NewMetrics(nil); err != nil {
		return fail(err)
	}
	a.runner, err = saga.NewRunner(a.journal, pool, a.registry, &saga.RunnerConfig{
		Workers: cfg.Workers, LeaseDuration: cfg.LeaseDuration, OutboxTable: table.Quoted(),
		Logger: log.With("component", "runner"), Hooks: a.metrics.RunnerHooks(),
	})
	if err != nil {
		return fail(err)
	}
	a.correlator, err = correlator.New(pool, &correlator.Config{
		Registry: a.registry, Wake: a.runner.Wake, Logger: log.With("component", "correlator"),
		OnStarted: a.metrics.SagasStarted,
	})
	if err != nil {
		return fail(err)
	}
	streamCfg := cdc.Config{
		DatabaseURL: cfg.DatabaseURL, Slot: cfg.Slot, Publication: cfg.Publication,
		Table: table, Columns: cols, StatusInterval: cfg.StatusInterval,
		HeartbeatInterval: cfg.HeartbeatInterval, RecreateSlot: cfg.RecreateSlot, Retention: cfg.Retention,
		LoadCheckpoint: func(ctx context.Context) (pglogrepl.LSN, bool, error) {
			return a.correlator.LoadCheckpoint(ctx, cfg.Slot)
		},
		Logger: log.With("component", "cdc"),
	}
	if !cfg.NoStream {
		if err := cdc.Preflight(ctx, pool, streamCfg); err != nil {
			return fail(err)
		}
		a.stream, err = cdc.NewStream(streamCfg, withFailpoint(a.correlator))
		if err != nil {
			return fail(err)
		}
	}

	sources := httpapi.Sources{
		Correlator: func() httpapi.CorrelatorStats { return httpapi.CorrelatorStats(a.correlator.Stats()) },
	}
	monCfg := httpapi.Config{
		Pool: pool, Journal: a.journal, Registry: a.registry, StuckAfter: cfg.StuckAfter,
		APIToken: cfg.APIToken, Metrics: a.metrics, Logger: log.With("component", "http"),
	}
	if a.stream != nil {
		sources.Lag = func() (int64, float64) {
			l := a.stream.Lag()
			return int64(l.Bytes), l.Seconds
		}
		monCfg.Replication = replicationFunc(pool, cfg.Slot)
	}
	a.metrics.SetSources(sources)
	if a.monitor, err = httpapi.New(monCfg); err != nil {
		return fail(err)
	}

	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fail(fmt.Errorf("--http-addr %s: %w (is another relay running? pick another address)", cfg.HTTPAddr, err))
	}
	a.httpAddr = ln.Addr().String()
	a.http = &http.Server{Handler: a.monitor, ReadHeaderTimeout: 10 * time.Second}

	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	a.cancel = cancel
	if err := a.runner.Start(runCtx); err != nil {
		cancel()
		ln.Close()
		return fail(err)
	}
	a.wg.Add(2)
	go func() {
		defer a.wg.Done()
		a.monitor.Run(runCtx)
	}()
	go func() {
		defer a.wg.Done()
		if err := a.http.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http monitor stopped", "err", err)
		}
	}()
	a.streamDone = make(chan struct{})
	if a.stream != nil {
		go func() {
			a.streamErr = a.stream.Run(runCtx)
			close(a.streamDone)
		}()
	}
	log.Info("relay started", "slot", cfg.Slot, "stream", !cfg.NoStream, "workers", workers, "http", a.httpAddr)
	return a, nil
}

// Done is closed when the stream stops on its own (a fatal error such as a
// lost slot) or after Stop; StreamErr then says why. It never closes on its
// own with --no-stream.
func (a *app) Done() <-chan struct{} { return a.streamDone }

// StreamErr is the stream's result, once Done is closed.
func (a *app) StreamErr() error { return a.streamErr }

// Stop stops the stream, then the runner (graceful within ctx: in-flight steps
// finish or are abandoned uncommitted), then the monitor, and closes the pool.
func (a *app) Stop(ctx context.Context) error {
	a.cancel()
	var errs []error
	if a.stream != nil {
		select {
		case <-a.streamDone:
			if err := a.streamErr; err != nil && !errors.Is(err, context.Canceled) {
				errs = append(errs, err)
			}
		case <-ctx.Done():
			errs = append(errs, fmt.Errorf("stream did not stop in time"))
		}
	}
	if err := a.runner.Stop(ctx); err != nil {
		errs = append(errs, fmt.Errorf("runner stop: %w", err))
	}
	a.http.Shutdown(ctx)
	a.wg.Wait()
	a.pool.Close()
	return errors.Join(errs...)
}

func openPoolURL(ctx context.Context, url string, maxConns int32) (*pgxpool.Pool, error) {
	return openPool(ctx, &rootOptions{DatabaseURL: url}, maxConns)
}

// replicationFunc reports the slot for /v1/replication and /readyz.
func replicationFunc(pool *pgxpool.Pool, slot string) httpapi.ReplicationFunc {
	return func(ctx context.Context) (httpapi.ReplicationStatus, error) {
		r, err := cdc.QueryLag(ctx, pool, slot)
		if errors.Is(err, cdc.ErrSlotNotFound) {
			return httpapi.ReplicationStatus{Slot: slot}, nil
		}
		if err != nil {
			return httpapi.ReplicationStatus{}, err
		}
		return httpapi.ReplicationStatus{
			Slot: r.Slot, Exists: true, Active: r.Active, WALStatus: r.WALStatus, LagBytes: r.LagBytes,
			LagSeconds: r.LagSeconds, ConfirmedFlushLSN: r.ConfirmedFlushLSN, CurrentLSN: r.CurrentLSN,
		}, nil
	}
}

// reloadSagas re-reads --sagas (SIGHUP): a fully valid set replaces the old
// one at once; otherwise every problem is logged, one per line, and the old
// set keeps running.
func (a *app) reloadSagas(ctx context.Context) {
	log := a.cfg.Logger
	if a.cfg.SagasDir == "" {
		log.Info("SIGHUP: no --sagas directory to reload")
		return
	}
	next, err := declare.Reload(ctx, a.pool, a.registry, a.cfg.SagasDir, a.rt, a.declared)
	if err != nil {
		var ps declare.Problems
		if errors.As(err, &ps) {
			for _, p := range ps {
				log.Error("saga reload refused: "+p.String(), "file", p.File)
			}
		} else {
			log.Error("saga reload refused", "err", err)
		}
		log.Warn("saga reload refused: the previous set keeps running", "sagas", len(a.declared))
		return
	}
	a.declared = next
	for _, s := range next {
		log.Info("declared saga loaded", "saga", s.Name, "version", s.Version, "file", s.File, "hash", s.Hash[:12])
	}
	log.Info("saga reload done", "sagas", len(next))
}
