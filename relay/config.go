package relay

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/compensa/compensa/cdc"
	"github.com/compensa/compensa/internal/apitoken"
	"github.com/compensa/compensa/internal/httpapi"
	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/admin"
	"github.com/compensa/compensa/saga/declare"
)

// Config is everything a relay is assembled from. Its fields mirror the flags
// of `relay run`; the zero value of each optional field is the CLI's default.
// Only DatabaseURL and Registry are required.
type Config struct {
	// DatabaseURL is a PostgreSQL URL or keyword/value DSN. The role needs the
	// REPLICATION attribute unless NoStream is set (see docs/getting-started.md, "Quickstart").
	DatabaseURL string

	// Registry holds the saga definitions this relay starts and runs. The
	// application fills it before New; it must not change afterwards.
	Registry *saga.Registry

	// Slot and Publication name the logical replication slot and the
	// publication. Defaults: DefaultSlot, DefaultPublication.
	Slot        string
	Publication string

	// OutboxTable is the outbox table, schema-qualified allowed (default
	// "outbox"). OutboxColumns maps the relay's fields to the columns of an
	// existing table ("id=id,event_type=type"); empty means the default names.
	OutboxTable   string
	OutboxColumns string
	// MessagePrefix is the prefix of the logical decoding messages
	// (pg_logical_emit_message, outbox.Emit) that are outbox events
	// (default "outbox"); see cdc.Config.MessagePrefix.
	MessagePrefix string

	// NoStream runs only the step workers and the monitor: extra replicas
	// beside the one that holds the slot.
	NoStream bool
	// StatusInterval is how often the flushed position is reported to
	// PostgreSQL (default 10s); HeartbeatInterval how often a heartbeat is
	// written so that the slot advances while the outbox is idle (default 10s).
	StatusInterval    time.Duration
	HeartbeatInterval time.Duration
	// RecreateSlot re-creates a missing or lost slot. It MAY SKIP EVENTS
	// written while the slot was gone: set it only after checking.
	RecreateSlot bool
	// OnSlotLost is what happens when the slot is lost (missing while a
	// checkpoint exists, or invalidated): "stop" (the default) stops the
	// stream with ErrSlotLost; "resync" creates a new slot and first
	// re-reads the outbox rows created since the last checkpoint's time
	// minus ResyncMargin (default 10m) through the same idempotent path.
	OnSlotLost   string
	ResyncMargin time.Duration
	// OutboxRetention deletes outbox rows older than this once streamed; 0
	// keeps them.
	OutboxRetention time.Duration
	// SagaRetention: the history (step records, journal events, inbox
	// rows) of an instance that ended COMPLETED or COMPENSATED longer ago
	// than this is deleted, and its row kept as a small tombstone until
	// DedupeWindow (see docs/operations.md, "Retention"). Zero means
	// DefaultSagaRetention (24h); KeepForever keeps every history.
	// Re-driven dead letters and skipped sink deliveries go after it too.
	SagaRetention time.Duration
	// FailedRetention does the same for FAILED and TIMED_OUT instances and
	// for dead letters nobody re-drove. Zero keeps them until an operator
	// acts.
	FailedRetention time.Duration
	// DedupeWindow is how long a tombstone (and with it the unique start
	// index's entry) is kept after its instance ended: a trigger read again
	// within it (a resync, a slot behind, a repeated idempotency key)
	// starts nothing. Zero means DefaultDedupeWindow (30 days); KeepForever
	// keeps tombstones forever. New refuses one shorter than ResyncMargin
	// plus OutboxRetention.
	DedupeWindow time.Duration
	// StallAfter is how long committed outbox work may wait behind the
	// acknowledged position (or the stream stay down) before /readyz
	// answers 503 and compensa_stream_stalled is 1 (default 60s).
	StallAfter time.Duration

	// Workers is the number of step workers (default 8; negative is an
	// error). LeaseDuration is how long a claim on an instance lasts without
	// a heartbeat (default 30s).
	Workers       int
	LeaseDuration time.Duration
	// ClaimOrder is how the step workers pick due instances: "fair" (the
	// default, also when empty) shares each claim between the tenants with
	// due work, in turn and by TenantWeights; "oldest" takes the oldest due
	// instances whoever their tenant.
	ClaimOrder string
	// TenantWeights gives a tenant a larger share of each claim (1 to
	// 1000; absent tenants weigh 1). Only with ClaimOrder fair.
	TenantWeights map[uuid.UUID]int

	// StuckAfter: an instance overdue by more than this with no live lease is
	// reported stuck by the monitor (default 5m).
	StuckAfter time.Duration
	// HoldAfter: an instance whose step (or compensation) has failed this
	// long with errors an operator or the database must fix (see
	// saga.Classify) is reported held: stuck with reason "held" (default
	// 15m). Such errors never compensate, whatever this is.
	HoldAfter time.Duration

	// HTTPAddr is where the monitor listens ("127.0.0.1:8080" style; port 0
	// picks a free one, see Addr). Empty: no listener; the application mounts
	// Handler on its own server.
	HTTPAddr string
	// APIToken, when set, is required as a bearer token on /v1 and by the
	// page's login. Unset: reads are open and mutations answer 403. It must
	// carry at least 128 random bits (httpapi.CheckTokenStrength).
	APIToken string
	// APITokensFile is a token file (YAML: tokens with name, token_env or
	// sha256, tenant or "*", role operate or read; see docs/monitor.md, "API
	// tokens"), loaded and validated by New with every problem reported as
	// file:line:col. Its tokens work beside APIToken; a tenant-scoped one
	// sees and acts on its tenant only.
	APITokensFile string
	// HTTPInsecure allows a monitor without any token on an address that
	// is not loopback (New refuses that otherwise: every saga's state would
	// be readable by whoever can reach it); the page then shows a banner.
	HTTPInsecure bool
	// AllowedHosts: without APIToken, the monitor answers only requests
	// whose Host is an IP address, localhost or one of these names (DNS
	// rebinding). SessionTTL is how long a login to the page lasts (default
	// DefaultSessionTTL). SecureCookies marks the session cookie Secure
	// behind a TLS-terminating proxy.
	AllowedHosts  []string
	SessionTTL    time.Duration
	SecureCookies bool
	// HTTPServer bounds the monitor's connections (timeouts, the cap on
	// open connections); zero fields mean httpapi's defaults.
	HTTPServer httpapi.ServerConfig
	// ProbeAddr, when set, is a listener of its own for /healthz and
	// /readyz (`relay run --probe-addr`), with its own connection cap: a
	// flood of connections to HTTPAddr cannot make the probes fail. The
	// probes stay on HTTPAddr too. Empty: none.
	ProbeAddr string
	// MetricsAddr, when set, is a listener of its own for /metrics
	// (`relay run --metrics-addr`), and the monitor at HTTPAddr no longer
	// serves it: the metrics can be kept off the address users and the
	// API reach (a Kubernetes Service of their own, a port only
	// Prometheus may reach). Empty: /metrics is on HTTPAddr.
	MetricsAddr string

	// Sagas is a directory of declared saga definitions (*.yaml, *.yml;
	// `relay run --sagas`). New loads, checks and pins every file before
	// anything starts and registers them on Registry beside the sagas
	// defined in Go (a name defined both ways is refused); an error lists
	// every problem (declare.Problems). ReloadSagas re-reads it. Empty: none.
	Sagas string
	// HTTPEgressAllow lists the host names, IP addresses and CIDR networks
	// (`relay run --http-egress-allow`) that a declared http step whose URL's
	// host comes from an expression may reach, beside its file's
	// egress.allow. Hosts written literally in a saga file need no entry.
	// Empty: only what the files allow.
	HTTPEgressAllow []string

	// Sinks is the path of a sinks file (YAML, see sink.LoadFile): the
	// relay also delivers outbox events to those NATS, Kafka and webhook
	// destinations. Empty: no sinks. With NoStream the file is checked
	// (secrets included) but no sink is opened.
	Sinks string

	// Logger receives the relay's structured logs (default: discarded).
	Logger *slog.Logger
	// MetricsRegistry receives the relay's Prometheus metrics and is what
	// /metrics serves. Nil: a registry of the relay's own, with the Go and
	// process collectors. An application that passes its own registry gets
	// the relay's metrics beside its own (names start with compensa_).
	MetricsRegistry *prometheus.Registry

	// TracerProvider receives the relay's OpenTelemetry spans
	// (docs/tracing.md). Nil: the standard OTEL_* environment variables decide
	// (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_TRACES_EXPORTER, ...); when they ask
	// for no traces, tracing is off and costs nothing. Stop flushes a
	// provider passed here (its owner shuts it down) and shuts down one
	// built from the environment.
	TracerProvider trace.TracerProvider
}

