package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/compensa/compensa/cdc"
	"github.com/compensa/compensa/internal/cliflag"
	"github.com/compensa/compensa/internal/dbconn"
	"github.com/compensa/compensa/internal/httpapi"
	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/relay"
	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/declare"
)

func newRunCmd(opts *rootOptions) *cobra.Command {
	var (
		cfg          relay.Config
		stopTimeout  time.Duration
		withExamples bool
	)
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Stream outbox inserts, start sagas and run their steps until SIGINT/SIGTERM",
		Long: "Streams committed outbox inserts from the replication slot (one replica per slot\n" +
			"streams; others wait to take over), starts saga instances exactly once, runs their\n" +
			"steps, and serves the monitor on --http-addr. With --no-stream only the step\n" +
			"workers run (extra replicas). The first SIGINT/SIGTERM stops gracefully within\n" +
			"--stop-timeout; a second one stops at once.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dsn, err := opts.requireDatabase()
			if err != nil {
				return exitError{code: 2, msg: err.Error()}
			}
			cfg.DatabaseURL, cfg.Slot, cfg.Publication = dsn, opts.Slot, opts.Publication
			cfg.HTTPAddr, cfg.OutboxTable, cfg.OutboxColumns = opts.HTTPAddr, opts.OutboxTable, opts.OutboxColumns
			opts.extraSecrets = append(opts.extraSecrets, cfg.APIToken)
			if cfg.APIToken != "" {
				if err := httpapi.CheckTokenStrength("--api-token", cfg.APIToken); err != nil {
					return exitError{code: 2, msg: err.Error()}
				}
			}
			if cfg.HTTPAddr != "" && !cfg.HTTPInsecure && cfg.APIToken == "" && cfg.APITokensFile == "" && !httpapi.IsLoopback(cfg.HTTPAddr) {
				return exitError{code: 2, msg: fmt.Sprintf("--http-addr %s is not a loopback address and no token is configured: anyone who can reach it could read every saga's state; pass --api-token (or RELAY_API_TOKEN) or --api-tokens FILE, or --http-insecure to accept that", cfg.HTTPAddr)}
			}
			if err := declare.ValidateEgressAllow(cfg.HTTPEgressAllow); err != nil {
				return exitError{code: 2, msg: "--http-egress-allow: " + err.Error()}
			}
			if len(cfg.TenantWeights) > 0 && cfg.ClaimOrder == relay.ClaimOldest {
				return exitError{code: 2, msg: "--tenant-weight applies to --claim-order fair only: drop it, or --claim-order oldest"}
			}
			if cfg.SagaRetention == 0 {
				cfg.SagaRetention = relay.KeepForever
			}
			if cfg.DedupeWindow == 0 {
				cfg.DedupeWindow = relay.KeepForever
			} else if floor := relay.DedupeFloor(cfg.ResyncMargin, cfg.OutboxRetention); cfg.DedupeWindow < floor {
				return exitError{code: 2, msg: fmt.Sprintf("--dedupe-window %s is shorter than --resync-margin (%s) plus --outbox-retention (%s): a trigger read again after its tombstone is gone would start its saga twice; give --dedupe-window %s or more",
					cfg.DedupeWindow, cfg.ResyncMargin, cfg.OutboxRetention, floor)}
			}
			cfg.Logger = newLogger(opts)
			return runRelay(cmd.Context(), cfg, stopTimeout, withExamples)
		},
	}
	opts.bindTo(cmd.Flags(), "database-url", "slot", "publication", "http-addr", "outbox-table", "outbox-columns", "log-level")
	f := cmd.Flags()
	f.BoolVar(&cfg.NoStream, "no-stream", false, "run only the step workers, not the replication stream (env RELAY_NO_STREAM)")
	f.Var(cliflag.PositiveDuration(&cfg.StatusInterval, relay.DefaultStatusEvery), "status-interval", "how often to report the flushed position to PostgreSQL (env RELAY_STATUS_INTERVAL)")
	f.Var(cliflag.PositiveDuration(&cfg.HeartbeatInterval, relay.DefaultHeartbeatEver), "heartbeat-interval", "how often to emit a heartbeat so the slot advances while the outbox is idle (env RELAY_HEARTBEAT_INTERVAL)")
	f.StringVar(&cfg.MessagePrefix, "message-prefix", outbox.DefaultMessagePrefix, "prefix of the transactional logical decoding messages (pg_logical_emit_message, PostgreSQL 14+) that are outbox events; other prefixes are ignored (env RELAY_MESSAGE_PREFIX)")
	f.BoolVar(&cfg.RecreateSlot, "recreate-slot", false, "re-create a missing or lost slot; MAY SKIP EVENTS written while it was gone (env RELAY_RECREATE_SLOT)")
	f.Var(cliflag.NewEnum(&cfg.OnSlotLost, cdc.SlotLostStop, "stop|resync", cdc.SlotLostStop, cdc.SlotLostResync), "on-slot-lost", "when the slot is lost: stop, or resync (a new slot, after re-reading the outbox rows since the last checkpoint minus --resync-margin; events written as messages meanwhile cannot be re-read) (env RELAY_ON_SLOT_LOST)")
	f.Var(cliflag.PositiveDuration(&cfg.ResyncMargin, 10*time.Minute), "resync-margin", "with --on-slot-lost=resync, how far before the last checkpoint's time the re-read starts; longer than the longest producer transaction (env RELAY_RESYNC_MARGIN)")
	f.Var(cliflag.OptionalDuration(&cfg.OutboxRetention, 0), "outbox-retention", "delete outbox rows older than this once streamed, e.g. 24h; 0 keeps them (env RELAY_OUTBOX_RETENTION)")
	f.Var(cliflag.Retention(&cfg.SagaRetention, relay.DefaultSagaRetention), "saga-retention", "delete the steps, journal and inbox rows of instances that ended COMPLETED or COMPENSATED longer ago than this, keeping a small tombstone; 0 keeps them forever (env RELAY_SAGA_RETENTION)")
	f.Var(cliflag.OptionalDuration(&cfg.FailedRetention, 0), "failed-retention", "the same for FAILED and TIMED_OUT instances and dead letters nobody re-drove; 0 keeps them until an operator acts (env RELAY_FAILED_RETENTION)")
	f.Var(cliflag.Retention(&cfg.DedupeWindow, relay.DefaultDedupeWindow), "dedupe-window", "keep a finished instance's tombstone this long after it ended, so a trigger read again (resync, repeated idempotency key) starts nothing; at least --resync-margin plus --outbox-retention; 0 keeps them forever (env RELAY_DEDUPE_WINDOW)")
	f.Var(cliflag.PositiveDuration(&cfg.StallAfter, relay.DefaultStallAfter), "stall-after", "/readyz answers 503 when committed outbox work has waited this long behind the acknowledged position, or the stream has been down this long (env RELAY_STALL_AFTER)")
	f.Var(cliflag.IntAtLeast(&cfg.Workers, relay.DefaultWorkers, 1), "workers", "step workers in this process, at least 1 (env RELAY_WORKERS)")
	f.Var(cliflag.NewEnum(&cfg.ClaimOrder, relay.ClaimFair, "fair|oldest", relay.ClaimFair, relay.ClaimOldest), "claim-order", "how step workers pick due instances: fair (each claim shared between the tenants with due work, in turn) or oldest (oldest first, whoever the tenant) (env RELAY_CLAIM_ORDER)")
	f.Var(cliflag.NewPairs(&cfg.TenantWeights, "TENANT_ID=N", fmt.Sprintf("want TENANT_ID=N, N from 1 to %d, e.g. 0b7e6c2a-1f0e-4a57-9a43-5d2c1e6f8b90=3", maxTenantWeight), parseTenantWeight),
		"tenant-weight", fmt.Sprintf("give the tenant N times the share of each claim (1 to %d; others weigh 1; repeatable)", maxTenantWeight))
	f.Var(cliflag.PositiveDuration(&cfg.LeaseDuration, relay.DefaultLease), "lease", "how long a worker's claim on an instance lasts without a heartbeat (env RELAY_LEASE)")
	f.Var(cliflag.PositiveDuration(&cfg.StuckAfter, relay.DefaultStuckAfter), "stuck-after", "an instance overdue by more than this with no live lease is reported stuck (env RELAY_STUCK_AFTER)")
	f.Var(cliflag.PositiveDuration(&cfg.HoldAfter, relay.DefaultHoldAfter), "hold-after", "an instance whose step has failed this long with errors an operator must fix (a missing grant, table or column, a connection failure) is reported held; such errors are retried and never compensate (env RELAY_HOLD_AFTER)")
	f.StringVar(&cfg.APIToken, "api-token", "", "bearer token for /v1, at least 128 random bits, e.g. from openssl rand -hex 32 (env RELAY_API_TOKEN); without one, mutations answer 403")
	f.StringVar(&cfg.APITokensFile, "api-tokens", "", "YAML file of named tokens, each scoped to a tenant (or \"*\") with role operate or read (env RELAY_API_TOKENS); see docs/monitor.md, API tokens")
	f.BoolVar(&cfg.HTTPInsecure, "http-insecure", false, "allow the monitor on a non-loopback --http-addr without any token (otherwise relay run exits 2); the page shows a banner (env RELAY_HTTP_INSECURE)")
	f.Var(cliflag.Address(&cfg.ProbeAddr, "").Optional(), "probe-addr", "a listener of its own for /healthz and /readyz, e.g. :8081, so that a flood of connections to the monitor cannot fail the probes (env RELAY_PROBE_ADDR)")
	f.Var(cliflag.Address(&cfg.MetricsAddr, "").Optional(), "metrics-addr", "a listener of its own for /metrics, e.g. :9090; the monitor then no longer serves /metrics, which stays off the address users and the API reach (env RELAY_METRICS_ADDR)")
	f.StringSliceVar(&cfg.AllowedHosts, "http-allowed-hosts", nil, "without --api-token, the host names (besides IP addresses and localhost) the monitor answers to, comma-separated (env RELAY_HTTP_ALLOWED_HOSTS)")
	f.Var(cliflag.PositiveDuration(&cfg.SessionTTL, relay.DefaultSessionTTL), "session-ttl", "how long a login to the monitor's page lasts (env RELAY_SESSION_TTL)")
	f.BoolVar(&cfg.SecureCookies, "http-secure-cookies", false, "mark the page's session cookie Secure: a TLS-terminating proxy is in front (env RELAY_HTTP_SECURE_COOKIES)")
	f.StringVar(&cfg.Sagas, "sagas", "", "directory of declared saga definitions (*.yaml), loaded and checked before anything starts; SIGHUP reloads it (env RELAY_SAGAS)")
	f.StringSliceVar(&cfg.HTTPEgressAllow, "http-egress-allow", nil, "host names, IP addresses and CIDR networks a declared http step may call when its URL's host comes from an expression; repeat or comma-separate (env RELAY_HTTP_EGRESS_ALLOW); see docs/security.md, Outbound calls")
	f.StringVar(&cfg.Sinks, "sinks", "", "YAML file of sinks (NATS, Kafka, webhooks) to relay outbox events to; see docs/sinks.md (env RELAY_SINKS)")
	f.Var(cliflag.PositiveDuration(&stopTimeout, 30*time.Second), "stop-timeout", "how long a graceful stop may take (env RELAY_STOP_TIMEOUT)")
	f.BoolVar(&withExamples, "with-examples", false, "also run the example saga (research briefs), whose tables relay migrate --with-examples created (exit 2 when they are missing); without it only the sagas given run (--sagas, or an embedding application's Go sagas) (env RELAY_WITH_EXAMPLES)")
	return cmd
}

