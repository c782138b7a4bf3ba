package httpapi

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/compensa/compensa/internal/logthrottle"
	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/admin"
)

const namespace = "compensa"

// Sources are the in-process numbers the metrics read at scrape time. Every
// field is optional: a missing source reports 0 (a replica started with
// --no-stream has no stream and no correlator).
type Sources struct {
	// Lag returns the stream's lag: bytes the slot's confirmed flush is
	// behind the server's WAL, and the age in seconds of the newest commit
	// or heartbeat processed.
	Lag func() (bytes int64, seconds float64)
	// Stream returns whether the stream is stalled (see cdc.Health) and
	// how many batches the sink failed on since the start.
	Stream func() (stalled bool, batchFailures uint64)
	// Resyncs returns how many lost slots the stream replaced with a resync
	// from the outbox table.
	Resyncs func() uint64
	// Outcomes returns what became of the events this process's correlator
	// streamed (compensa_events_total{outcome}), for the page.
	Outcomes func() EventOutcomes
}

// EventOutcomes counts streamed events by what became of them since the
// relay started: started a saga, went to reply correlation, ignored (no
// saga listens), filtered (a trigger's filter said no), parked (a dead
// letter).
type EventOutcomes struct {
	Started, Reply, Ignored, Filtered, Parked uint64
}

// outcomes reads Sources.Outcomes; ok is false when none is plugged in.
func (m *Metrics) outcomes() (EventOutcomes, bool) {
	m.mu.RLock()
	f := m.sources.Outcomes
	m.mu.RUnlock()
	if f == nil {
		return EventOutcomes{}, false
	}
	return f(), true
}

// Metrics holds the relay's Prometheus metric families. Stream and
// correlator numbers are read from Sources at scrape time; runner outcomes
// are pushed with the Observe methods (see StepObservation); stuck
// instances and parked events are counted by a query at scrape time.
type Metrics struct {
	reg *prometheus.Registry

	mu      sync.RWMutex
	sources Sources
	admin   *admin.Admin
	logger  *slog.Logger
	// throttle keeps a failing count (the database is down) to one log
	// line per interval.
	throttle *logthrottle.Throttle
	// replication reads the slot for its gauges (nil: no slot gauges).
	replication ReplicationFunc

	sagasStarted  *prometheus.CounterVec
	sagasEnded    *prometheus.CounterVec
	stepDuration  *prometheus.HistogramVec
	stepRetries   *prometheus.CounterVec
	manualActions *prometheus.CounterVec
	queryFailures prometheus.Counter

	// gauges are the counts that need a query, refreshed in the background
	// (see refreshGauges) and served from memory: a scrape never queries.
	gauges gaugeCache
}

// gaugeCache is the last result of the counting queries.
type gaugeCache struct {
	mu       sync.Mutex
	interval time.Duration
	at       time.Time
	stuck    []admin.StuckCount
	parked   int64
	stuckOK  bool
	parkedOK bool
	// slot is the replication slot's state (slotOK: read, and a source is
	// configured).
	slot       ReplicationStatus
	slotOK     bool
	refreshing chan struct{}
}

// Phases of a step attempt, for the step metrics.
const (
	PhaseDo         = "do"
	PhaseCompensate = "compensate"
)

