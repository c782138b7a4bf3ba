package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/compensa/compensa/cdc"
	"github.com/compensa/compensa/correlator"
	"github.com/compensa/compensa/internal/dbconn"
	"github.com/compensa/compensa/internal/failpoint"
	"github.com/compensa/compensa/internal/httpapi"
	"github.com/compensa/compensa/internal/tracing"
	"github.com/compensa/compensa/internal/tracing/sinkspan"
	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/admin"
	"github.com/compensa/compensa/saga/declare"
	"github.com/compensa/compensa/saga/pgjournal"
	"github.com/compensa/compensa/sink"
	"github.com/compensa/compensa/sink/dial"
)

// Relay is an assembled relay: the replication stream (unless NoStream), the
// correlator, the step runner and the monitor, sharing one pool. Build it with
// New, start it with Start (or Run), stop it with Stop. A Relay runs once.
type Relay struct {
	cfg  Config
	pool *pgxpool.Pool
	// declared is the set of declared sagas in force (Config.Sagas),
	// replaced by ReloadSagas under declaredMu.
	declaredMu sync.Mutex
	declared   []*declare.Saga
	declaredRT *declare.Runtime
	// monPool is the monitor's own, small pool (MonitorPoolSize).
	monPool *pgxpool.Pool
	// tracerProvider makes the spans (nil: tracing off); ownTracer is set
	// when the relay built it from the environment and must shut it down.
	tracerProvider trace.TracerProvider
	ownTracer      *tracing.Provider

	journal    saga.Journal
	runner     *saga.Runner
	correlator *correlator.Correlator
	stream     *cdc.Stream
	sinksCfg   *sink.Config
	fanout     *sink.Fanout
	sinks      []sink.Destination
	metrics    *httpapi.Metrics
	monitor    *httpapi.Server
	retention  *pgjournal.Retention

	ln   net.Listener
	http *http.Server
	// probeLn and probeHTTP serve /healthz and /readyz on ProbeAddr.
	probeLn   net.Listener
	probeHTTP *http.Server
	// metricsLn and metricsHTTP serve /metrics on MetricsAddr.
	metricsLn   net.Listener
	metricsHTTP *http.Server

	mu      sync.Mutex
	started bool
	stopped bool
	cancel  context.CancelFunc
	// done is closed when the stream's Run returned (or at Stop when there is
	// no stream); streamErr is what it returned.
	done      chan struct{}
	streamErr error
	wg        sync.WaitGroup
}

// New checks cfg, connects, and checks the database before anything runs:
// wal_level, every privilege the features cfg turns on need (all missing
// ones at once, as a *PrivilegeError), the outbox table and its columns, the
// publication and the slot (see the Err variables). It starts nothing; the
// pool it opened is closed by Stop, or at once when New fails.
func New(ctx context.Context, cfg Config) (*Relay, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	table, err := outbox.ParseTableName(cfg.OutboxTable)
	if err != nil {
		return nil, fmt.Errorf("outbox table: %w", err)
	}
	cols, err := outbox.ParseColumnMap(cfg.OutboxColumns)
	if err != nil {
		return nil, err
	}
	// A bad sinks file is reported before anything connects.
	var sinks *sink.Config
	if cfg.Sinks != "" {
		if sinks, err = sink.LoadFile(cfg.Sinks); err != nil {
			return nil, fmt.Errorf("sinks: %w", err)
		}
		if err = dial.Check(sinks, nil); err != nil {
			return nil, fmt.Errorf("sinks: %w", err)
		}
		sinks.SetDefaultSource(SinkSource(cfg.DatabaseURL, cfg.OutboxTable))
		if cfg.NoStream {
			// Checked the same way, but only the stream delivers to sinks.
			sinks = nil
		}
	}
	if sinks != nil && cfg.Logger != nil {
		for _, w := range sinks.Warnings() {
			cfg.Logger.Warn(w.Msg, "component", "sinks", "sink", w.Sink)
		}
	}
	if cfg.TracerProvider == nil {
		if err := tracing.CheckEnv(); err != nil {
			return nil, fmt.Errorf("tracing: %w", err)
		}
	}
	if err := WaitForPrimary(ctx, cfg.DatabaseURL, cfg.Logger); err != nil {
		return nil, err
	}
	// The workers, the correlator, the stream's checkpoint reads and the
	// monitor each need a connection at once.
	pool, err := dbconn.OpenStepPool(ctx, cfg.DatabaseURL, int32(cfg.Workers+8))
	if err != nil {
		return nil, err
	}
	monPool, err := dbconn.OpenPool(ctx, cfg.DatabaseURL, MonitorPoolSize)
	if err != nil {
		pool.Close()
		return nil, err
	}
	r := &Relay{cfg: cfg, pool: pool, monPool: monPool, done: make(chan struct{}), sinksCfg: sinks}
	if err := r.openTracing(ctx); err != nil {
		r.closePools()
		return nil, err
	}
	cfg = r.cfg
	// Every privilege the features need, all at once, before a statement
	// of theirs could fail on one.
	if err := r.checkPrivileges(ctx, table); err != nil {
		r.closePools()
		return nil, err
	}
	if cfg.Sagas != "" {
		// Before the correlator and the runner exist: they see the declared
		// sagas from their first batch and claim on.
		r.declaredRT = &declare.Runtime{Logger: cfg.Logger.With("component", "declared"), EgressAllow: cfg.HTTPEgressAllow}
		loaded, err := declare.Install(ctx, pool, cfg.Registry, cfg.Sagas, r.declaredRT)
		if err != nil {
			r.closePools()
			return nil, err
		}
		r.declared = loaded
		for _, s := range loaded {
			cfg.Logger.Info("declared saga loaded", "saga", s.Name, "version", s.Version, "file", s.File, "hash", s.Hash[:12])
			if len(cfg.HTTPEgressAllow) == 0 {
				for _, w := range s.Warnings() {
					cfg.Logger.Warn("declared saga: every call of this step will be refused", "saga", s.Name, "warning", w.String())
				}
			}
		}
	}
	if err := r.assemble(ctx, table, cols); err != nil {
		r.closePools()
		return nil, err
	}
	return r, nil
}

