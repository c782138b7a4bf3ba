package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
)

// TestRunRefusesAShortDedupeWindow: a dedupe window shorter than what a
// resync can re-read (--resync-margin plus --outbox-retention) exits 2 with
// one line, before anything connects; the floor itself, 0 (keep forever) and
// the defaults pass the check.
func TestRunRefusesAShortDedupeWindow(t *testing.T) {
	clearRelayEnv(t)
	// Nothing listens there: a check that passes fails later, connecting.
	const dsn = "postgres://relay@127.0.0.1:1/none?connect_timeout=1"
	runCLI := func(args ...string) (int, string) {
		opts := &rootOptions{}
		var stderr bytes.Buffer
		root := newRootCmd(opts)
		root.SetOut(&bytes.Buffer{})
		root.SetErr(&stderr)
		code := execute(context.Background(), root, opts, append([]string{"run", "--database-url", dsn, "--http-addr", "127.0.0.1:0"}, args...), &stderr)
		return code, stderr.String()
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--dedupe-window", "5m"}, "--dedupe-window 5m0s is shorter than --resync-margin (10m0s) plus --outbox-retention (0s)"},
		{[]string{"--dedupe-window", "2h", "--outbox-retention", "2h", "--resync-margin", "1m"}, "give --dedupe-window 2h1m0s or more"},
	} {
		code, stderr := runCLI(tc.args...)
		if code != 2 || !strings.Contains(stderr, tc.want) || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
			t.Errorf("relay run %v: exit %d, stderr %q; want 2 and one line with %q", tc.args, code, stderr, tc.want)
		}
	}
	t.Setenv("RELAY_DEDUPE_WINDOW", "1m")
	if code, stderr := runCLI(); code != 2 || !strings.Contains(stderr, "--dedupe-window 1m0s is shorter") {
		t.Errorf("RELAY_DEDUPE_WINDOW=1m: exit %d, stderr %q; want 2", code, stderr)
	}
	os.Unsetenv("RELAY_DEDUPE_WINDOW")
	for _, args := range [][]string{
		{"--dedupe-window", "2h1m", "--outbox-retention", "2h", "--resync-margin", "1m"},
		{"--dedupe-window", "0", "--saga-retention", "0"},
		{"--saga-retention", "2s", "--failed-retention", "1h"},
	} {
		// Past the checks, it fails reaching the database.
		if code, stderr := runCLI(args...); code == 0 || strings.Contains(stderr, "dedupe-window") || strings.Contains(stderr, "retention") || !strings.Contains(stderr, "127.0.0.1") {
			t.Errorf("relay run %v: exit %d, %s; want a connection error", args, code, stderr)
		}
	}
	if code, stderr := runCLI("--saga-retention", "-1s"); code != 2 || !strings.Contains(stderr, "0 to keep forever") {
		t.Errorf("--saga-retention -1s: exit %d, stderr %q; want 2", code, stderr)
	}
}