// NewMetrics registers the relay's metric families on reg; a nil reg means
// a fresh registry with the Go runtime and process collectors. It fails
// when a family is already registered on reg.
func NewMetrics(reg *prometheus.Registry) (*Metrics, error) {
	if reg == nil {
		reg = prometheus.NewRegistry()
		if err := reg.Register(collectors.NewGoCollector()); err != nil {
			return nil, err
		}
		if err := reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
			return nil, err
		}
	}
	m := &Metrics{
		gauges: gaugeCache{interval: DefaultGaugeInterval},
		reg:    reg,
		logger: slog.New(slog.DiscardHandler), throttle: logthrottle.New(nil, 0),
		sagasStarted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "sagas_started_total",
			Help: "Saga instances started, by saga (fed by SagasStarted).",
		}, []string{"saga"}),
		sagasEnded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "sagas_ended_total",
			Help: "Saga instances that reached a terminal status, by saga and status (completed, compensated, failed, timed_out).",
		}, []string{"saga", "status"}),
		stepDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "step_duration_seconds",
			Help: "Duration of one attempt of a step (phase do) or of its compensation (phase compensate), by outcome.",
			// From a local write to a slow remote call with its timeout.
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120},
		}, []string{"saga", "step", "phase", "outcome"}),
		stepRetries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "step_retries_total",
			Help: "Failed attempts of a step or compensation that were scheduled for another try.",
		}, []string{"saga", "step", "phase"}),
		manualActions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "manual_actions_total",
			Help: "Operator retries and cancels through the API, by action and result (requested, already_requested, refused).",
		}, []string{"action", "result"}),
		queryFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "monitor_query_failures_total",
			Help: "Background counting queries (stuck instances, parked events) that failed; their gauges are missing until a count succeeds.",
		}),
	}
	lag := func(pick func(int64, float64) float64) func() float64 {
		return func() float64 {
			m.mu.RLock()
			src := m.sources.Lag
			m.mu.RUnlock()
			if src == nil {
				return 0
			}
			return pick(src())
		}
	}
	stream := func(pick func(bool, uint64) float64) func() float64 {
		return func() float64 {
			m.mu.RLock()
			src := m.sources.Stream
			m.mu.RUnlock()
			if src == nil {
				return 0
			}
			return pick(src())
		}
	}
	counterFunc := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help}, f)
	}
	gaugeFunc := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: namespace, Name: name, Help: help}, f)
	}
	cs := []prometheus.Collector{
		m.sagasStarted, m.sagasEnded, m.stepDuration, m.stepRetries, m.manualActions, m.queryFailures,
		gaugeFunc("stream_stalled", "1 while the stream does not move past committed work (stalled for --stall-after, or the same batch failed repeatedly), else 0; /readyz gives the reason.",
			stream(func(stalled bool, _ uint64) float64 {
				if stalled {
					return 1
				}
				return 0
			})),
		counterFunc("stream_batch_failures_total", "Batches the sink (deliveries, correlator, checkpoint) failed on; each is replayed.",
			stream(func(_ bool, n uint64) float64 { return float64(n) })),
		counterFunc("slot_resyncs_total", "Lost replication slots replaced by a new one after re-reading the outbox rows since the last checkpoint minus the margin (--on-slot-lost=resync).",
			func() float64 {
				m.mu.RLock()
				src := m.sources.Resyncs
				m.mu.RUnlock()
				if src == nil {
					return 0
				}
				return float64(src())
			}),
		gaugeFunc("replication_lag_bytes", "Bytes of WAL between the server's current position and the slot's confirmed flush position.",
			lag(func(b int64, _ float64) float64 { return float64(b) })),
		gaugeFunc("replication_lag_seconds", "Age of the oldest committed change this relay has received and not yet handled; 0 when caught up.",
			lag(func(_ int64, s float64) float64 { return s })),
		&scrapeCollector{m: m},
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// SetSources plugs in the stream and correlator numbers; it may be called
// at any time (before the stream starts, the metrics read 0).
func (m *Metrics) SetSources(s Sources) {
	m.mu.Lock()
	m.sources = s
	m.mu.Unlock()
}

// setAdmin is how the Server gives the scrape-time queries their database.
func (m *Metrics) setAdmin(a *admin.Admin, logger *slog.Logger) {
	m.mu.Lock()
	m.admin, m.logger = a, logger
	m.throttle = logthrottle.New(logger, 0)
	m.mu.Unlock()
}

// Registry returns the registry the families are on.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// SagasStarted counts n instances of a saga started.
func (m *Metrics) SagasStarted(sagaName string, n int) {
	m.sagasStarted.WithLabelValues(sagaName).Add(float64(n))
}

// SagaEnded counts an instance reaching a terminal status ("COMPLETED",
// "COMPENSATED", "FAILED", "TIMED_OUT"; any case).
func (m *Metrics) SagaEnded(sagaName, status string) {
	m.sagasEnded.WithLabelValues(sagaName, lower(status)).Inc()
}

// StepObservation is one attempt of a step or of its compensation.
type StepObservation struct {
	Saga     string
	Step     string
	Phase    string // PhaseDo or PhaseCompensate
	Outcome  string // e.g. completed, retry, failed, awaiting, skipped, lease_lost
	Duration time.Duration
}

// ObserveStep records an attempt's duration; an attempt whose outcome is
// "retry" or "held" also counts as a retry.
func (m *Metrics) ObserveStep(o StepObservation) {
	m.stepDuration.WithLabelValues(o.Saga, o.Step, o.Phase, o.Outcome).Observe(o.Duration.Seconds())
	if o.Outcome == string(saga.OutcomeRetry) || o.Outcome == string(saga.OutcomeHeld) {
		m.stepRetries.WithLabelValues(o.Saga, o.Step, o.Phase).Inc()
	}
}

func (m *Metrics) manual(action, result string) {
	m.manualActions.WithLabelValues(action, result).Inc()
}

// manualN counts n instances of a bulk action.
func (m *Metrics) manualN(action, result string, n int64) {
	if n > 0 {
		m.manualActions.WithLabelValues(action, result).Add(float64(n))
	}
}

// setReplication gives the slot gauges their source.
func (m *Metrics) setReplication(f ReplicationFunc) {
	m.mu.Lock()
	m.replication = f
	m.mu.Unlock()
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// Handler serves the registry in the Prometheus exposition format, at most
// 4 scrapes at a time. A failed background query leaves its gauges out of
// the scrapes until it succeeds and counts in
// compensa_monitor_query_failures_total.
func (m *Metrics) Handler() http.Handler { return m.handler(4) }

func (m *Metrics) handler(maxInFlight int) http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{
		ErrorHandling:       promhttp.ContinueOnError,
		Registry:            m.reg,
		MaxRequestsInFlight: maxInFlight,
	})
}

