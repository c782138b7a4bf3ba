// Package tracing checks the relay's OpenTelemetry traces end to end: a
// producer's traced transaction, the relay exporting over real OTLP/HTTP to
// an in-process receiver, participants and consumers that continue the trace.
package tracing

import (
	"os"
	"testing"

	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/testkit"
)

func TestMain(m *testing.M) {
	testkit.SkipSuiteInShort("traces across relay processes")
	os.Exit(pgtest.Main(m))
}