// runRelay builds the relay with this binary's sagas and runs it until a
// signal (ctx) or a fatal stream error. A second signal during the graceful
// stop exits at once.
func runRelay(ctx context.Context, cfg relay.Config, stopTimeout time.Duration, withExamples bool) error {
	log := cfg.Logger
	if err := relay.WaitForPrimary(ctx, cfg.DatabaseURL, log); err != nil {
		return exitError{code: 2, msg: err.Error()}
	}
	reg, err := runRegistry(ctx, cfg.DatabaseURL, withExamples)
	if err != nil {
		return exitError{code: 2, msg: err.Error()}
	}
	cfg.Registry = reg
	r, err := relay.New(ctx, cfg)
	if err != nil {
		var ps declare.Problems
		if errors.As(err, &ps) {
			// One problem per line, every one of them: the SRE fixes them
			// all in one go.
			return problemsExit(os.Stderr, ps)
		}
		var pe *relay.PrivilegeError
		if errors.As(err, &pe) && len(pe.Missing) == 1 {
			return exitError{code: 2, msg: pe.Missing[0]}
		}
		if errors.As(err, &pe) {
			// Every missing privilege on its own line, with its GRANT.
			for _, m := range pe.Missing {
				fmt.Fprintln(os.Stderr, "relay: "+m)
			}
			return exitError{code: 2, msg: fmt.Sprintf("role %q lacks %d privilege(s) relay run needs; nothing was started", pe.Role, len(pe.Missing))}
		}
		return exitError{code: 2, msg: err.Error()}
	}
	if err := r.Start(ctx); err != nil {
		return exitError{code: 2, msg: err.Error()}
	}
	var streamErr error
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
wait:
	for {
		select {
		case <-hup:
			reloadSagas(ctx, r, cfg)
		case <-ctx.Done():
			log.Info("stopping: signal received; a second signal stops at once")
			break wait
		case <-r.Done():
			streamErr = r.Err()
			if streamErr != nil {
				log.Error("replication stream stopped", "err", streamErr)
			}
			break wait
		}
	}
	hard := make(chan os.Signal, 1)
	signal.Notify(hard, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(hard)
	stopCtx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	go func() {
		select {
		case <-hard:
			log.Warn("second signal: stopping at once")
			cancel()
		case <-stopCtx.Done():
		}
	}()
	stopErr := r.Stop(stopCtx)
	if streamErr != nil {
		// Stop reports the same error again: say it once.
		return exitError{code: 1, msg: streamErr.Error()}
	}
	if stopErr != nil {
		return fmt.Errorf("stop: %w", stopErr)
	}
	log.Info("relay stopped")
	return nil
}

// runRegistry is the set of compiled-in sagas `relay run` runs: none, or
// with --with-examples the example saga, whose tables must exist.
func runRegistry(ctx context.Context, dsn string, withExamples bool) (*saga.Registry, error) {
	if !withExamples {
		return newRegistry(false)
	}
	conn, err := dbconn.Connect(ctx, dsn)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	present, err := examplesPresent(ctx, conn)
	if err != nil {
		return nil, err
	}
	if !present {
		return nil, fmt.Errorf("--with-examples: the example tables (research_briefs) do not exist in this database; create them with `relay migrate --with-examples`")
	}
	return newRegistry(true)
}

// reloadSagas re-reads --sagas on SIGHUP: a fully valid set replaces the old
// one at once; otherwise every problem is logged, one per line, and the old
// set keeps running.
func reloadSagas(ctx context.Context, r *relay.Relay, cfg relay.Config) {
	log := cfg.Logger
	if cfg.Sagas == "" {
		log.Info("SIGHUP: no --sagas directory to reload")
		return
	}
	next, err := r.ReloadSagas(ctx)
	if err != nil {
		var ps declare.Problems
		if errors.As(err, &ps) {
			for _, p := range ps {
				log.Error("saga reload refused: "+p.String(), "file", p.File)
			}
		} else {
			log.Error("saga reload refused", "err", err)
		}
		log.Warn("saga reload refused: the previous set keeps running", "sagas", len(next))
		return
	}
	for _, s := range next {
		log.Info("declared saga loaded", "saga", s.Name, "version", s.Version, "file", s.File, "hash", s.Hash[:12])
	}
	log.Info("saga reload done", "sagas", len(next))
}

// maxTenantWeight is the largest weight a tenant may be given (the
// journal's bound).
const maxTenantWeight = 1000

// parseTenantWeight reads one --tenant-weight TENANT_ID=N.
func parseTenantWeight(id, n string) (uuid.UUID, int, bool) {
	t, err := uuid.Parse(strings.TrimSpace(id))
	if err != nil {
		return uuid.Nil, 0, false
	}
	w, err := strconv.Atoi(strings.TrimSpace(n))
	if err != nil || w < 1 || w > maxTenantWeight {
		return uuid.Nil, 0, false
	}
	return t, w, true
}