func (r *Relay) assemble(ctx context.Context, table outbox.TableName, cols outbox.ColumnMap) error {
	cfg, log := r.cfg, r.cfg.Logger
	var err error
	if r.journal, err = pgjournal.New(r.pool, &pgjournal.Config{OldestFirst: cfg.ClaimOrder == ClaimOldest, TenantWeights: cfg.TenantWeights}); err != nil {
		return err
	}
	if r.metrics, err = httpapi.NewMetrics(cfg.MetricsRegistry); err != nil {
		return err
	}
	r.runner, err = saga.NewRunner(r.journal, r.pool, cfg.Registry, &saga.RunnerConfig{
		Workers: cfg.Workers, LeaseDuration: cfg.LeaseDuration, OutboxTable: table.Quoted(),
		Logger: log.With("component", "runner"), Hooks: r.metrics.RunnerHooks(),
		TracerProvider: r.tracerProvider,
	})
	if err != nil {
		return err
	}
	corrCfg := &correlator.Config{
		Registry: cfg.Registry, Wake: r.runner.Wake, Logger: log.With("component", "correlator"),
		OnStarted: r.metrics.SagasStarted, TracerProvider: r.tracerProvider,
	}
	if r.sinksCfg != nil {
		if err := r.openSinks(ctx); err != nil {
			return err
		}
		corrCfg.InBatchTx = r.fanout.WriteParked
	}
	r.correlator, err = correlator.New(r.pool, corrCfg)
	if err != nil {
		return err
	}
	streamCfg := cdc.Config{
		DatabaseURL: cfg.DatabaseURL, Slot: cfg.Slot, Publication: cfg.Publication,
		Table: table, Columns: cols, MessagePrefix: cfg.MessagePrefix, StatusInterval: cfg.StatusInterval,
		HeartbeatInterval: cfg.HeartbeatInterval, RecreateSlot: cfg.RecreateSlot, Retention: cfg.OutboxRetention,
		StallAfter: cfg.StallAfter,
		OnSlotLost: cfg.OnSlotLost, ResyncMargin: cfg.ResyncMargin,
		LoadCheckpoint: func(ctx context.Context) (pglogrepl.LSN, bool, error) {
			if r.fanout != nil {
				// A new stream session: another replica may have parked.
				if err := r.fanout.Resync(ctx); err != nil {
					return 0, false, err
				}
			}
			return r.correlator.LoadCheckpoint(ctx, cfg.Slot)
		},
		Logger: log.With("component", "cdc"),
	}
	if !cfg.NoStream {
		if err := cdc.Preflight(ctx, r.pool, streamCfg); err != nil {
			return err
		}
		next := failpoint.Wrap(r.correlator)
		if r.fanout != nil {
			// Deliveries first; parked rows commit in the correlator's
			// transaction, with the checkpoint.
			next = r.fanout.Sink(next)
		}
		if r.stream, err = cdc.NewStream(streamCfg, next); err != nil {
			return err
		}
	}

	for _, c := range r.correlator.Collectors() {
		if err := r.metrics.Registry().Register(c); err != nil {
			return err
		}
	}
	sources := httpapi.Sources{Outcomes: func() httpapi.EventOutcomes {
		st := r.correlator.Stats()
		return httpapi.EventOutcomes{Started: st.OutcomeStarted, Reply: st.OutcomeReply, Ignored: st.OutcomeIgnored,
			Filtered: st.OutcomeFiltered, Parked: st.OutcomeParked}
	}}
	// The monitor reads through its own pool; retry and cancel go through
	// the journal, fenced like the runner's writes.
	tokens, err := cfg.loadTokens()
	if err != nil {
		return err
	}
	// Operators see every definition some relay can run: this one's, and
	// the declared bodies stored by any relay (with or without --sagas here).
	adm, err := admin.New(admin.Config{Pool: r.monPool, Journal: r.journal,
		Registry: declare.NewCatalog(cfg.Registry, r.monPool), StuckAfter: cfg.StuckAfter, HoldAfter: cfg.HoldAfter})
	if err != nil {
		return err
	}
	if r.retention, err = r.newRetention(adm); err != nil {
		return err
	}
	monCfg := httpapi.Config{
		Pool: r.monPool, Journal: r.journal, Registry: cfg.Registry, StuckAfter: cfg.StuckAfter, Admin: adm,
		Definitions: r.definitions,
		APIToken:    cfg.APIToken, Tokens: tokens, Insecure: cfg.HTTPInsecure && !httpapi.IsLoopback(cfg.HTTPAddr),
		Metrics: r.metrics, Logger: log.With("component", "http"),
		// A retry or cancel through the API wakes the runners, as the
		// correlator does after a start.
		Wake:         r.runner.Wake,
		AllowedHosts: cfg.AllowedHosts, SessionTTL: cfg.SessionTTL, SecureCookies: cfg.SecureCookies,
		MetricsElsewhere: cfg.MetricsAddr != "",
	}
	if r.sinks != nil {
		monCfg.ReplaySink = func(ctx context.Context, name string, req sink.ReplayRequest) (sink.ReplayResult, error) {
			for _, d := range r.sinks {
				if d.Spec.Name == name {
					req.Table, req.Columns = table, cols
					return sink.Replay(ctx, r.pool, d, req)
				}
			}
			return sink.ReplayResult{Sink: name}, sink.ErrUnknownSink
		}
	}
	if cfg.OutboxColumns == "" {
		monCfg.OutboxTable = cfg.OutboxTable // POST /v1/events writes the default columns only
	}
	if r.stream != nil {
		sources.Lag = func() (int64, float64) {
			l := r.stream.Lag()
			return int64(l.Bytes), l.Seconds
		}
		monCfg.Replication = replicationFunc(r.monPool, cfg.Slot, table, cols["created_at"])
		sources.Stream = func() (bool, uint64) {
			h := r.stream.Health()
			return h.Stalled, h.BatchFailures
		}
		monCfg.Health = r.health
		sources.Resyncs = r.stream.Resyncs
	}
	r.metrics.SetSources(sources)
	r.monitor, err = httpapi.New(monCfg)
	return err
}

