package sim

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Shrink looks for a shorter failing run of the same seed: the shortest
// faulty phase (Ticks, tried in sixteenths from the shortest up), then the
// fewest faults (each injected fault, in order, skipped if the run still
// fails without it). Failure is not monotone (a fault fewer changes what
// follows), so it scans rather than bisects. It is deterministic, since
// Run is, and returns the smallest failing run it found (r itself when none
// is smaller).
func Shrink(r Result) Result {
	if !r.Failed() {
		return r
	}
	best := r
	ticks := best.Config.Ticks
	for k := 1; k < 16; k++ {
		cfg := best.Config
		cfg.Ticks = max(1, ticks*k/16)
		if got := Run(cfg); got.Failed() {
			best = got
			break
		}
	}
	for _, n := range best.injected() {
		cfg := best.Config
		cfg.Skip = append(slices.Clone(cfg.Skip), n)
		if got := Run(cfg); got.Failed() {
			best = got
		}
	}
	return best
}

// injected lists the ordinals of the faults the run injected, from its
// history.
func (r Result) injected() []int {
	var out []int
	for _, l := range r.History {
		_, rest, ok := strings.Cut(l, " fault ")
		if !ok {
			continue
		}
		num, _, _ := strings.Cut(rest, ":")
		if n, err := strconv.Atoi(num); err == nil {
			out = append(out, n)
		}
	}
	return out
}

// Flags is the configuration as the sim command's flags, to replay it.
func (c Config) Flags() string {
	s := fmt.Sprintf("-seed %d -ticks %d", c.Seed, c.Ticks)
	if c.MaxFaults != 0 {
		s += fmt.Sprintf(" -max-faults %d", c.MaxFaults)
	}
	if len(c.Skip) > 0 {
		parts := make([]string, len(c.Skip))
		for i, n := range c.Skip {
			parts[i] = strconv.Itoa(n)
		}
		s += " -skip " + strings.Join(parts, ",")
	}
	if c.Mutant != "" {
		s += " -mutant " + string(c.Mutant)
	}
	if c.FaultScale != 1 && c.FaultScale != 0 {
		s += fmt.Sprintf(" -fault-scale %g", c.FaultScale)
	}
	return s
}

// Report is the text printed for a failing run: the seed and the shrunk
// configuration that replays it, the violations, and the history.
func Report(orig, shrunk Result) string {
	var b strings.Builder
	c := shrunk.Config
	fmt.Fprintf(&b, "FAIL seed=%d mutant=%q: %d violation(s)\n", orig.Config.Seed, orig.Config.Mutant, len(orig.Violations))
	for _, v := range orig.Violations {
		fmt.Fprintf(&b, "  %s\n", v)
	}
	fmt.Fprintf(&b, "shrunk: %d faults in %d ticks (from %d in %d): %d violation(s); replay with: go run ./test/sim/cmd/sim %s -history\n",
		shrunk.Faults, c.Ticks, orig.Faults, orig.Config.Ticks, len(shrunk.Violations), c.Flags())
	for _, v := range shrunk.Violations {
		fmt.Fprintf(&b, "  %s\n", v)
	}
	fmt.Fprintf(&b, "history of the shrunk run (%d lines):\n", len(shrunk.History))
	for _, l := range shrunk.History {
		fmt.Fprintf(&b, "  %s\n", l)
	}
	return b.String()
}
