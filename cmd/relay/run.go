package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/compensa/compensa/saga/declare"
)

func init() { registerCommand(newRunCmd) }

func newRunCmd(opts *rootOptions) *cobra.Command {
	var (
		cfg         appConfig
		stopTimeout time.Duration
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
			cfg.Logger = newLogger(opts)
			return runRelay(cmd.Context(), cfg, stopTimeout)
		},
	}
	f := cmd.Flags()
	f.BoolVar(&cfg.NoStream, "no-stream", false, "run only the step workers, not the replication stream (env RELAY_NO_STREAM)")
	f.DurationVar(&cfg.StatusInterval, "status-interval", 10*time.Second, "how often to report the flushed position to PostgreSQL (env RELAY_STATUS_INTERVAL)")
	f.DurationVar(&cfg.HeartbeatInterval, "heartbeat-interval", 10*time.Second, "how often to emit a heartbeat so the slot advances while the outbox is idle (env RELAY_HEARTBEAT_INTERVAL)")
	f.BoolVar(&cfg.RecreateSlot, "recreate-slot", false, "re-create a missing or lost slot; MAY SKIP EVENTS written while it was gone (env RELAY_RECREATE_SLOT)")
	f.DurationVar(&cfg.Retention, "outbox-retention", 0, "delete outbox rows older than this once streamed, e.g. 24h; 0 keeps them (env RELAY_OUTBOX_RETENTION)")
	f.IntVar(&cfg.Workers, "workers", 8, "step workers in this process (env RELAY_WORKERS)")
	f.DurationVar(&cfg.LeaseDuration, "lease", 30*time.Second, "how long a worker's claim on an instance lasts without a heartbeat (env RELAY_LEASE)")
	f.DurationVar(&cfg.StuckAfter, "stuck-after", 5*time.Minute, "an instance overdue by more than this with no live lease is reported stuck (env RELAY_STUCK_AFTER)")
	f.StringVar(&cfg.APIToken, "api-token", "", "bearer token for /v1 (env RELAY_API_TOKEN); without one, mutations answer 403")
	f.StringVar(&cfg.SagasDir, "sagas", "", "directory of declared saga definitions (*.yaml), loaded and checked before anything starts (env RELAY_SAGAS)")
	f.DurationVar(&stopTimeout, "stop-timeout", 30*time.Second, "how long a graceful stop may take (env RELAY_STOP_TIMEOUT)")
	return cmd
}

// runRelay starts the relay and blocks until a signal (ctx) or a fatal stream
// error. A second signal during the graceful stop exits at once.
func runRelay(ctx context.Context, cfg appConfig, stopTimeout time.Duration) error {
	a, err := startApp(ctx, cfg)
	if err != nil {
		var ps declare.Problems
		if errors.As(err, &ps) {
			// One problem per line, every one of them: the SRE fixes them all
			// in one go.
			return problemsExit(os.Stderr, ps)
		}
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
			a.reloadSagas(ctx)
		case <-ctx.Done():
			cfg.Logger.Info("stopping: signal received; a second signal stops at once")
			break wait
		case <-a.Done():
			streamErr = a.StreamErr()
			if streamErr != nil {
				cfg.Logger.Error("replication stream stopped", "err", streamErr)
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
			cfg.Logger.Warn("second signal: stopping at once")
			cancel()
		case <-stopCtx.Done():
		}
	}()
	stopErr := a.Stop(stopCtx)
	if streamErr != nil && !errors.Is(streamErr, context.Canceled) {
		// Stop reports the same error again: say it once.
		return exitError{code: 1, msg: streamErr.Error()}
	}
	if stopErr != nil {
		return fmt.Errorf("stop: %w", stopErr)
	}
	cfg.Logger.Info("relay stopped")
	return nil
}
