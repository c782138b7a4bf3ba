package httpapi

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/compensa/compensa/internal/apitoken"
	"github.com/compensa/compensa/internal/logthrottle"
	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/admin"
	"github.com/compensa/compensa/sink"
)

// Config configures the monitor. Pool is required; the rest is optional.
type Config struct {
	// Pool is the relay's database: /readyz pings it, and it backs Admin
	// when Admin is nil.
	Pool *pgxpool.Pool
	// Admin carries out the /v1/sagas requests. Nil: one is built from
	// Pool, Journal, Registry and StuckAfter.
	Admin *admin.Admin
	// Journal makes retry and cancel possible when Admin is nil.
	Journal admin.Journal
	// Registry names the steps and tells unregistered versions apart.
	Registry *saga.Registry
	// Definitions lists the loaded definitions for GET /v1/definitions;
	// nil describes Registry's as sagas defined in Go.
	Definitions DefinitionsFunc
	// StuckAfter: see admin.Config.StuckAfter (used when Admin is nil).
	StuckAfter time.Duration
	// APIToken, when set, is required as "Authorization: Bearer <token>" on
	// every /v1 request (and, through a login form, on the web page).
	// Unset: reads are open and retry/cancel answer 403.
	APIToken string
	// Tokens are the --api-tokens callers (see internal/apitoken), next to
	// APIToken; a tenant-scoped token sees and acts on its tenant only.
	Tokens *apitoken.Set
	// Insecure: the operator asked for a monitor without authentication on
	// a non-loopback address (--http-insecure); the page says so.
	Insecure bool
	// Replication reports the slot; nil means this process has no stream
	// (/v1/replication answers 503 and /readyz checks the database only).
	Replication ReplicationFunc
	// Health, when set, returns why the relay cannot keep up ("stream:
	// ...", "sink NAME: ..."), one line each; none means healthy. /readyz
	// answers 503 with them.
	Health func() []string
	// OutboxTable is the outbox table POST /v1/events writes to (a name
	// outbox.ParseTableName accepts, with the default columns). Empty: that
	// endpoint answers 501.
	OutboxTable string
	// Wake, when set, is called after a retry or a cancel was recorded, so
	// that the step runners pick the instance up now instead of at their
	// next poll (the correlator wakes them the same way).
	Wake func()
	// ReplaySink carries out POST /v1/sinks/{name}/replay with the relay's
	// own sinks (sink.Replay); nil answers 503.
	ReplaySink func(ctx context.Context, name string, req sink.ReplayRequest) (sink.ReplayResult, error)
	// Metrics are served at /metrics; nil creates a fresh set.
	Metrics *Metrics
	// Logger receives request errors (default: discard).
	Logger *slog.Logger
	// LagSampleInterval is how often Run samples the lag for the page's
	// chart (default 5s); LagSamples how many samples it keeps (default
	// 120: ten minutes at the default interval).
	LagSampleInterval time.Duration
	LagSamples        int

	// AllowedHosts are the names (besides IP literals and localhost) that
	// requests may carry in their Host header when no token is configured
	// (--http-allowed-hosts); others get 403, which defeats DNS rebinding.
	AllowedHosts []string
	// SessionTTL is how long a page login lasts (default 12h).
	SessionTTL time.Duration
	// SecureCookies marks the session cookie Secure even when the request
	// came over plain HTTP: a TLS-terminating proxy is in front
	// (--http-secure-cookies). With TLS at the relay it is Secure anyway.
	SecureCookies bool
	// MaxConcurrent bounds the /v1 and page requests served at once
	// (default 8); QueueWait is how long a request waits for a turn before
	// 503 (default 5s).
	MaxConcurrent int
	QueueWait     time.Duration
	// MaxScrapes bounds concurrent /metrics scrapes (default 4);
	// ScrapesPerSecond paces them (default 10): a scrape waits its turn up
	// to QueueWait, then gets 503.
	MaxScrapes       int
	ScrapesPerSecond int
	// MetricsElsewhere: /metrics is served by MetricsHandler on a listener
	// of its own (relay run --metrics-addr), and the monitor answers it
	// 404, so that whoever reaches the monitor does not read the metrics.
	MetricsElsewhere bool
	// ReadinessMaxAge is how old the answer of /readyz may be (default 1s):
	// probes are answered from the last check instead of each querying.
	ReadinessMaxAge time.Duration
	// AuthFailures failed authentications per AuthWindow from one address
	// are allowed (defaults 10 per minute); more get 429.
	AuthFailures int
	AuthWindow   time.Duration
}

