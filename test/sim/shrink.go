package sim

import (
	"fmt"
	"strings"
)

// Shrink looks for a shorter failing run of the same seed: the fewest
// faults (MaxFaults), then the shortest faulty phase (Ticks), each by
// bisection. It is deterministic, since Run is. It returns the smallest
// failing result it found (r itself when nothing smaller fails).
func Shrink(r Result) Result {
	if !r.Failed() {
		return r
	}
	best := r
	lo, hi := 0, r.Faults
	for lo < hi {
		mid := (lo + hi) / 2
		cfg := best.Config
		cfg.MaxFaults = mid
		if got := Run(cfg); got.Failed() {
			best, hi = got, mid
		} else {
			lo = mid + 1
		}
	}
	if best.Config.MaxFaults < 0 {
		best.Config.MaxFaults = best.Faults
	}
	lo, hi = 1, best.Config.Ticks
	for lo < hi {
		mid := (lo + hi) / 2
		cfg := best.Config
		cfg.Ticks = mid
		if got := Run(cfg); got.Failed() {
			best, hi = got, mid
		} else {
			lo = mid + 1
		}
	}
	return best
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
	fmt.Fprintf(&b, "shrunk: seed=%d ticks=%d max-faults=%d (from ticks=%d, %d faults): %d violation(s)\n",
		c.Seed, c.Ticks, c.MaxFaults, orig.Config.Ticks, orig.Faults, len(shrunk.Violations))
	for _, v := range shrunk.Violations {
		fmt.Fprintf(&b, "  %s\n", v)
	}
	fmt.Fprintf(&b, "history of the shrunk run (%d lines):\n", len(shrunk.History))
	for _, l := range shrunk.History {
		fmt.Fprintf(&b, "  %s\n", l)
	}
	return b.String()
}