// Defaults of the fields left zero.
const (
	DefaultSlot        = "relay_outbox"
	DefaultPublication = "relay_outbox_pub"
	DefaultOutboxTable = "outbox"
	DefaultWorkers     = 8
	// ClaimFair and ClaimOldest are the values of Config.ClaimOrder.
	ClaimFair            = "fair"
	ClaimOldest          = "oldest"
	DefaultLease         = 30 * time.Second
	DefaultStuckAfter    = 5 * time.Minute
	DefaultHoldAfter     = admin.DefaultHoldAfter
	DefaultStatusEvery   = 10 * time.Second
	DefaultHeartbeatEver = 10 * time.Second
	DefaultSessionTTL    = 12 * time.Hour
	DefaultStallAfter    = time.Minute
	// DefaultSagaRetention is SagaRetention's default, and
	// DefaultDedupeWindow DedupeWindow's.
	DefaultSagaRetention = 24 * time.Hour
	DefaultDedupeWindow  = 30 * 24 * time.Hour
	// KeepForever, as SagaRetention or DedupeWindow, deletes nothing of
	// that kind (the CLI's 0).
	KeepForever time.Duration = -1
	// MonitorPoolSize is the monitor's own pool: scrapes and API reads
	// queue there, never in front of the step workers and the correlator.
	MonitorPoolSize = 4
)