// Server is the monitor's http.Handler: the JSON API under /v1, /metrics,
// /healthz, /readyz and the web page at /.
type Server struct {
	cfg     Config
	admin   *admin.Admin
	metrics *Metrics
	log     *slog.Logger
	mux     *http.ServeMux
	lag     *lagRing

	allowedHosts map[string]bool
	sessions     *sessionStore
	authFailures *authLimiter
	slots        requestSlots
	ready        readinessCache
	// throttle keeps a readiness failure probed every second to one log
	// line per interval.
	throttle *logthrottle.Throttle
	// tokens are APIToken and Tokens together (see auth.go).
	tokens *apitoken.Set
}

// New validates cfg and builds the server. Call Run to sample the lag for
// the page's chart.
func New(cfg Config) (*Server, error) {
	if cfg.Pool == nil {
		return nil, saga.Errorf(saga.ErrInvalid, "httpapi: Config.Pool is nil")
	}
	if cfg.LagSampleInterval < 0 || cfg.LagSamples < 0 {
		return nil, saga.Errorf(saga.ErrInvalid, "httpapi: Config.LagSampleInterval and Config.LagSamples must not be negative")
	}
	cfg.LagSampleInterval = cmp.Or(cfg.LagSampleInterval, 5*time.Second)
	cfg.LagSamples = cmp.Or(cfg.LagSamples, 120)
	cfg.SessionTTL = cmp.Or(cfg.SessionTTL, 12*time.Hour)
	cfg.MaxConcurrent = cmp.Or(cfg.MaxConcurrent, 8)
	cfg.QueueWait = cmp.Or(cfg.QueueWait, 5*time.Second)
	cfg.MaxScrapes = cmp.Or(cfg.MaxScrapes, 4)
	cfg.ScrapesPerSecond = cmp.Or(cfg.ScrapesPerSecond, 10)
	cfg.ReadinessMaxAge = cmp.Or(cfg.ReadinessMaxAge, time.Second)
	cfg.AuthFailures = cmp.Or(cfg.AuthFailures, 10)
	cfg.AuthWindow = cmp.Or(cfg.AuthWindow, time.Minute)
	if cfg.SessionTTL < 0 || cfg.MaxConcurrent < 0 || cfg.MaxScrapes < 0 || cfg.ScrapesPerSecond < 0 || cfg.AuthFailures < 0 {
		return nil, saga.Errorf(saga.ErrInvalid, "httpapi: Config.SessionTTL, MaxConcurrent, MaxScrapes and AuthFailures must not be negative")
	}
	s := &Server{cfg: cfg, admin: cfg.Admin, metrics: cfg.Metrics, log: cfg.Logger,
		allowedHosts: normalizeHosts(cfg.AllowedHosts), sessions: newSessionStore(cfg.SessionTTL),
		authFailures: newAuthLimiter(cfg.AuthFailures, cfg.AuthWindow), slots: make(requestSlots, cfg.MaxConcurrent)}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.throttle = logthrottle.New(s.log, 0)
	if s.admin == nil {
		var err error
		s.admin, err = admin.New(admin.Config{Pool: cfg.Pool, Journal: cfg.Journal, Registry: cfg.Registry, StuckAfter: cfg.StuckAfter})
		if err != nil {
			return nil, err
		}
	}
	if s.metrics == nil {
		var err error
		if s.metrics, err = NewMetrics(nil); err != nil {
			return nil, err
		}
	}
	s.metrics.setAdmin(s.admin, s.log)
	s.metrics.setReplication(cfg.Replication)
	if err := s.setTokens(); err != nil {
		return nil, err
	}
	// Samples taken by page views are kept at most twice per interval.
	s.lag = newLagRing(cfg.LagSamples, cfg.LagSampleInterval/2)
	s.routes()
	return s, nil
}

