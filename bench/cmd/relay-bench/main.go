// Command relay-bench measures the relay side by side with PostgreSQL's own
// ceilings (pg_recvlogical, pgbench) and, with --peers, DBOS Transact and
// River: the figures of BENCHMARKS.md. It is a binary of its own, in a module
// of its own, so that the relay links none of the laboratory it needs (a
// throwaway PostgreSQL in a container, NATS and Kafka test servers).
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/compensa/compensa/bench"
)

// exitError carries an exit status: 2 for a wrong command line, 1 for a run
// that failed.
type exitError struct {
	code int
	msg  string
}

func (e exitError) Error() string { return e.msg }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRootCmd().ExecuteContext(ctx)
	stop()
	if err == nil {
		return
	}
	fmt.Fprintln(os.Stderr, "relay-bench:", err)
	var ee exitError
	if errors.As(err, &ee) {
		os.Exit(ee.code)
	}
	os.Exit(2)
}

func newRootCmd() *cobra.Command {
	var (
		databaseURL      string
		quick, asJSON    bool
		reportFile       string
		only, cpuprofile string
		peers            string
		soak             struct {
			sagas, rate int
			retention   time.Duration
			plot        string
		}
	)
	cmd := &cobra.Command{
		Use:   "relay-bench",
		Short: "Measure the relay side by side with PostgreSQL's own ceilings (pg_recvlogical, pgbench)",
		Long: "Runs the benchmarks of BENCHMARKS.md: stream throughput against pg_recvlogical, latency\n" +
			"under a fixed rate, step throughput against pgbench, resources and the cost curve. The\n" +
			"relay's figures are reported as ratios to PostgreSQL's, measured in the same run on the\n" +
			"same database. Without --database-url (or RELAY_DATABASE_URL) it starts a throwaway\n" +
			"PostgreSQL; with it, it works in a database of its own (compensa_bench_<pid>) created\n" +
			"there and dropped at the end. With --json the last line printed is one JSON object with\n" +
			"the headline figures.",
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		PreRunE: func(*cobra.Command, []string) error {
			return checkOnly(only)
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			exe, err := os.Executable()
			if err != nil {
				return err
			}
			cfg := bench.Config{
				DatabaseURL:  databaseURL,
				Quick:        quick,
				Only:         only,
				Out:          cmd.OutOrStdout(),
				Progress:     cmd.ErrOrStderr(),
				Logger:       newLogger("warn"),
				ChildCommand: []string{exe, "consume"},
				CPUProfile:   cpuprofile,
				Peers:        peers,
				SoakSagas:    soak.sagas, SoakRate: soak.rate, SoakRetention: soak.retention, SoakPlot: soak.plot,
			}
			report, err := bench.Run(cmd.Context(), cfg)
			if err != nil {
				return exitError{code: 1, msg: err.Error()}
			}
			report.WriteTable(cmd.OutOrStdout())
			if reportFile != "" {
				if err := report.WriteFile(reportFile); err != nil {
					return exitError{code: 1, msg: err.Error()}
				}
			}
			if asJSON {
				if err := report.WriteJSON(cmd.OutOrStdout()); err != nil {
					return exitError{code: 1, msg: err.Error()}
				}
			}
			if len(report.Errors) > 0 {
				return exitError{code: 1, msg: fmt.Sprintf("%d scenario(s) failed: %s", len(report.Errors), report.Errors[0])}
			}
			return nil
		},
	}
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return exitError{code: 2, msg: err.Error()} })
	f := cmd.Flags()
	f.StringVar(&databaseURL, "database-url", os.Getenv("RELAY_DATABASE_URL"), "PostgreSQL to measure on, in a database of its own (env RELAY_DATABASE_URL; default: a throwaway server)")
	f.BoolVar(&quick, "quick", false, "small sizes: a smoke test that finishes in well under two minutes")
	f.BoolVar(&asJSON, "json", false, "print the headline figures as one JSON object on the last line")
	f.StringVar(&only, "only", "", "run these scenarios only, comma-separated: "+strings.Join(bench.Scenarios, ", ")+"; "+strings.Join(bench.OptInScenarios, " and ")+" run only when named")
	f.IntVar(&soak.sagas, "soak-sagas", 0, "sagas per soak run (default 1,000,000; 20,000 with --quick)")
	f.IntVar(&soak.rate, "soak-rate", 0, "the soak's rate in sagas/s (default: 75 % of the sustainable rate, measured first)")
	f.DurationVar(&soak.retention, "soak-retention", 0, "the soak's --saga-retention (default 2m; 10s with --quick); the outbox keeps half of it")
	f.StringVar(&soak.plot, "soak-plot", "soak.svg", "where the soak scenarios write their plot (SVG); their series go beside it (.json)")
	f.StringVar(&peers, "peers", "", "the bench/peers binary (make bench-peers builds bin/peers): run DBOS Transact and River between the step runs")
	f.StringVar(&reportFile, "report", "", "also write the whole report (every pass with its load average, the anchors, the summary) as JSON to this file, e.g. bench/results/DATE.json")
	f.StringVar(&cpuprofile, "cpuprofile", "", "write a CPU profile of the run to this file (child relays write FILE.consume-N)")
	cmd.AddCommand(newConsumeCmd())
	return cmd
}

// checkOnly refuses a scenario name the bench does not know, naming the
// ones it does.
func checkOnly(only string) error {
	if only == "" {
		return nil
	}
	words := append(slices.Clone(bench.Scenarios), bench.OptInScenarios...)
	for _, name := range strings.Split(only, ",") {
		if !slices.Contains(words, strings.TrimSpace(name)) {
			return exitError{code: 2, msg: fmt.Sprintf("invalid argument %q for \"--only\" flag: unknown scenario %q; want one or more of %s, comma-separated",
				only, strings.TrimSpace(name), strings.Join(words, ", "))}
		}
	}
	return nil
}

// newConsumeCmd is the child side of the resources scenario: the relay's
// stream and correlator on a slot the parent prepared, in a process of their
// own so that its peak RSS and CPU time are the relay's alone. The database
// URL comes through RELAY_DATABASE_URL, never the command line.
func newConsumeCmd() *cobra.Command {
	var (
		cfg      bench.ConsumeConfig
		logLevel string
	)
	cmd := &cobra.Command{
		Use:    "consume",
		Short:  "Internal: consume a prepared slot with stream + correlator and print the result",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg.DatabaseURL = os.Getenv("RELAY_DATABASE_URL")
			if cfg.DatabaseURL == "" {
				return exitError{code: 2, msg: "consume: RELAY_DATABASE_URL is not set"}
			}
			cfg.Logger = newLogger(logLevel)
			return bench.Consume(cmd.Context(), cfg, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Slot, "slot", "", "the replication slot the parent prepared")
	f.StringVar(&cfg.Publication, "publication", "", "the publication the slot streams")
	f.StringVar(&logLevel, "log-level", "warn", "debug, info, warn or error")
	f.IntVar(&cfg.Events, "events", 0, "stop once this many events are committed")
	f.DurationVar(&cfg.Timeout, "timeout", 15*time.Minute, "give up after this long")
	f.StringVar(&cfg.CPUProfile, "cpuprofile", "", "write a CPU profile to this file")
	return cmd
}

func newLogger(level string) *slog.Logger {
	var l slog.Level
	_ = l.UnmarshalText([]byte(level))
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l}))
}