// Start starts every part and returns once they run: the monitor listens on
// HTTPAddr (see Addr), the runner's workers claim due instances, and the
// stream connects. ctx bounds only the start; the parts run until Stop. A
// fatal stream error later (a lost slot) closes Done.
func (r *Relay) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.started {
		return saga.Errorf(saga.ErrInvalid, "relay: Start called twice; build a new Relay with New")
	}
	r.started = true
	if !r.cfg.handlerOnly() {
		ln, err := httpapi.Listen(r.cfg.HTTPAddr, r.cfg.HTTPServer)
		if err != nil {
			r.failStart()
			return fmt.Errorf("monitor address %s: %w (is another relay running? pick another address)", r.cfg.HTTPAddr, err)
		}
		r.ln = ln
		r.http = httpapi.NewHTTPServer(r.monitor, r.cfg.HTTPServer)
	}
	if r.cfg.ProbeAddr != "" {
		// Short bounds: a probe is one small GET.
		pcfg := httpapi.ServerConfig{ReadHeaderTimeout: 2 * time.Second, ReadTimeout: 2 * time.Second,
			WriteTimeout: 5 * time.Second, IdleTimeout: 10 * time.Second, MaxConns: 32}
		ln, err := httpapi.Listen(r.cfg.ProbeAddr, pcfg)
		if err != nil {
			if r.ln != nil {
				r.ln.Close()
			}
			r.failStart()
			return fmt.Errorf("probe address %s: %w (pick another address)", r.cfg.ProbeAddr, err)
		}
		r.probeLn = ln
		r.probeHTTP = httpapi.NewHTTPServer(r.monitor.ProbeHandler(), pcfg)
	}
	if r.cfg.MetricsAddr != "" {
		mcfg := httpapi.ServerConfig{ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 5 * time.Second,
			WriteTimeout: 30 * time.Second, IdleTimeout: 60 * time.Second, MaxConns: 16}
		ln, err := httpapi.Listen(r.cfg.MetricsAddr, mcfg)
		if err != nil {
			for _, l := range []net.Listener{r.ln, r.probeLn} {
				if l != nil {
					l.Close()
				}
			}
			r.failStart()
			return fmt.Errorf("metrics address %s: %w (pick another address)", r.cfg.MetricsAddr, err)
		}
		r.metricsLn = ln
		r.metricsHTTP = httpapi.NewHTTPServer(r.monitor.MetricsHandler(), mcfg)
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	r.cancel = cancel
	if err := r.runner.Start(runCtx); err != nil {
		cancel()
		if r.ln != nil {
			r.ln.Close()
		}
		if r.probeLn != nil {
			r.probeLn.Close()
		}
		if r.metricsLn != nil {
			r.metricsLn.Close()
		}
		r.failStart()
		return err
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		r.monitor.Run(runCtx)
	}()
	if r.http != nil {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			if err := r.http.Serve(r.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				r.cfg.Logger.Error("http monitor stopped", "err", err)
			}
		}()
	}
	if r.probeHTTP != nil {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			if err := r.probeHTTP.Serve(r.probeLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
				r.cfg.Logger.Error("probe listener stopped", "err", err)
			}
		}()
	}
	if r.metricsHTTP != nil {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			if err := r.metricsHTTP.Serve(r.metricsLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
				r.cfg.Logger.Error("metrics listener stopped", "err", err)
			}
		}()
	}
	if r.fanout != nil {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			r.fanout.Run(runCtx)
		}()
	}
	r.wg.Add(1)
	go r.runRetention(runCtx)
	if r.stream != nil {
		go func() {
			r.streamErr = r.stream.Run(runCtx)
			close(r.done)
		}()
	}
	r.cfg.Logger.Info("relay started", "slot", r.cfg.Slot, "stream", !r.cfg.NoStream,
		"workers", r.cfg.Workers, "http", r.Addr())
	r.logSagas()
	return nil
}