// Route is one /v1 endpoint: its method and its path pattern ({id} for an
// instance id).
type Route struct {
	Method, Path string
	handler      apiHandler
}

func (s *Server) apiRoutes() []Route {
	return []Route{
		{http.MethodGet, "/v1/sagas", s.listSagas},
		{http.MethodPost, "/v1/sagas", s.startSaga},
		{http.MethodGet, "/v1/sagas/{id}", s.showSaga},
		{http.MethodPost, "/v1/sagas/retry", s.bulkRetry},
		{http.MethodPost, "/v1/sagas/cancel", s.bulkCancel},
		{http.MethodPost, "/v1/sagas/{id}/retry", s.retrySaga},
		{http.MethodPost, "/v1/sagas/{id}/cancel", s.cancelSaga},
		{http.MethodPost, "/v1/sagas/pause", s.bulkPause},
		{http.MethodPost, "/v1/sagas/resume", s.bulkResume},
		{http.MethodPost, "/v1/sagas/upgrade", s.upgradeSagas},
		{http.MethodPost, "/v1/sagas/{id}/pause", s.pauseSaga},
		{http.MethodPost, "/v1/sagas/{id}/resume", s.resumeSaga},
		{http.MethodGet, "/v1/replication", s.replication},
		{http.MethodGet, "/v1/definitions", s.definitions},
		{http.MethodGet, "/v1/overview", s.overview},
		{http.MethodGet, "/v1/search", s.search},
		{http.MethodGet, "/v1/openapi.json", s.openAPI},
		{http.MethodPost, "/v1/events", s.postEvent},
		{http.MethodGet, "/v1/sinks", s.listSinks},
		{http.MethodPost, "/v1/sinks/{name}/retry", s.retrySink},
		{http.MethodGet, "/v1/sinks/{name}/parked", s.listParked},
		{http.MethodPost, "/v1/sinks/{name}/parked/{id}/skip", s.skipParked},
		{http.MethodPost, "/v1/sinks/{name}/replay", s.replaySink},
		{http.MethodGet, "/v1/deadletters", s.listDeadLetters},
	}
}

// Routes lists the /v1 endpoints (for the OpenAPI description's test and
// the tenant-isolation test, which must cover every one).
func (s *Server) Routes() []Route { return s.apiRoutes() }

func (s *Server) routes() {
	m := http.NewServeMux()
	if !s.cfg.MetricsElsewhere {
		m.Handle("GET /metrics", s.scrapeHandler())
	}
	m.HandleFunc("GET /healthz", s.healthz)
	m.HandleFunc("GET /readyz", s.readyz)

	// Every /v1 route checks the method itself so that a wrong one gets a
	// JSON 405, and the catch-all answers JSON 404.
	// A path served by several methods (GET and POST /v1/sagas) picks the
	// handler by method; any other method gets the first one's JSON 405.
	byPath := map[string]map[string]http.Handler{}
	var paths []string
	for _, rt := range s.apiRoutes() {
		if byPath[rt.Path] == nil {
			byPath[rt.Path] = map[string]http.Handler{"": s.api(rt.handler, rt.Method)}
			paths = append(paths, rt.Path)
		}
		byPath[rt.Path][rt.Method] = s.api(rt.handler, rt.Method)
	}
	for _, p := range paths {
		hs := byPath[p]
		m.Handle(p, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if h, ok := hs[r.Method]; ok {
				h.ServeHTTP(w, r)
				return
			}
			hs[""].ServeHTTP(w, r)
		}))
	}
	m.Handle("/v1/", s.api(func(w http.ResponseWriter, r *http.Request, _ *admin.Admin) {
		writeError(w, http.StatusNotFound, "no such endpoint: "+r.URL.Path+" (see docs/api.md for the API)")
	}, ""))

	s.pageRoutes(m)
	s.mux = m
}