// DefaultGaugeInterval is how often the gauges that need a query (stuck
// instances, parked events) are recounted.
const DefaultGaugeInterval = 15 * time.Second

// SetGaugeInterval changes how often the counted gauges are refreshed
// (before the server runs; d <= 0 keeps the default).
func (m *Metrics) SetGaugeInterval(d time.Duration) {
	if d > 0 {
		m.gauges.mu.Lock()
		m.gauges.interval = d
		m.gauges.mu.Unlock()
	}
}

func (m *Metrics) gaugeInterval() time.Duration {
	m.gauges.mu.Lock()
	defer m.gauges.mu.Unlock()
	return m.gauges.interval
}

// scrapeQueryTimeout bounds the counting queries: a slow database must
// not pile them up.
const scrapeQueryTimeout = 3 * time.Second

// refreshGauges runs the counting queries once and keeps the result; a
// refresh already running is waited for instead of repeated.
func (m *Metrics) refreshGauges(ctx context.Context) {
	m.mu.RLock()
	a, logger, repl := m.admin, m.throttle, m.replication
	m.mu.RUnlock()
	if a == nil {
		return
	}
	g := &m.gauges
	g.mu.Lock()
	if wait := g.refreshing; wait != nil {
		g.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
		}
		return
	}
	done := make(chan struct{})
	g.refreshing = done
	g.mu.Unlock()
	defer close(done)

	qctx, cancel := context.WithTimeout(ctx, scrapeQueryTimeout)
	defer cancel()
	counts, serr := a.StuckCounts(qctx)
	if serr != nil {
		m.queryFailures.Inc()
		logger.Warn("stuck", "metrics: count stuck instances", "err", serr)
	} else {
		logger.Recovered("stuck", "metrics: counting stuck instances works again")
	}
	n, perr := a.ParkedEvents(qctx)
	if perr != nil {
		m.queryFailures.Inc()
		logger.Warn("parked", "metrics: count parked events", "err", perr)
	} else {
		logger.Recovered("parked", "metrics: counting parked events works again")
	}
	var slot ReplicationStatus
	var slotErr error
	if repl != nil {
		if slot, slotErr = repl(qctx); slotErr != nil {
			m.queryFailures.Inc()
			logger.Warn("slot", "metrics: read the replication slot", "err", slotErr)
		} else {
			logger.Recovered("slot", "metrics: reading the replication slot works again")
		}
	}
	g.mu.Lock()
	g.slot, g.slotOK = slot, repl != nil && slotErr == nil
	g.at, g.refreshing = time.Now(), nil
	g.stuck, g.stuckOK = counts, serr == nil
	g.parked, g.parkedOK = n, perr == nil
	g.mu.Unlock()
}

