package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/compensa/compensa/internal/pgcluster"
)

// Config configures a run. The zero value runs every scenario at full size
// on a throwaway PostgreSQL.
type Config struct {
	// DatabaseURL is the server to measure on; the bench creates a
	// database of its own there and drops it at the end. Empty starts a
	// throwaway cluster with durable commits (fsync and synchronous_commit
	// on).
	DatabaseURL string
	// Quick runs every scenario at a small size (a smoke test, well under
	// two minutes).
	Quick bool
	// Only runs the scenarios named, comma-separated (see Scenarios and
	// OptInScenarios); empty runs every one of Scenarios.
	Only string
	// Out receives the results table; Progress receives one line per step
	// of the run. Nil discards.
	Out, Progress io.Writer
	// Logger receives the relay components' logs (default: discarded).
	Logger *slog.Logger
	// ChildCommand, when set, is the argv prefix that runs the relay's
	// consumer in a child process (`relay-bench consume`), so that the
	// resources scenario measures the relay's memory and CPU alone. Nil
	// measures in this process and says so.
	ChildCommand []string
	// CPUProfile, when set, writes a CPU profile of the run there (and of
	// each child consumer next to it, suffixed with the event count).
	CPUProfile string
	// Peers, when set, is the bench/peers binary (`make bench-peers` builds
	// bin/peers): the step scenario runs it after each of its runs, on the
	// same server, for DBOS Transact's and River's steps/s.
	Peers string

	// The soak scenarios (OptInScenarios): how many sagas each run
	// (default 1,000,000; 20,000 with Quick), at what rate (sagas/s;
	// 0: 75 % of the sustainable rate, measured first), with what
	// --saga-retention (default 2m; 10s with Quick), and where the plot
	// goes (default soak.svg; the series go beside it, .json).
	SoakSagas     int
	SoakRate      int
	SoakRetention time.Duration
	SoakPlot      string
}

// Scenarios are the names --only accepts, in the order a full run runs them.
var Scenarios = []string{"stream", "sinks", "sinklatency", "latency", "steps", "capacity", "declared", "claim", "curve"}

// OptInScenarios run only when --only names them, after the others: each
// holds a rate for many minutes.
var OptInScenarios = []string{"soak", "soak-noretention"}

// sizes are a mode's workload sizes.
type sizes struct {
	// streamEvents is a stream pass's size at one row per transaction;
	// batchedStreamEvents at many, which decode several times faster: a
	// pass of either lasts about ten seconds.
	streamEvents, batchedStreamEvents int
	streamShapes                      []int // rows per source transaction
	// repeats is how many times each stream consumer, and the step
	// scenario's runner/pgbench pair, is measured, interleaved; figures are
	// medians and ratios the median of the paired ratios, so that a load
	// spike on a shared machine does not decide the result.
	repeats         int
	latencyRates    []int // events per second
	latencyDuration time.Duration
	// latencyLong is how long the first (1,000 events/s) rate runs: the
	// 60 s run of the targets; the other rates run latencyDuration.
	latencyLong time.Duration
	// overloadDuration is how long the overload case's producer runs, at
	// twice the saga rate the capacity scenario found sustainable.
	overloadDuration time.Duration
	// The capacity scenario's ramp (see findCapacity): the first rate
	// (sagas/s), the factor between rates until one is not sustained, the
	// bracket (a share of the sustained rate) at which the bisection stops,
	// the most rates held, how often a rate not sustained is held again
	// before it counts, and how long each is held; then how long each share
	// of the sustainable rate is held.
	capacityStart     int
	capacityGrowth    float64
	capacityPrecision float64
	capacityMaxSteps  int
	capacityRetries   int
	capacityStep      time.Duration
	capacityLevel     time.Duration
	// claimSizes are the due backlogs the claim scenario measures at.
	claimSizes []int
	// stepSagas is the size of a steps pass: long enough (about 20 s
	// here) that a pause of the machine moves its figure by little.
	// peerSagas is the peers' (runs of a few thousand steps a second take
	// as long with half as many).
	stepSagas, peerSagas int
	curve                []int
	curveRowsPerTx       int
	timeout              time.Duration // per measured phase
}

func sizesFor(quick bool) sizes {
	if quick {
		return sizes{
			streamEvents: 5000, batchedStreamEvents: 5000, streamShapes: []int{1, 100}, repeats: 1,
			latencyRates: []int{1000, 5000}, latencyDuration: time.Second, latencyLong: time.Second,
			overloadDuration: 2 * time.Second, claimSizes: []int{1000, 20000},
			capacityStart: 200, capacityGrowth: 2, capacityPrecision: 0.5, capacityMaxSteps: 5,
			capacityStep: 1200 * time.Millisecond, capacityLevel: 2 * time.Second,
			stepSagas: 1000, peerSagas: 1000, curve: []int{10000}, curveRowsPerTx: curveRowsPerTx,
			timeout: 90 * time.Second,
		}
	}
	return sizes{
		streamEvents: 200000, batchedStreamEvents: 600000, streamShapes: []int{1, 100}, repeats: 5,
		latencyRates: []int{1000, 5000}, latencyDuration: 30 * time.Second, latencyLong: 60 * time.Second,
		overloadDuration: 30 * time.Second, claimSizes: []int{1000, 1000000},
		capacityStart: 200, capacityGrowth: 1.5, capacityPrecision: 0.1, capacityMaxSteps: 16, capacityRetries: 1,
		capacityStep: 5 * time.Second, capacityLevel: 60 * time.Second,
		stepSagas: 40000, peerSagas: 20000, curve: []int{10000, 100000, 1000000}, curveRowsPerTx: curveRowsPerTx,
		timeout: 15 * time.Minute,
	}
}