// scrapeHandler serves the metrics, scrapes paced and bounded.
func (s *Server) scrapeHandler() http.Handler {
	return newScrapePacer(s.cfg.ScrapesPerSecond, s.cfg.QueueWait).wrap(s.metrics.handler(s.cfg.MaxScrapes))
}

// MetricsHandler serves only GET /metrics, for a listener of its own
// (relay run --metrics-addr), paced and bounded as on the monitor.
func (s *Server) MetricsHandler() http.Handler {
	m := http.NewServeMux()
	m.Handle("GET /metrics", s.scrapeHandler())
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Content-Type-Options", "nosniff")
		m.ServeHTTP(w, r)
	})
}

// ProbeHandler serves only GET /healthz and GET /readyz, for a listener of
// their own (relay run --probe-addr): a flood of connections to the monitor
// then cannot make a liveness probe fail and get the relay restarted.
func (s *Server) ProbeHandler() http.Handler {
	m := http.NewServeMux()
	m.HandleFunc("GET /healthz", s.healthz)
	m.HandleFunc("GET /readyz", s.readyz)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Content-Type-Options", "nosniff")
		m.ServeHTTP(w, r)
	})
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if !s.guard(w, r) {
		return
	}
	s.mux.ServeHTTP(w, r)
}

// Run refreshes, until ctx ends, the gauges that need a query (every
// Metrics' gauge interval, so that scrapes are served from memory) and
// samples the replication lag every LagSampleInterval for the page's chart.
func (s *Server) Run(ctx context.Context) error {
	var lagTick <-chan time.Time
	if s.cfg.Replication != nil {
		t := time.NewTicker(s.cfg.LagSampleInterval)
		defer t.Stop()
		lagTick = t.C
		s.sampleLag(ctx)
	}
	gauges := time.NewTicker(s.metrics.gaugeInterval())
	defer gauges.Stop()
	s.metrics.refreshGauges(ctx)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-lagTick:
			s.sampleLag(ctx)
		case <-gauges.C:
			s.metrics.refreshGauges(ctx)
		}
	}
}

// sampleLag reads the status once and records it.
func (s *Server) sampleLag(ctx context.Context) (ReplicationStatus, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st, err := s.cfg.Replication(ctx)
	if err == nil && st.Active && st.Streamer == "" {
		st.Streamer = s.streamer(ctx, st.Slot)
	}
	sample := LagSample{At: time.Now(), OK: err == nil && st.Healthy()}
	if err == nil {
		sample.LagBytes = st.LagBytes
		if st.LagSeconds != nil {
			sample.LagSeconds = *st.LagSeconds
		}
	}
	s.lag.add(sample)
	return st, err
}

// streamer names the walsender that holds the slot; "" when it cannot
// tell (it is a nicety: an error is only logged).
func (s *Server) streamer(ctx context.Context, slot string) string {
	var pid int32
	var app, addr string
	err := s.cfg.Pool.QueryRow(ctx, sqlStreamer, slot).Scan(&pid, &app, &addr)
	if err != nil {
		if !errors.Is(err, pgx.ErrNoRows) {
			s.log.Warn("monitor: read the slot's walsender", "slot", slot, "err", err)
		}
		return ""
	}
	out := fmt.Sprintf("walsender pid %d", pid)
	if app != "" {
		out += ", application " + app
	}
	if addr != "" {
		out += ", from " + addr
	}
	return out
}

const sqlStreamer = `
SELECT s.active_pid, coalesce(r.application_name, ''), coalesce(host(r.client_addr), 'local socket')
FROM pg_replication_slots s LEFT JOIN pg_stat_replication r ON r.pid = s.active_pid
WHERE s.slot_name = $1 AND s.active_pid IS NOT NULL`

