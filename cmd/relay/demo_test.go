package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/compensa/compensa/internal/pgcluster"
	"github.com/compensa/compensa/test/testkit"
)

func TestFailsAtMarksExactlyFailEvenlySpread(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ n, fail int }{{200, 8}, {40, 4}, {50, 5}, {7, 0}, {7, 7}, {3, 2}, {1, 1}} {
		var at []int
		for i := range c.n {
			if failsAt(i, c.n, c.fail) {
				at = append(at, i)
			}
		}
		if len(at) != c.fail {
			t.Fatalf("n=%d fail=%d: %d marked (%v)", c.n, c.fail, len(at), at)
		}
		for k := 1; k < len(at); k++ {
			if gap := at[k] - at[k-1]; c.fail > 1 && (gap < c.n/c.fail-1 || gap > c.n/c.fail+1) {
				t.Fatalf("n=%d fail=%d: uneven spread %v", c.n, c.fail, at)
			}
		}
	}
}

func TestProgressLine(t *testing.T) {
	t.Parallel()
	got := progressLine(demoProgress{started: 40, completed: 10, compensated: 5}, 40)
	want := "[###########...................] 15/40 ended  started 40  completed 10  compensated 5  failed 0"
	if got != want {
		t.Fatalf("got  %q\nwant %q", got, want)
	}
	if full := progressLine(demoProgress{started: 2, completed: 2}, 2); !strings.HasPrefix(full, "["+strings.Repeat("#", 30)+"]") {
		t.Fatalf("full bar: %q", full)
	}
}

func TestSummaryMismatchNamesWhatDiffers(t *testing.T) {
	t.Parallel()
	d := demoOptions{briefs: 10, fail: 2}
	good := demoSummary{demoProgress: demoProgress{started: 10, completed: 8, compensated: 2}, enriched: 8, draft: 2, enrichedEvents: 8}
	if m := good.mismatch(d); m != "" {
		t.Fatalf("expected outcome reported as %q", m)
	}
	bad := good
	bad.completed, bad.failed = 7, 1
	if m := bad.mismatch(d); !strings.Contains(m, "completed 7, want 8") {
		t.Fatalf("mismatch %q", m)
	}
}

func TestDemoWithoutPostgresPrintsTheInstallHint(t *testing.T) {
	// Not parallel: it swaps the cluster seam.
	saved := startDemoCluster
	t.Cleanup(func() { startDemoCluster = saved })
	startDemoCluster = func(context.Context, pgcluster.Options) (*pgcluster.Cluster, error) {
		return nil, pgcluster.ErrNoPostgres
	}
	_, _, err := runDemoCmd(t, "demo", "--exit-when-done")
	var ee exitError
	if !errors.As(err, &ee) || ee.code == 0 || ee.msg != pgcluster.InstallHint {
		t.Fatalf("got %v, want a non-zero exit with the install hint", err)
	}
}

func TestDemoFlagsAreChecked(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"demo", "--briefs", "0"}, {"demo", "--briefs", "5", "--fail", "6"}, {"demo", "--fail", "-1"}} {
		_, _, err := runDemoCmd(t, args...)
		var ee exitError
		if !errors.As(err, &ee) || ee.code != 2 || !strings.Contains(ee.msg, "--") {
			t.Fatalf("%v: got %v, want exit 2 naming the flag", args, err)
		}
	}
}