// withDefaults returns a copy with every zero optional field filled in.
func (c Config) withDefaults() Config {
	c.Slot = cmp.Or(c.Slot, DefaultSlot)
	c.Publication = cmp.Or(c.Publication, DefaultPublication)
	c.OutboxTable = cmp.Or(c.OutboxTable, DefaultOutboxTable)
	c.Workers = cmp.Or(c.Workers, DefaultWorkers)
	c.ClaimOrder = cmp.Or(c.ClaimOrder, ClaimFair)
	c.LeaseDuration = cmp.Or(c.LeaseDuration, DefaultLease)
	c.StuckAfter = cmp.Or(c.StuckAfter, DefaultStuckAfter)
	c.HoldAfter = cmp.Or(c.HoldAfter, DefaultHoldAfter)
	c.StatusInterval = cmp.Or(c.StatusInterval, DefaultStatusEvery)
	c.HeartbeatInterval = cmp.Or(c.HeartbeatInterval, DefaultHeartbeatEver)
	c.SessionTTL = cmp.Or(c.SessionTTL, DefaultSessionTTL)
	c.StallAfter = cmp.Or(c.StallAfter, DefaultStallAfter)
	c.SagaRetention = cmp.Or(c.SagaRetention, DefaultSagaRetention)
	c.DedupeWindow = cmp.Or(c.DedupeWindow, DefaultDedupeWindow)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// validate rejects nonsense with a message naming the field, all at once.
func (c Config) validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("relay: "+format, args...))
	}
	if c.DatabaseURL == "" {
		bad("Config.DatabaseURL is empty: give a PostgreSQL URL such as postgres://user:password@host:5432/db")
	}
	if c.Registry == nil {
		bad("Config.Registry is nil: create one with saga.NewRegistry() and register your sagas on it")
	}
	if c.ClaimOrder != "" && c.ClaimOrder != ClaimFair && c.ClaimOrder != ClaimOldest {
		bad("Config.ClaimOrder is %q: give %q (claims shared between tenants) or %q", c.ClaimOrder, ClaimFair, ClaimOldest)
	}
	for t, w := range c.TenantWeights {
		if w < 1 || w > 1000 {
			bad("tenant %s has weight %d: give 1 to 1000", t, w)
		}
	}
	if len(c.TenantWeights) > 0 && c.ClaimOrder == ClaimOldest {
		bad("tenant weights apply to fair claims only: drop them, or the oldest claim order")
	}
	if c.Workers < 0 {
		bad("Config.Workers is %d: give a positive number of step workers", c.Workers)
	}
	for name, d := range map[string]time.Duration{
		"LeaseDuration": c.LeaseDuration, "StuckAfter": c.StuckAfter, "HoldAfter": c.HoldAfter, "StatusInterval": c.StatusInterval,
		"HeartbeatInterval": c.HeartbeatInterval, "OutboxRetention": c.OutboxRetention, "SessionTTL": c.SessionTTL,
		"StallAfter": c.StallAfter, "FailedRetention": c.FailedRetention, "ResyncMargin": c.ResyncMargin,
	} {
		if d < 0 {
			bad("Config.%s is %s: durations must not be negative", name, d)
		}
	}
	for name, d := range map[string]time.Duration{"SagaRetention": c.SagaRetention, "DedupeWindow": c.DedupeWindow} {
		if d < 0 && d != KeepForever {
			bad("Config.%s is %s: give a positive duration, zero for the default or KeepForever", name, d)
		}
	}
	if err := c.checkDedupeWindow(); err != nil {
		errs = append(errs, err)
	}
	if c.APIToken != "" {
		if err := httpapi.CheckTokenStrength("Config.APIToken", c.APIToken); err != nil {
			errs = append(errs, fmt.Errorf("relay: %w", err))
		}
	}
	if err := declare.ValidateEgressAllow(c.HTTPEgressAllow); err != nil {
		bad("Config.HTTPEgressAllow: %v", err)
	}
	if err := c.checkExposure(); err != nil {
		errs = append(errs, err)
	}
	if _, err := c.loadTokens(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return saga.Errorf(saga.ErrInvalid, "%s", err.Error())
	}
	return nil
}