// LagSamples returns the samples kept for the chart, oldest first.
func (s *Server) LagSamples() []LagSample { return s.lag.samples() }

// --- health ---------------------------------------------------------------

func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// readyz answers from the last readiness check, running one when that is
// older than ReadinessMaxAge: a burst of probes costs one query per second
// at most, not one each.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	res, ok := s.ready.get(r.Context(), s.cfg.ReadinessMaxAge, s.checkReady)
	if !ok {
		return // the prober went away
	}
	writeJSON(w, res.status, res.body)
}

func (s *Server) checkReady() readyResult {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var reasons []string
	out := map[string]any{"status": "ok", "database": "ok"}
	var standby, down bool
	if err := s.cfg.Pool.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&standby); err != nil {
		down = true
		s.throttle.Warn("database", "readyz: database unreachable", "err", err)
		if strings.Contains(err.Error(), "read only connection") {
			// target_session_attrs=read-write found only standbys.
			reasons = append(reasons, "no primary: every reachable host of the database URL is a standby (read-only); waiting for a promotion")
		} else {
			reasons = append(reasons, "database unreachable: the relay cannot reach PostgreSQL (the relay's log has the error)")
		}
	} else if standby {
		reasons = append(reasons, "connected to a standby (read-only): waiting for a primary; name every host of the cluster with target_session_attrs=read-write")
	} else {
		s.throttle.Recovered("database", "readyz: database reachable again")
		if s.cfg.Replication != nil {
			st, err := s.sampleLag(ctx)
			switch {
			case err != nil:
				s.throttle.Warn("replication", "readyz: replication status", "err", err)
				reasons = append(reasons, "cannot read the replication slot's status")
			case !st.Exists:
				reasons = append(reasons, "replication slot "+st.Slot+" does not exist: events written since it was lost may have been skipped")
			case !st.Healthy():
				reasons = append(reasons, "replication slot "+st.Slot+" has wal_status "+st.WALStatus+": the WAL it needs is gone and events may have been skipped")
			default:
				s.throttle.Recovered("replication", "readyz: replication status readable again")
				out["slot"] = st.Slot
				out["wal_status"] = st.WALStatus
			}
		}
	}
	if s.cfg.Health != nil {
		reasons = append(reasons, s.cfg.Health()...)
	}
	if len(reasons) > 0 {
		return readyResult{status: http.StatusServiceUnavailable, body: map[string]any{"status": "unready", "reasons": reasons}, databaseDown: down}
	}
	return readyResult{status: http.StatusOK, body: out}
}

// --- JSON API plumbing ----------------------------------------------------

// apiHandler gets the Admin scoped to the request's tenant.
type apiHandler func(w http.ResponseWriter, r *http.Request, a *admin.Admin)

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}

// writeErr maps an error's kind to a status. Errors without a kind are
// logged and answered with a generic message: they may carry details of
// the database a caller has no business seeing.
func (s *Server) writeErr(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.As(err, new(errForbidden)):
		writeError(w, http.StatusForbidden, err.Error())
	case errors.Is(err, saga.ErrInvalid):
		writeError(w, http.StatusBadRequest, err.Error())
	case errors.Is(err, saga.ErrNotFound):
		writeError(w, http.StatusNotFound, err.Error())
	case errors.Is(err, saga.ErrConflict):
		writeError(w, http.StatusConflict, err.Error())
	case errors.Is(err, admin.ErrReadOnly):
		writeError(w, http.StatusServiceUnavailable, "retry and cancel are not available in this process (no journal)")
	case errors.Is(err, context.Canceled):
		// The client went away; nobody reads the answer.
	default:
		s.log.Error("monitor request failed", "method", r.Method, "path", r.URL.Path, "err", err)
		writeError(w, http.StatusInternalServerError, "internal error; see the relay's log")
	}
}