// The demo as `make demo` runs it, in process: its own throwaway PostgreSQL,
// the relay, 40 briefs, --exit-when-done. Its summary must match the
// database, read independently before the database goes away.
func TestDemoExitsWhenDoneWithASummaryThatMatchesTheDatabase(t *testing.T) {
	testkit.SkipShort(t, "runs the whole demo")
	var checked bool
	saved := demoSummarized
	t.Cleanup(func() { demoSummarized = saved })
	demoSummarized = func(ctx context.Context, pool *pgxpool.Pool, s demoSummary) {
		checked = true
		var started, completed, compensated, enriched, draft, events, sources int
		err := pool.QueryRow(ctx, `SELECT
			(SELECT count(*) FROM saga_instances),
			(SELECT count(*) FROM saga_instances WHERE status = 'COMPLETED'),
			(SELECT count(*) FROM saga_instances WHERE status = 'COMPENSATED'),
			(SELECT count(*) FROM research_briefs WHERE status = 'ENRICHED'),
			(SELECT count(*) FROM research_briefs WHERE status = 'DRAFT' AND enrichment IS NULL
				AND NOT EXISTS (SELECT 1 FROM brief_sources s WHERE s.brief_id = research_briefs.id)),
			(SELECT count(*) FROM outbox WHERE event_type = 'research_brief.enriched'),
			(SELECT count(DISTINCT brief_id) FROM brief_sources)`).
			Scan(&started, &completed, &compensated, &enriched, &draft, &events, &sources)
		if err != nil {
			t.Errorf("read the demo database: %v", err)
			return
		}
		if started != 40 || completed != 36 || compensated != 4 || enriched != 36 || draft != 4 || events != 36 || sources != 36 {
			t.Errorf("database: started %d completed %d compensated %d enriched %d clean drafts %d events %d briefs with sources %d",
				started, completed, compensated, enriched, draft, events, sources)
		}
		if s.started != started || s.completed != completed || s.compensated != compensated || s.enriched != enriched || s.enrichedEvents != events {
			t.Errorf("summary %+v differs from the database", s)
		}
		if s.p50 <= 0 || s.p99 < s.p50 || s.p99 > time.Minute {
			t.Errorf("latencies p50 %s p99 %s", s.p50, s.p99)
		}
	}
	out, errOut, err := runDemoCmd(t, "demo", "--exit-when-done", "--briefs", "40", "--fail", "4", "--http-addr", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("demo: %v\nstdout:\n%s\nstderr:\n%s", err, out, errOut)
	}
	if !checked {
		t.Fatal("the demo never reached its summary")
	}
	for _, want := range []string{"sagas started", "completed", "compensated", "failed", "p50", "p99"} {
		if !strings.Contains(out, want) {
			t.Fatalf("summary lacks %q:\n%s", want, out)
		}
	}
	// The cluster is gone when the command returns: no instructions for it.
	for _, gone := range []string{"monitor:", "database:", "slot:", "export DB=", "relay lag", "another shell"} {
		if strings.Contains(out, gone) {
			t.Fatalf("the summary of --exit-when-done prints %q for a cluster it removed:\n%s", gone, out)
		}
	}
	// stderr is not a terminal here: plain progress lines, no carriage returns.
	if strings.Contains(errOut, "\r") || !strings.Contains(errOut, "40/40 ended") {
		t.Fatalf("progress on a non-terminal:\n%q", errOut)
	}
	t.Logf("summary:\n%s", out)
}

// runDemoCmd runs the CLI in process with the given args and returns its
// stdout, stderr and error.
func runDemoCmd(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	opts := &rootOptions{}
	root := newRootCmd(opts)
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	return out.String(), errOut.String(), err
}

// TestDemoSummaryPrintsInstructionsOnlyWhileTheClusterRuns: without
// --exit-when-done the demo keeps running and says how to reach it.
func TestDemoSummaryPrintsInstructionsOnlyWhileTheClusterRuns(t *testing.T) {
	t.Parallel()
	for _, exit := range []bool{false, true} {
		var buf bytes.Buffer
		printDemoSummary(&buf, demoSummary{}, demoOptions{exitWhenDone: exit, apiToken: "tok"}, "http://127.0.0.1:1/", "postgres://x@127.0.0.1:2/demo", "s")
		got := buf.String()
		has := strings.Contains(got, "export DB='postgres://x@127.0.0.1:2/demo'") && strings.Contains(got, "monitor:   http://127.0.0.1:1/")
		if has == exit {
			t.Errorf("exitWhenDone=%t: instructions printed=%t:\n%s", exit, has, got)
		}
	}
}

// Under `make demo` the binary is bin/relay of the checkout, which is not on
// PATH: the demo says how to put it there before it suggests `relay lag`.
func TestDemoSaysHowToPutRelayOnPath(t *testing.T) {
	t.Parallel()
	wd := t.TempDir()
	self := filepath.Join(wd, "bin", "relay")
	if got := pathHintFor(self, wd, ""); !strings.HasPrefix(got, "export PATH=$PWD/bin:$PATH") || !strings.Contains(got, "make install") {
		t.Errorf("bin/relay of the working directory: %q", got)
	}
	if got := pathHintFor("/opt/compensa/relay", wd, "/usr/bin/relay"); !strings.HasPrefix(got, "export PATH='/opt/compensa':$PATH") {
		t.Errorf("a binary elsewhere: %q", got)
	}
	if got := pathHintFor("/usr/local/bin/relay", wd, "/usr/local/bin/relay"); got != "" {
		t.Errorf("already on PATH: %q", got)
	}
	var buf bytes.Buffer
	printDemoSummary(&buf, demoSummary{}, demoOptions{apiToken: "tok"}, "http://127.0.0.1:1/", "postgres://x@127.0.0.1:2/demo", "s")
	out := buf.String()
	if i, j := strings.Index(out, "export PATH="), strings.Index(out, "relay lag"); i < 0 || j < i {
		t.Errorf("the summary does not put relay on PATH before it says relay lag:\n%s", out)
	}
}

// `make install` puts the release build where PATH finds it: $(PREFIX)/bin.
func TestMakeInstallPutsRelayInPrefixBin(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the release binary")
	}
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("no make")
	}
	prefix := t.TempDir()
	cmd := exec.Command("make", "--no-print-directory", "install", "PREFIX="+prefix)
	cmd.Dir = "../.."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make install: %v\n%s", err, out)
	}
	bin := filepath.Join(prefix, "bin", "relay")
	fi, err := os.Stat(bin)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm()&0o111 == 0 {
		t.Errorf("%s is not executable: %v", bin, fi.Mode())
	}
	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "relay ") {
		t.Errorf("%s version: %v %q", bin, err, out)
	}
}