// failStart releases what New acquired after a failed Start; Stop is then a
// no-op.
func (r *Relay) failStart() {
	r.stopped = true
	close(r.done)
	r.closePools()
}

func (r *Relay) closePools() {
	r.closeTracingSoon()
	dial.Close(r.sinks)
	r.sinks = nil
	r.monPool.Close()
	r.pool.Close()
}

// Run starts the relay and blocks until ctx is cancelled or the stream stops
// on a fatal error, then stops it within stopTimeout. It returns the stream's
// error, if any, joined with what Stop reported.
func (r *Relay) Run(ctx context.Context, stopTimeout time.Duration) error {
	if err := r.Start(ctx); err != nil {
		return err
	}
	var streamErr error
	select {
	case <-ctx.Done():
	case <-r.Done():
		streamErr = r.Err()
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stopTimeout)
	defer cancel()
	stopErr := r.Stop(sctx)
	if streamErr != nil {
		return streamErr // Stop reports the same error again: say it once
	}
	return stopErr
}

// Done is closed when the stream stops on its own (a fatal error such as a
// lost slot: see Err) or after Stop. With NoStream it closes only at Stop.
func (r *Relay) Done() <-chan struct{} { return r.done }

// Err is why the stream stopped, once Done is closed; nil after a clean Stop.
func (r *Relay) Err() error {
	select {
	case <-r.done:
		if errors.Is(r.streamErr, context.Canceled) {
			return nil
		}
		return r.streamErr
	default:
		return nil
	}
}