var (
	stuckDesc = prometheus.NewDesc(namespace+"_sagas_stuck",
		"Saga instances that are stuck, by saga and reason (failed, held, overdue, unregistered_version); counted in the background every 15s by default.",
		[]string{"saga", "reason"}, nil)
	heldDesc = prometheus.NewDesc(namespace+"_saga_held",
		"Saga instances held longer than --hold-after by an error an operator or the database must fix (a missing grant, table or column, a connection failure, a participant not listening): retried, never compensated on their own; by saga. The same count as compensa_sagas_stuck{reason=\"held\"}.",
		[]string{"saga"}, nil)
	parkedDesc = prometheus.NewDesc(namespace+"_parked_events",
		"Dead letters (parked events) not yet re-driven; counted in the background every 15s by default.", nil, nil)
	slotActiveDesc = prometheus.NewDesc(namespace+"_replication_slot_active",
		"1 while a walsender streams from the relay's slot, else 0; read in the background with the counts (replicas that do not stream report it too).", []string{"slot"}, nil)
	slotHealthyDesc = prometheus.NewDesc(namespace+"_replication_slot_healthy",
		"1 while the slot exists and its WAL is not lost, else 0 (0 means events may have been skipped); read in the background with the counts.", []string{"slot"}, nil)
	slotFailoverReadyDesc = prometheus.NewDesc(namespace+"_slot_failover_ready",
		"1 while the slot would survive a promotion of a standby (PostgreSQL 17+: failover on, synchronized_standby_slots set, its standbys connected and synchronizing), else 0.", []string{"slot"}, nil)
)

// scrapeCollector serves the counted gauges from memory. The first scrape
// of a process that has not counted yet waits for one count; a later one
// that finds the counts older than the interval (Server.Run not running)
// starts a refresh in the background and serves what it has.
type scrapeCollector struct{ m *Metrics }

func (c *scrapeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- stuckDesc
	ch <- heldDesc
	ch <- parkedDesc
	ch <- slotActiveDesc
	ch <- slotHealthyDesc
	ch <- slotFailoverReadyDesc
}

func (c *scrapeCollector) Collect(ch chan<- prometheus.Metric) {
	g := &c.m.gauges
	g.mu.Lock()
	never, stale := g.at.IsZero(), time.Since(g.at) > g.interval
	g.mu.Unlock()
	switch {
	case never:
		c.m.refreshGauges(context.Background())
	case stale:
		go c.m.refreshGauges(context.Background())
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stuckOK {
		for _, s := range g.stuck {
			ch <- prometheus.MustNewConstMetric(stuckDesc, prometheus.GaugeValue, float64(s.Count), s.Saga, s.Reason)
			if s.Reason == admin.StuckHeld {
				ch <- prometheus.MustNewConstMetric(heldDesc, prometheus.GaugeValue, float64(s.Count), s.Saga)
			}
		}
	}
	if g.parkedOK {
		ch <- prometheus.MustNewConstMetric(parkedDesc, prometheus.GaugeValue, float64(g.parked))
	}
	if g.slotOK {
		ch <- prometheus.MustNewConstMetric(slotActiveDesc, prometheus.GaugeValue, b2f(g.slot.Active), g.slot.Slot)
		ch <- prometheus.MustNewConstMetric(slotHealthyDesc, prometheus.GaugeValue, b2f(g.slot.Healthy()), g.slot.Slot)
		ch <- prometheus.MustNewConstMetric(slotFailoverReadyDesc, prometheus.GaugeValue, b2f(g.slot.FailoverReady), g.slot.Slot)
	}
}

// RunnerHooks returns the saga runner's hooks feeding these metrics: step
// durations and retries from OnStep, saga outcomes from OnTerminal. Set it
// as saga.RunnerConfig.Hooks.
func (m *Metrics) RunnerHooks() saga.Hooks {
	return saga.Hooks{
		OnStep: func(e saga.StepEvent) {
			phase := PhaseDo
			if e.Compensation {
				phase = PhaseCompensate
			}
			m.ObserveStep(StepObservation{Saga: e.Saga.Name, Step: e.StepName, Phase: phase, Outcome: string(e.Outcome), Duration: e.Duration})
		},
		OnTerminal: func(e saga.TerminalEvent) {
			m.SagaEnded(e.Saga.Name, string(e.Status))
		},
	}
}
