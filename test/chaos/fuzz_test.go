//go:build chaos

package chaos

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// fuzzTargets are the fuzz targets the suite runs, each for a bounded time.
var fuzzTargets = []struct{ pkg, name string }{
	{"./cdc", "FuzzPgoutputMessages"},
	{"./correlator", "FuzzPlanAdd"},
	{"./outbox", "FuzzParseTableName"},
	{"./outbox", "FuzzParseColumnMap"},
	{"./internal/httpapi", "FuzzParseFilter"},
	{"./internal/httpapi", "FuzzPathID"},
	{"./internal/httpapi", "FuzzReadAction"},
	{"./internal/httpapi", "FuzzLoginRedirect"},
}

var fuzzStats = regexp.MustCompile(`execs: (\d+) .*new interesting: (\d+) \(total: (\d+)\)`)

// scenarioFuzz runs `go test -fuzz` on each target for -chaos.fuzztime. A
// failing input the fuzzer writes under the package's testdata is moved to
// the output folder, so that the tree stays as committed, and reported.
func scenarioFuzz(t *testing.T, r *report) {
	d := *fuzzTime
	if d == 0 {
		d = pick(20*time.Second, 3*time.Second)
	}
	root := repoRoot()
	failed := 0
	var total int64
	for _, ft := range fuzzTargets {
		dir := filepath.Join(root, ft.pkg, "testdata", "fuzz", ft.name)
		before := listDir(dir)
		began := time.Now()
		out, err := runFuzz(root, ft.pkg, ft.name, d)
		retried := ""
		if err != nil && stopRace(out, len(listDir(dir)) > len(before)) {
			// Go's fuzzing engine can report its own -fuzztime deadline as
			// a failure when a starved worker is mid-call at the end
			// (go.dev/issue/75804); it writes no input. Run the target
			// once more: a real failure fails again.
			retried = " (after one rerun: the engine's end-of-fuzztime race)"
			out, err = runFuzz(root, ft.pkg, ft.name, d)
		}
		execs, corpus := int64(0), "?"
		if m := fuzzStats.FindAllStringSubmatch(string(out), -1); len(m) > 0 {
			last := m[len(m)-1]
			execs, _ = strconv.ParseInt(last[1], 10, 64)
			corpus = fmt.Sprintf("%s new, corpus %s", last[2], last[3])
		}
		total += execs
		verdict := "ok"
		if err != nil {
			failed++
			verdict = "FAILED: " + firstFailure(string(out))
			for f := range listDir(dir) {
				if !before[f] {
					src := filepath.Join(dir, f)
					dst := filepath.Join(outputDir(), ft.name+"-"+f)
					if b, err := os.ReadFile(src); err == nil && os.WriteFile(dst, b, 0o644) == nil {
						os.Remove(src)
						verdict += " (input kept in " + dst + ")"
					}
				}
			}
		}
		r.figure(ft.name, "%d execs in %s (%s): %s%s", execs, time.Since(began).Round(time.Second), corpus, verdict, retried)
		r.expect(err == nil, ft.name+" finds nothing", "%s", clipText(verdict, 200))
	}
	r.head = fmt.Sprintf("%d targets × %s: %d execs, %d failing", len(fuzzTargets), d, total, failed)
}

// runFuzz runs one fuzz target for d. A short minimisation: the fuzzer
// otherwise spends up to a minute shrinking each new large input, time taken
// from fuzzing. The deadline leaves room for building the instrumented test
// binary first: beside make test's other suites on two cores, that build
// alone took over five minutes for cdc and correlator, and a run killed
// before it fuzzed anything reports a failure with no input.
func runFuzz(root, pkg, name string, d time.Duration) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d+15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "test", "-run", "^$", "-fuzz", "^"+name+"$", "-fuzztime", d.String(), "-fuzzminimizetime", "200x",
		"-parallel", strconv.Itoa(max(1, runtime.NumCPU()/2)), pkg)
	cmd.Dir = root
	return cmd.CombinedOutput()
}

// stopRace tells whether a failed fuzz run is the engine's end-of-fuzztime
// race: a bare "context deadline exceeded", no line of a test, no panic and
// no input written.
func stopRace(out []byte, wroteInput bool) bool {
	if wroteInput {
		return false
	}
	s := string(out)
	return strings.Contains(s, "context deadline exceeded") && !strings.Contains(s, "_test.go:") && !strings.Contains(s, "panic:")
}

func firstFailure(out string) string {
	for _, l := range strings.Split(out, "\n") {
		l = strings.TrimSpace(l)
		if strings.Contains(l, "_test.go:") || strings.HasPrefix(l, "panic:") {
			return clipText(l, 240)
		}
	}
	// No failing input: the fuzzing engine itself gave up (a worker that
	// hung or died, a deadline). Its own lines say why; the progress lines
	// before them do not.
	var why []string
	for _, l := range strings.Split(out, "\n") {
		l = strings.TrimSpace(l)
		if l != "" && !strings.HasPrefix(l, "fuzz: elapsed:") {
			why = append(why, l)
		}
	}
	if len(why) > 0 {
		return clipText(strings.Join(why, " | "), 240)
	}
	return clipText(strings.TrimSpace(out), 240)
}

func listDir(dir string) map[string]bool {
	m := map[string]bool{}
	es, _ := os.ReadDir(dir)
	for _, e := range es {
		m[e.Name()] = true
	}
	return m
}

// repoRoot is the module's root, two folders above this file.
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}
