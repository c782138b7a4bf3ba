package testkit

import (
	"net"
	"os"
	"sync"
	"testing"
)

// RequireTool skips t in the quick tier, and when a tool it needs is
// missing (missing non-nil) outside CI; in CI a missing tool fails t, since
// make test installs it.
func RequireTool(t testing.TB, why string, missing error) {
	t.Helper()
	SkipShort(t, why)
	if missing == nil {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("%v; CI is set, so this is a failure: make test installs it", missing)
	}
	t.Skipf("%v; make test installs it", missing)
}

// HaveTool reports whether a tool that a test can do without is there
// (missing nil): the test then runs its part that needs the tool. In CI a
// missing tool fails t, as RequireTool does, since make test installs it;
// elsewhere t logs what it leaves out and goes on.
func HaveTool(t testing.TB, missing error) bool {
	t.Helper()
	if missing == nil {
		return true
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("%v; CI is set, so this is a failure: make test installs it", missing)
	}
	t.Logf("%v; this run leaves out what needs it (make test installs it)", missing)
	return false
}

// FreePort returns a TCP port of 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Shared is one server process for a whole test binary (a broker is slow to
// start): started on first use in a temporary directory of its own, stopped
// by Stop from TestMain after m.Run.
type Shared[T interface{ Stop() }] struct {
	once sync.Once
	srv  T
	err  error
	dir  string
}

// Get returns the server, starting it with start in a directory named after
// prefix on first use; an error fails t.
func (s *Shared[T]) Get(t testing.TB, prefix string, start func(dir string) (T, error)) T {
	t.Helper()
	s.once.Do(func() {
		s.dir, s.err = os.MkdirTemp("", prefix)
		if s.err == nil {
			s.srv, s.err = start(s.dir)
		}
	})
	if s.err != nil {
		t.Fatal(s.err)
	}
	return s.srv
}

// Stop stops the server Get started, if any, and removes its files.
func (s *Shared[T]) Stop() {
	if s.dir == "" {
		return
	}
	if s.err == nil {
		s.srv.Stop()
	}
	os.RemoveAll(s.dir)
}
