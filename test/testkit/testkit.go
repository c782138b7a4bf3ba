// Package testkit holds what every test package of the repository shares and
// nothing else: the switch between the test tiers, the one polling helper,
// and what the helpers that start real servers share (RequireTool,
// HaveTool, FreePort, Shared).
//
// The tiers:
//
//   - go test -short ./... (make test-short) is the quick tier: it needs only
//     PostgreSQL's server binaries and skips what needs more (PostgreSQL 17
//     and 18 from npm, Chromium, brokers installed with apt) or runs for long.
//   - go test ./... without -short is what make test runs: every suite in its
//     short mode.
//   - RELAY_TEST_HEAVY=1 selects every suite's full mode (more kills, longer
//     outages, more rows), as the make targets of the heavy suites set it
//     (make chaos, make test-failover, make test-sinks, make test-declared,
//     make test-db-down, make test-lag-idle).
package testkit

import (
	"flag"
	"fmt"
	"os"
	"testing"
	"time"
)

// EnvHeavy names the variable that selects the heavy suites' full mode.
const EnvHeavy = "RELAY_TEST_HEAVY"

// Heavy reports whether the heavy suites run in full (RELAY_TEST_HEAVY set
// to anything but "" or "0").
func Heavy() bool {
	v := os.Getenv(EnvHeavy)
	return v != "" && v != "0"
}

// SkipShort skips t in the quick tier (go test -short), saying why.
func SkipShort(t testing.TB, why string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("quick tier (-short): %s; make test runs it", why)
	}
}

// WaitFor polls cond every 20 ms until it holds, and fails t when it still
// does not after limit, naming what was awaited.
func WaitFor(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", limit, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// SkipSuiteInShort, called first in a TestMain, ends the test binary in the
// quick tier for a suite that runs the relay as a process throughout (the
// end-to-end, sink-fault, failover and tracing suites), saying so; make test
// runs it.
func SkipSuiteInShort(why string) {
	flag.Parse()
	if testing.Short() {
		fmt.Printf("quick tier (-short): skipping the suite: %s; make test runs it\n", why)
		os.Exit(0)
	}
}