// curveRowsPerTx is the cost curve's source transaction size: see
// BENCHMARKS.md for why.
const curveRowsPerTx = 10

// run is one bench run in progress.
type run struct {
	cfg    Config
	sz     sizes
	env    *env
	report *Report
	log    *slog.Logger
}

func (r *run) progress(format string, args ...any) {
	if r.cfg.Progress == nil {
		return
	}
	fmt.Fprintf(r.cfg.Progress, "%s  %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// Run runs the chosen scenarios and returns the report. A scenario that
// fails is recorded in Report.Errors and the others still run; Run returns
// an error only when nothing could be measured (no database) or ctx ended.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	only := map[string]bool{}
	if cfg.Only != "" {
		for _, name := range strings.Split(cfg.Only, ",") {
			name = strings.TrimSpace(name)
			if !slices.Contains(Scenarios, name) && !slices.Contains(OptInScenarios, name) {
				return nil, fmt.Errorf("bench: unknown scenario %q for --only: choose among %s", name, strings.Join(append(slices.Clone(Scenarios), OptInScenarios...), ", "))
			}
			only[name] = true
		}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	r := &run{cfg: cfg, sz: sizesFor(cfg.Quick), log: cfg.Logger}
	r.report = &Report{Quick: cfg.Quick, Only: cfg.Only, Started: time.Now().UTC()}
	if cfg.CPUProfile != "" {
		f, err := os.Create(cfg.CPUProfile)
		if err != nil {
			return nil, fmt.Errorf("bench: --cpuprofile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return nil, fmt.Errorf("bench: --cpuprofile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	r.report.Machine = describeMachine()
	env, err := openEnv(ctx, cfg.DatabaseURL, r.progress)
	if err != nil {
		return nil, err
	}
	defer env.close()
	r.env = env
	r.report.Machine.PostgreSQL = env.pgVersion
	r.report.Machine.Durable = env.durable
	switch {
	case env.cluster != nil && env.cluster.Kind == pgcluster.KindExternal:
		r.report.Machine.Server = "the server " + pgcluster.EnvURL + " names"
	case env.cluster != nil:
		r.report.Machine.Server = fmt.Sprintf("throwaway %s cluster (relay-bench without --database-url)", env.cluster.Kind)
	default:
		r.report.Machine.Server = "given by --database-url"
	}
	if !env.durable {
		r.report.Notes = append(r.report.Notes, "the server does not wait for WAL flushes (fsync or synchronous_commit off): every commit is cheaper than in production")
	}
	scenarios := map[string]func(context.Context) error{
		"stream":      r.streamScenario,
		"sinks":       r.sinksScenario,
		"sinklatency": r.sinkLatencyScenario,
		"latency":     r.latencyScenario,
		"steps":       r.stepsScenario,
		"capacity":    r.capacityScenario,
		"declared":    r.declaredScenario,
		"claim":       r.claimScenario,
		"curve":       r.curveScenario,

		"soak":             r.soakScenario,
		"soak-noretention": r.soakNoRetentionScenario,
	}
	for _, name := range append(slices.Clone(Scenarios), OptInScenarios...) {
		if len(only) > 0 && !only[name] || len(only) == 0 && slices.Contains(OptInScenarios, name) {
			continue
		}
		load := loadAverage()
		r.progress("%s: starting (load average %.2f)", name, load)
		r.report.LoadAverage = append(r.report.LoadAverage, ScenarioLoad{Scenario: name, Before: load})
		began := time.Now()
		err := scenarios[name](ctx)
		r.report.LoadAverage[len(r.report.LoadAverage)-1].After = loadAverage()
		if ctx.Err() != nil {
			return r.report, ctx.Err()
		}
		if err != nil {
			r.progress("%s: FAILED: %v", name, err)
			r.report.Errors = append(r.report.Errors, fmt.Sprintf("%s: %v", name, err))
			continue
		}
		r.progress("%s: done in %s", name, time.Since(began).Round(100*time.Millisecond))
	}
	r.report.Finished = time.Now().UTC()
	r.report.Machine.LoadAtEnd = loadAverage()
	return r.report, nil
}

// ErrScenariosFailed is returned (wrapped) by callers that want a non-zero
// exit when a scenario failed.
var ErrScenariosFailed = errors.New("bench: some scenarios failed")

func describeMachine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), GoVersion: runtime.Version(), OS: runtime.GOOS + "/" + runtime.GOARCH, LoadAtStart: loadAverage()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	m.MemoryMB = procStatusBytes("/proc/meminfo", "MemTotal:") >> 20
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	return m
}
