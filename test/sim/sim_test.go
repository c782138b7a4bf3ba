package sim_test

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/compensa/compensa/test/sim"
	"github.com/compensa/compensa/test/testkit"
)

// The simulation runs on one goroutine and shares nothing between runs, so
// the tests may run in parallel with each other.

func TestSeedsKeepTheInvariants(t *testing.T) {
	t.Parallel()
	n := 200
	switch {
	case testing.Short():
		n = 40
	case testkit.Heavy():
		n = 5000
	}
	failed, total := sim.Sweep(1, n, sim.Config{})
	for _, r := range failed {
		t.Errorf("%s", sim.Report(r, sim.Shrink(r)))
	}
	t.Logf("%d seeds: %d instances (%d completed, %d compensated, %d failed), %d events, %d stale writes refused, %d duplicate starts refused",
		n, total.Instances, total.Completed, total.Compensated, total.Failed, total.Events, total.StaleRefused, total.DuplicateStarts)
	// A sweep that injects nothing proves nothing: the faults must have
	// reached the fences.
	if total.StaleRefused == 0 || total.DuplicateStarts == 0 || total.Compensated == 0 || total.RepliesLate == 0 || total.RepliesForeign == 0 || total.Held == 0 {
		t.Errorf("the sweep did not exercise the fences: %+v", total)
	}
}

func TestSameSeedSameDigest(t *testing.T) {
	t.Parallel()
	a, b := sim.Run(sim.Config{Seed: 7}), sim.Run(sim.Config{Seed: 7})
	if a.Digest != b.Digest {
		t.Fatalf("seed 7 gave two digests: %s and %s", a.Digest, b.Digest)
	}
	if len(a.History) != len(b.History) {
		t.Fatalf("seed 7 gave histories of %d and %d lines", len(a.History), len(b.History))
	}
	if c := sim.Run(sim.Config{Seed: 8}); c.Digest == a.Digest {
		t.Fatalf("seeds 7 and 8 gave one digest %s: the seed does not drive the run", a.Digest)
	}
	t.Log(a.DigestLine())
}

func TestEveryMutantIsCaught(t *testing.T) {
	t.Parallel()
	for _, m := range sim.Mutants {
		r, ok := sim.Catch(m, 300, sim.Config{})
		if !ok {
			t.Errorf("mutant %s: no seed in 1..300 broke an invariant", m)
			continue
		}
		t.Logf("caught %s seed=%d: %s", m, r.Config.Seed, r.Violations[0])
	}
}

func TestShrinkKeepsTheFailure(t *testing.T) {
	t.Parallel()
	r, ok := sim.Catch(sim.MutantNoLeaseFencing, 300, sim.Config{})
	if !ok {
		t.Fatal("no-lease-fencing was not caught")
	}
	s := sim.Shrink(r)
	if !s.Failed() {
		t.Fatalf("the shrunk run passes: %+v", s.Config)
	}
	if s.Config.Ticks > r.Config.Ticks || s.Faults > r.Faults {
		t.Fatalf("the shrunk run is not smaller: ticks %d faults %d, from ticks %d faults %d", s.Config.Ticks, s.Faults, r.Config.Ticks, r.Faults)
	}
	again := sim.Run(s.Config)
	if again.Digest != s.Digest {
		t.Fatalf("the shrunk configuration does not replay: %s then %s", s.Digest, again.Digest)
	}
}

// TestCorpus replays testdata/corpus: seeds that once broke an invariant
// (a bug of the simulation or of the code it runs), each line
// "seed=N [ticks=T] [max-faults=F] [skip=a,b] [mutant=M] [digest=D] [uncompensated=N] # why".
func TestCorpus(t *testing.T) {
	t.Parallel()
	f, err := os.Open("testdata/corpus")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		text, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(text)
		if len(fields) == 0 {
			continue
		}
		var cfg sim.Config
		want, uncompensated := "", -1
		for _, kv := range fields {
			k, v, _ := strings.Cut(kv, "=")
			n, _ := strconv.Atoi(v)
			switch k {
			case "seed":
				cfg.Seed = uint64(n)
			case "ticks":
				cfg.Ticks = n
			case "max-faults":
				cfg.MaxFaults = n
			case "skip":
				for _, f := range strings.Split(v, ",") {
					n, err := strconv.Atoi(f)
					if err != nil {
						t.Fatalf("corpus:%d: skip=%q: %v", line, v, err)
					}
					cfg.Skip = append(cfg.Skip, n)
				}
			case "mutant":
				cfg.Mutant = sim.Mutant(v)
			case "digest":
				want = v
			case "uncompensated":
				uncompensated = n
			default:
				t.Fatalf("corpus:%d: unknown field %q", line, k)
			}
		}
		r := sim.Run(cfg)
		// A mutant's line records a seed that catches it; the others
		// must pass.
		if cfg.Mutant != "" && !r.Failed() {
			t.Errorf("corpus:%d: mutant %s is no longer caught by seed %d", line, cfg.Mutant, cfg.Seed)
		}
		if cfg.Mutant == "" && r.Failed() {
			t.Errorf("corpus:%d:\n%s", line, sim.Report(r, sim.Shrink(r)))
		}
		if uncompensated >= 0 && r.Stats.UncompensatedActs != uncompensated {
			t.Errorf("corpus:%d: seed %d left %d acts uncompensated, want %d", line, cfg.Seed, r.Stats.UncompensatedActs, uncompensated)
		}
		if want != "" && r.Digest != want {
			t.Errorf("corpus:%d: seed %d digest %s, want %s (the history changed: update the corpus if on purpose)", line, cfg.Seed, r.Digest, want)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
}