// Addr is the monitor's listening address (host:port), or "" when the
// application mounts Handler itself.
func (r *Relay) Addr() string {
	if r.ln == nil {
		return ""
	}
	return r.ln.Addr().String()
}

// ProbeAddr is the probe listener's address (host:port), or "" without
// Config.ProbeAddr.
func (r *Relay) ProbeAddr() string {
	if r.probeLn == nil {
		return ""
	}
	return r.probeLn.Addr().String()
}

// MetricsAddr is the metrics listener's address (host:port), or "" without
// Config.MetricsAddr.
func (r *Relay) MetricsAddr() string {
	if r.metricsLn == nil {
		return ""
	}
	return r.metricsLn.Addr().String()
}

// ServeHTTP serves the monitor: the web page, /v1, /metrics, /healthz and
// /readyz. Mount it when Config.HTTPAddr is empty (it works either way).
func (r *Relay) ServeHTTP(w http.ResponseWriter, req *http.Request) { r.monitor.ServeHTTP(w, req) }

// Handler is r as an http.Handler, for symmetry with http.Server.
func (r *Relay) Handler() http.Handler { return r }

// Runner is the step runner, for Wake after an application writes work the
// runner should pick up at once.
func (r *Relay) Runner() *saga.Runner { return r.runner }

// Stop stops the stream (nothing more is acknowledged), then the runner
// (in-flight steps finish within ctx or are abandoned uncommitted: their
// lease expires and another worker takes them over), then the monitor, and
// closes the pool. It is safe to call more than once and without Start.
func (r *Relay) Stop(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped {
		return nil
	}
	r.stopped = true
	if !r.started {
		close(r.done)
		r.closePools()
		return nil
	}
	r.cancel()
	var errs []error
	if r.stream != nil {
		select {
		case <-r.done:
			if err := r.streamErr; err != nil && !errors.Is(err, context.Canceled) {
				errs = append(errs, err)
			}
		case <-ctx.Done():
			errs = append(errs, fmt.Errorf("stream did not stop in time"))
		}
	} else {
		close(r.done)
	}
	if err := r.runner.Stop(ctx); err != nil {
		errs = append(errs, fmt.Errorf("runner stop: %w", err))
	}
	if r.http != nil {
		r.http.Shutdown(ctx)
	}
	if r.probeHTTP != nil {
		r.probeHTTP.Shutdown(ctx)
	}
	if r.metricsHTTP != nil {
		r.metricsHTTP.Shutdown(ctx)
	}
	r.wg.Wait()
	r.closeTracing(ctx)
	r.closePools()
	return errors.Join(errs...)
}

// openSinks loads the sinks file, connects every sink and builds the
// fan-out in front of the correlator.
func (r *Relay) openSinks(ctx context.Context) error {
	var err error
	if r.sinks, err = dial.Open(r.sinksCfg, nil); err != nil {
		return fmt.Errorf("sinks: %w", err)
	}
	tr := tracing.Tracer(r.tracerProvider)
	for i := range r.sinks {
		r.sinks[i].Sink = sinkspan.Wrap(r.sinks[i], tr)
	}
	r.fanout, err = sink.NewFanout(ctx, sink.FanoutConfig{Pool: r.pool, Destinations: r.sinks,
		Registerer: r.metrics.Registry(), Logger: r.cfg.Logger.With("component", "sinks")})
	return err
}

// SinkSource is the CloudEvents source of a sink whose file sets none:
// sink.DefaultSource of the database the DSN names and the outbox table
// (schema public when the name has none). It connects nothing; a DSN that
// does not parse names the database "postgres".
func SinkSource(databaseURL, outboxTable string) string {
	var database string
	if pc, err := pgconn.ParseConfig(databaseURL); err == nil {
		database = pc.Database
	}
	t, err := outbox.ParseTableName(cmp.Or(outboxTable, DefaultOutboxTable))
	if err != nil {
		t = outbox.TableName{Name: outboxTable}
	}
	return sink.DefaultSource(database, t.Schema, t.Name)
}