// DedupeFloor is the shortest dedupe window that outlasts every re-read of
// a trigger: a resync re-reads the outbox rows created since the
// checkpoint's time minus resyncMargin, and the outbox keeps a streamed row
// for outboxRetention (0: forever; the janitor then also keeps every
// tombstone a resync of the slot could re-read, by the checkpoint's time).
// An idempotency key is recognised for the dedupe window itself.
func DedupeFloor(resyncMargin, outboxRetention time.Duration) time.Duration {
	return cmp.Or(resyncMargin, cdc.DefaultResyncMargin) + outboxRetention
}

// checkDedupeWindow refuses a dedupe window shorter than DedupeFloor.
func (c Config) checkDedupeWindow() error {
	w := cmp.Or(c.DedupeWindow, DefaultDedupeWindow)
	if w == KeepForever || c.ResyncMargin < 0 || c.OutboxRetention < 0 {
		return nil
	}
	if floor := DedupeFloor(c.ResyncMargin, c.OutboxRetention); w < floor {
		return fmt.Errorf("relay: Config.DedupeWindow %s is shorter than ResyncMargin (%s) plus OutboxRetention (%s): a trigger read again after its tombstone is gone would start its saga twice; give at least %s",
			w, cmp.Or(c.ResyncMargin, cdc.DefaultResyncMargin), c.OutboxRetention, floor)
	}
	return nil
}

// checkExposure refuses a monitor on an address that is not loopback with
// no token configured, unless HTTPInsecure accepts it.
func (c Config) checkExposure() error {
	if c.handlerOnly() || c.HTTPInsecure || c.APIToken != "" || c.APITokensFile != "" || httpapi.IsLoopback(c.HTTPAddr) {
		return nil
	}
	return fmt.Errorf("relay: Config.HTTPAddr %s is not a loopback address and no token is configured, so the monitor would show every saga's state to whoever can reach it; set APIToken or APITokensFile, or HTTPInsecure to accept that", c.HTTPAddr)
}

// loadTokens reads APITokensFile (nil when unset), every token at least as
// strong as APIToken must be.
func (c Config) loadTokens() (*apitoken.Set, error) {
	if c.APITokensFile == "" {
		return nil, nil
	}
	set, err := apitoken.Load(c.APITokensFile, nil, httpapi.CheckTokenStrength)
	if err != nil {
		return nil, saga.Errorf(saga.ErrInvalid, "%s", err.Error())
	}
	return set, nil
}

// handlerOnly reports whether the application serves Handler itself.
func (c Config) handlerOnly() bool { return c.HTTPAddr == "" }

var _ http.Handler = (*Relay)(nil)
