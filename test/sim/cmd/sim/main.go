// Command sim runs the deterministic simulation of the saga core (package
// test/sim): one seed (-seed, prints its digest), a sweep of seeds (-seeds),
// or every planted bug (-mutants). It exits 1 when an invariant breaks (or,
// with -mutants, when a planted bug is not caught).
package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/compensa/compensa/test/sim"
)

func main() {
	os.Exit(run())
}

func run() int {
	seed := flag.Uint64("seed", 0, "run this one seed and print its digest")
	seeds := flag.Int("seeds", 0, "run seeds 1..N and print a summary")
	mutants := flag.Bool("mutants", false, "plant each bug in turn and check that a seed catches it")
	mutant := flag.String("mutant", "", "plant this bug in the -seed or -seeds run")
	limit := flag.Int("limit", 300, "with -mutants, the seeds tried per bug")
	ticks := flag.Int("ticks", 0, "length of the faulty phase (0: the default)")
	scale := flag.Float64("fault-scale", 0, "multiply every fault's probability (0: 1)")
	maxFaults := flag.Int("max-faults", 0, "inject at most this many faults (0: no cap, negative: none)")
	skip := flag.String("skip", "", "comma-separated ordinals of faults not to inject (what a shrunk run prints)")
	history := flag.Bool("history", false, "with -seed, print the history")
	flag.Parse()
	base := sim.Config{Ticks: *ticks, Mutant: sim.Mutant(*mutant), FaultScale: *scale, MaxFaults: *maxFaults}
	for _, f := range strings.Split(*skip, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil {
			fmt.Fprintf(os.Stderr, "sim: -skip %q: %v\n", *skip, err)
			return 2
		}
		base.Skip = append(base.Skip, n)
	}
	began := time.Now()
	switch {
	case *mutants:
		missed := 0
		for _, m := range sim.Mutants {
			r, ok := sim.Catch(m, *limit, base)
			if !ok {
				missed++
				fmt.Printf("MISSED %s: no violation in seeds 1..%d\n", m, *limit)
				continue
			}
			fmt.Printf("caught %s seed=%d: %s\n", m, r.Config.Seed, r.Violations[0])
		}
		fmt.Printf("mutants: %d of %d caught (%s)\n", len(sim.Mutants)-missed, len(sim.Mutants), time.Since(began).Round(time.Millisecond))
		if missed > 0 {
			return 1
		}
	case *seeds > 0:
		failed, t := sim.Sweep(1, *seeds, base)
		// The first failure in full; the others by seed and first
		// violation, each replayable with -seed.
		for i, r := range failed {
			if i == 0 {
				fmt.Print(sim.Report(r, sim.Shrink(r)))
				continue
			}
			fmt.Printf("FAIL seed=%d: %s (and %d more)\n", r.Config.Seed, r.Violations[0], len(r.Violations)-1)
		}
		fmt.Printf("sweep: %d seeds, %d failed (%s); %d instances: %d completed, %d compensated, %d failed; %d events, %d effects; %d stale writes refused, %d duplicate starts refused, %d attempts held; replies: %d late or repeated, %d duplicate, %d foreign refused; %d timed-out attempts acted unrecorded (%d of them never compensated); %d steps recorded interrupted; %d compensations of steps of which nothing happened\n",
			*seeds, len(failed), time.Since(began).Round(time.Millisecond), t.Instances, t.Completed, t.Compensated, t.Failed,
			t.Events, t.Effects, t.StaleRefused, t.DuplicateStarts, t.Held, t.RepliesLate, t.RepliesDuplicate, t.RepliesForeign, t.UnrecordedActs, t.UncompensatedActs,
			t.Interrupted, t.NeedlessCompensations)
		if len(failed) > 0 {
			return 1
		}
	default:
		cfg := base
		cfg.Seed = max(*seed, 1)
		r := sim.Run(cfg)
		if *history {
			for _, l := range r.History {
				fmt.Println(l)
			}
		}
		fmt.Println(r.DigestLine())
		t := r.Stats
		fmt.Printf("%d faults, %d ticks; %d instances: %d completed, %d compensated, %d failed; %d events, %d effects; %d stale writes refused; %d timed-out attempts acted unrecorded (%d never compensated); %d steps recorded interrupted\n",
			r.Faults, t.Ticks, t.Instances, t.Completed, t.Compensated, t.Failed, t.Events, t.Effects, t.StaleRefused, t.UnrecordedActs, t.UncompensatedActs, t.Interrupted)
		if r.Failed() {
			fmt.Print(sim.Report(r, sim.Shrink(r)))
			return 1
		}
	}
	return 0
}
