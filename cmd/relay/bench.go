package main

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/compensa/compensa/internal/bench"
)

func init() { registerCommand(newBenchCmd) }

func newBenchCmd(opts *rootOptions) *cobra.Command {
	var (
		quick, asJSON    bool
		only, cpuprofile string
		peers            string
		soak             struct {
			sagas, rate int
			retention   time.Duration
			plot        string
		}
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure the relay side by side with PostgreSQL's own ceilings (pg_recvlogical, pgbench)",
		Long: "Runs the benchmarks of BENCHMARKS.md: stream throughput against pg_recvlogical, latency\n" +
			"under a fixed rate, step throughput against pgbench, resources and the cost curve. The\n" +
			"relay's figures are reported as ratios to PostgreSQL's, measured in the same run on the\n" +
			"same database. Without --database-url it starts a throwaway PostgreSQL; with it, it works\n" +
			"in a database of its own (compensa_bench_<pid>) created there and dropped at the end.\n" +
			"With --json the last line printed is one JSON object with the headline figures.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			exe, err := os.Executable()
			if err != nil {
				return err
			}
			cfg := bench.Config{
				DatabaseURL:  opts.DatabaseURL,
				Quick:        quick,
				Only:         only,
				Out:          cmd.OutOrStdout(),
				Progress:     cmd.ErrOrStderr(),
				Logger:       newLogger(&rootOptions{logLevel: "warn", DatabaseURL: opts.DatabaseURL}),
				ChildCommand: []string{exe, "bench", "consume"},
				CPUProfile:   cpuprofile,
				Peers:        peers,
				SoakSagas:    soak.sagas, SoakRate: soak.rate, SoakRetention: soak.retention, SoakPlot: soak.plot,
			}
			report, err := bench.Run(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			report.WriteTable(cmd.OutOrStdout())
			if asJSON {
				if err := report.WriteJSON(cmd.OutOrStdout()); err != nil {
					return err
				}
			}
			if len(report.Errors) > 0 {
				return exitError{code: 1, msg: fmt.Sprintf("%d scenario(s) failed: %s", len(report.Errors), report.Errors[0])}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVar(&quick, "quick", false, "small sizes: a smoke test that finishes in well under two minutes")
	f.BoolVar(&asJSON, "json", false, "print the headline figures as one JSON object on the last line")
	f.StringVar(&only, "only", "", "run these scenarios only, comma-separated: stream, sinks, sinklatency, latency, steps, capacity, declared, claim, curve; soak and soak-noretention run only when named")
	f.IntVar(&soak.sagas, "soak-sagas", 0, "sagas per soak run (default 1,000,000; 20,000 with --quick)")
	f.IntVar(&soak.rate, "soak-rate", 0, "the soak's rate in sagas/s (default: 75 % of the sustainable rate, measured first)")
	f.DurationVar(&soak.retention, "soak-retention", 0, "the soak's --saga-retention (default 2m; 10s with --quick); the outbox keeps half of it")
	f.StringVar(&soak.plot, "soak-plot", "soak.svg", "where the soak scenarios write their plot (SVG); their series go beside it (.json)")
	f.StringVar(&peers, "peers", "", "the bench/peers binary (make bench-peers builds bin/peers): run DBOS Transact and River between the step runs")
	f.StringVar(&cpuprofile, "cpuprofile", "", "write a CPU profile of the run to this file (child relays write FILE.consume-N)")
	cmd.AddCommand(newBenchConsumeCmd(opts))
	return cmd
}

// newBenchConsumeCmd is the child side of the resources scenario: the relay's
// stream and correlator on a slot the parent prepared, in a process of their
// own so that its peak RSS and CPU time are the relay's alone.
func newBenchConsumeCmd(opts *rootOptions) *cobra.Command {
	var cfg bench.ConsumeConfig
	cmd := &cobra.Command{
		Use:    "consume",
		Short:  "Internal: consume a prepared slot with stream + correlator and print the result (used by relay bench)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dsn, err := opts.requireDatabase()
			if err != nil {
				return exitError{code: 2, msg: err.Error()}
			}
			cfg.DatabaseURL, cfg.Slot, cfg.Publication = dsn, opts.Slot, opts.Publication
			cfg.Logger = newLogger(opts)
			return bench.Consume(cmd.Context(), cfg, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.Events, "events", 0, "stop once this many events are committed")
	f.DurationVar(&cfg.Timeout, "timeout", 15*time.Minute, "give up after this long")
	f.StringVar(&cfg.CPUProfile, "cpuprofile", "", "write a CPU profile to this file")
	return cmd
}
