//go:build chaos

package chaos

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/testkit"
)

var (
	// quick is the short run make test makes (fewer faults, lower rates,
	// seconds of fuzzing); RELAY_TEST_HEAVY=1 (make chaos) runs it in full.
	quick     = !testkit.Heavy()
	only      = flag.String("chaos.only", "", "comma-separated scenarios to run (selftest, kill, pause, dbfaults, slot, badinput, monitorload, fuzz, hygiene); empty runs all")
	fuzzTime  = flag.Duration("chaos.fuzztime", 0, "how long each fuzz target runs (default 20s with RELAY_TEST_HEAVY=1, else 3s)")
	outDir    = flag.String("chaos.out", "", "folder for relay logs and fuzz crashers of failed checks (default a temporary folder)")
	backlogTx = flag.Int("chaos.backlog", 0, "transactions per backlog of the bad-input throughput measure (default 3000 with RELAY_TEST_HEAVY=1, else 1000)")
	seedFlag  = flag.Int64("chaos.seed", 0, "seed of the fault schedule (default: the clock); printed so that a run can be repeated")
)

func TestMain(m *testing.M) {
	code := pgtest.Main(m)
	removeRelayBinary()
	os.Exit(code)
}

// scenario is one fault scenario: it runs under its own subtest and writes
// its figures and checks into a report.
type scenario struct {
	name  string
	title string
	run   func(t *testing.T, r *report)
}

var scenarios = []scenario{
	{"selftest", "the checkers report planted faults", scenarioSelfTest},
	{"kill", "relay killed (SIGKILL at random moments and right after a correlator commit)", scenarioKill},
	{"pause", "paused workers (SIGSTOP past the lease, SIGCONT)", scenarioPause},
	{"dbfaults", "database faults (restart -m immediate, walsender terminated)", scenarioDBFaults},
	{"slot", "slot lost (dropped, invalidated by max_slot_wal_keep_size)", scenarioSlot},
	{"badinput", "bad input through the relay (malformed JSON, invalid UTF-8, NUL, 10 MB, hostile identifiers, 100,000-row transaction)", scenarioBadInput},
	{"monitorload", "monitoring under load (100 clients scraping and listing while sagas run)", scenarioMonitorLoad},
	{"fuzz", "fuzz targets (pgoutput decoding, payload planning, identifiers, API parameters)", scenarioFuzz},
	{"hygiene", "hygiene (goleak in every test package's TestMain)", scenarioHygiene},
}

// TestChaos runs the selected scenarios one after the other: they share a
// small machine, and a scenario's figures must not include another's load.
func TestChaos(t *testing.T) {
	want := map[string]bool{}
	for _, s := range strings.Split(*only, ",") {
		if s = strings.TrimSpace(s); s != "" {
			want[s] = true
		}
	}
	for s := range want {
		found := false
		for _, sc := range scenarios {
			found = found || sc.name == s
		}
		if !found {
			t.Fatalf("-chaos.only: unknown scenario %q", s)
		}
	}
	mode := "full"
	if quick {
		mode = "quick"
	}
	fmt.Printf("\nchaos: %s run, seed %d, %d CPUs, load %s\n", mode, seed(), runtime.NumCPU(), loadAverage())
	var reports []*report
	began := time.Now()
	for _, sc := range scenarios {
		if len(want) > 0 && !want[sc.name] {
			continue
		}
		r := newReport(sc.name, sc.title)
		reports = append(reports, r)
		t.Run(sc.name, func(t *testing.T) {
			r.t = t
			defer func() { r.took = time.Since(r.began); r.print() }()
			sc.run(t, r)
		})
	}
	fmt.Printf("\n=== chaos summary (%s run, %s, seed %d)\n", mode, time.Since(began).Round(time.Second), seed())
	for _, r := range reports {
		fmt.Printf("  %-9s %-4s %s  %s\n", r.name, r.verdict(), r.took.Round(time.Second), r.headline())
	}
}

var (
	seedOnce sync.Once
	seedVal  int64
)

func seed() int64 {
	seedOnce.Do(func() {
		seedVal = *seedFlag
		if seedVal == 0 {
			seedVal = time.Now().UnixNano() % 1_000_000_007
		}
	})
	return seedVal
}

func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// report collects a scenario's figures and checks, printed when it ends.
type report struct {
	t      *testing.T
	name   string
	title  string
	began  time.Time
	took   time.Duration
	mu     sync.Mutex
	lines  []string
	checks []check
	head   string
}

type check struct {
	what string
	ok   bool
	got  string
}

func newReport(name, title string) *report {
	return &report{name: name, title: title, began: time.Now()}
}

// figure records a measured number, with its unit or explanation.
func (r *report) figure(key, format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lines = append(r.lines, fmt.Sprintf("  %-34s %s", key, fmt.Sprintf(format, args...)))
}

// expect records a promise and fails the scenario when it does not hold.
func (r *report) expect(ok bool, what string, format string, args ...any) {
	r.t.Helper()
	got := fmt.Sprintf(format, args...)
	r.mu.Lock()
	r.checks = append(r.checks, check{what: what, ok: ok, got: got})
	r.mu.Unlock()
	if !ok {
		r.t.Errorf("%s: %s (got %s)", r.name, what, got)
	}
}

// headline is the one-line summary of the scenario for the final table.
func (r *report) headline() string { return r.head }

func (r *report) verdict() string {
	if r.t != nil && r.t.Failed() {
		return "FAIL"
	}
	return "ok"
}

func (r *report) print() {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "\n=== chaos: %s — %s (%s)\n", r.name, r.title, r.took.Round(100*time.Millisecond))
	for _, l := range r.lines {
		b.WriteString(l + "\n")
	}
	for _, c := range r.checks {
		mark := "ok  "
		if !c.ok {
			mark = "FAIL"
		}
		fmt.Fprintf(&b, "  %s %-52s %s\n", mark, c.what, c.got)
	}
	fmt.Print(b.String())
}

// keepLog writes a process's output to the output folder when a check
// failed, and says where.
func (r *report) keepLog(name, output string) {
	if r.t == nil || !r.t.Failed() && os.Getenv("CHAOS_DEBUG") == "" {
		return
	}
	dir := outputDir()
	p := filepath.Join(dir, r.name+"-"+name+".log")
	if err := os.WriteFile(p, []byte(output), 0o644); err == nil {
		r.figure("log kept", "%s", p)
	}
}

var (
	outOnce sync.Once
	outPath string
)

func outputDir() string {
	outOnce.Do(func() {
		outPath = *outDir
		if outPath == "" {
			outPath, _ = os.MkdirTemp("", "compensa-chaos-")
		}
		os.MkdirAll(outPath, 0o755)
	})
	return outPath
}

// pick returns full with RELAY_TEST_HEAVY=1, else quick.
func pick[T any](full, quickV T) T {
	if quick {
		return quickV
	}
	return full
}