// health is why the stream cannot keep up, and which sinks can neither
// deliver nor park (for /readyz).
func (r *Relay) health() []string {
	reasons := r.stream.Health().Reasons
	if r.fanout != nil {
		reasons = append(reasons, r.fanout.Failing()...)
	}
	return reasons
}

// replicationFunc reports the slot for /v1/replication and /readyz.
func replicationFunc(pool *pgxpool.Pool, slot string, table outbox.TableName, createdAt string) httpapi.ReplicationFunc {
	return func(ctx context.Context) (httpapi.ReplicationStatus, error) {
		r, err := cdc.QueryLagOf(ctx, pool, slot, table, createdAt)
		if errors.Is(err, cdc.ErrSlotNotFound) {
			return httpapi.ReplicationStatus{Slot: slot}, nil
		}
		if err != nil {
			return httpapi.ReplicationStatus{}, err
		}
		return httpapi.ReplicationStatus{
			Slot: r.Slot, Exists: true, Active: r.Active, WALStatus: r.WALStatus, LagBytes: r.LagBytes,
			LagSeconds: r.LagSeconds, ConfirmedFlushLSN: r.ConfirmedFlushLSN, CurrentLSN: r.CurrentLSN,
			Failover: r.Failover, SynchronizedStandbySlots: r.SynchronizedStandbySlots, FailoverReady: r.FailoverReady,
		}, nil
	}
}

// ReloadSagas re-reads Config.Sagas (relay run does on SIGHUP): a fully
// valid set replaces the declared sagas at once (new triggers start the new
// set from the next batch; running instances keep their versions); on any
// problem nothing changes and the error lists every problem
// (declare.Problems). It returns the set now in force.
func (r *Relay) ReloadSagas(ctx context.Context) ([]*declare.Saga, error) {
	if r.cfg.Sagas == "" {
		return nil, fmt.Errorf("no saga directory to reload: Config.Sagas is empty")
	}
	r.declaredMu.Lock()
	defer r.declaredMu.Unlock()
	next, err := declare.Reload(ctx, r.pool, r.cfg.Registry, r.cfg.Sagas, r.declaredRT, r.declared)
	if err != nil {
		return r.declared, err
	}
	r.declared = next
	return next, nil
}

// definitions describes every registered definition for GET /v1/definitions:
// declared ones with their file, hash and step kinds, the others as Go.
func (r *Relay) definitions() []httpapi.Definition {
	r.declaredMu.Lock()
	byKey := map[saga.Key]*declare.Saga{}
	for _, s := range r.declared {
		byKey[saga.Key{Name: s.Name, Version: s.Version}] = s
	}
	r.declaredMu.Unlock()
	out := httpapi.RegistryDefinitions(r.cfg.Registry)
	for i, d := range out {
		s, ok := byKey[saga.Key{Name: d.Name, Version: d.Version}]
		if !ok {
			continue
		}
		out[i].Source, out[i].Hash = s.File, s.Hash
		for j, st := range s.Steps {
			if j >= len(out[i].Steps) {
				break
			}
			out[i].Steps[j].Kind = st.Kind()
			out[i].Steps[j].Compensate = ""
			if st.Compensate != nil {
				out[i].Steps[j].Compensate = st.Compensate.Kind()
			}
		}
	}
	return out
}

// logSagas says at start which sagas this relay runs and which events start
// them: an event that starts none is ignored by design (most outbox events
// are not triggers), and this line is where an operator checks why.
func (r *Relay) logSagas() {
	defs := r.cfg.Registry.Definitions()
	if len(defs) == 0 {
		r.cfg.Logger.Warn("no sagas registered: every streamed event is ignored (compensa_events_total{outcome=\"ignored\"}) except replies to waiting steps")
		return
	}
	for _, d := range defs {
		var triggers []string
		for _, t := range d.Triggers {
			s := t.EventType
			if t.AggregateType != "" {
				s += " (aggregate " + t.AggregateType + ")"
			}
			if t.TenantID != uuid.Nil {
				s += " (tenant " + t.TenantID.String() + ")"
			}
			triggers = append(triggers, s)
		}
		r.cfg.Logger.Info("saga registered", "saga", d.Key().String(), "steps", len(d.Steps),
			"triggers", strings.Join(triggers, ", "))
	}
}
