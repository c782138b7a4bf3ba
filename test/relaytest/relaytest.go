// Package relaytest runs the real `relay` binary as a child process, for the
// end-to-end and fault suites: build once per test binary, start with flags
// and environment, wait until it serves /healthz, stop gracefully or SIGKILL.
package relaytest

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
	buildDir  string
)

// Binary builds cmd/relay once per test binary (with -race when the tests
// themselves run with it) and returns its path.
func Binary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "relay-bin-")
		if buildErr != nil {
			return
		}
		binPath = filepath.Join(buildDir, "relay")
		_, file, _, _ := runtime.Caller(0)
		root := filepath.Join(filepath.Dir(file), "..", "..")
		// The failpoint tag compiles in RELAY_FAILPOINT (cmd/relay/failpoint.go).
		args := []string{"build", "-tags", "failpoint", "-o", binPath}
		if raceEnabled {
			args = append(args, "-race")
		}
		args = append(args, "./cmd/relay")
		cmd := exec.Command("go", args...)
		cmd.Dir = root
		out, err := cmd.CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build ./cmd/relay: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// Cleanup removes the built binary; call it from TestMain after m.Run.
func Cleanup() {
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
}

// Process is one running relay.
type Process struct {
	t      testing.TB
	cmd    *exec.Cmd
	Addr   string
	out    *syncBuffer
	done   chan struct{}
	exitMu sync.Mutex
	exit   error
}

// Run executes `relay args...` to completion and returns its combined output
// and exit code.
func Run(t testing.TB, env []string, args ...string) (string, int) {
	t.Helper()
	// Built first: the first build of a test binary (with -race, on a busy
	// machine) can take minutes, which are not the command's.
	bin := Binary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, withExamples(t, env, args)...)
	cmd.Env = append(cleanEnv(), env...)
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("relay %v: %v", args, err)
	}
	return string(out), code
}

// withExamples adds --with-examples to a `relay run` whose database holds the
// example schema (the harness's databases do, pgtest applies it), so that
// the end-to-end suites keep running the example saga they write events for;
// a database without it gets the flag only when the test passes it.
func withExamples(t testing.TB, env, args []string) []string {
	if len(args) == 0 || args[0] != "run" || slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--with-examples") }) {
		return args
	}
	dsn := ""
	for i, a := range args {
		if a == "--database-url" && i+1 < len(args) {
			dsn = args[i+1]
		} else if v, ok := strings.CutPrefix(a, "--database-url="); ok {
			dsn = v
		}
	}
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "RELAY_DATABASE_URL="); ok && dsn == "" {
			dsn = v
		}
	}
	if dsn == "" {
		return args
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return args // the relay reports the unreachable database itself
	}
	defer conn.Close(context.Background())
	var present bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass('research_briefs') IS NOT NULL`).Scan(&present); err != nil || !present {
		return args
	}
	return append(slices.Clone(args), "--with-examples")
}

// cleanEnv drops the RELAY_* and DATABASE_URL variables of the test's own
// environment so that each process sees only what the test gives it.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if bytes.HasPrefix([]byte(kv), []byte("RELAY_")) || bytes.HasPrefix([]byte(kv), []byte("DATABASE_URL=")) {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// Start launches `relay run` with the given extra args on a free HTTP port
// and waits until /healthz answers.
func Start(t testing.TB, env []string, args ...string) *Process {
	t.Helper()
	p := Launch(t, env, args...)
	p.WaitHealthy(60 * time.Second)
	return p
}

// Launch starts `relay run` with the given extra args on a free HTTP port
// and returns at once, for a test that acts while the relay starts up.
func Launch(t testing.TB, env []string, args ...string) *Process {
	t.Helper()
	addr := freeAddr(t)
	full := withExamples(t, env, append([]string{"run", "--http-addr", addr}, args...))
	p := &Process{t: t, Addr: addr, out: &syncBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(Binary(t), full...)
	p.cmd.Env = append(cleanEnv(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start relay: %v", err)
	}
	go func() {
		err := p.cmd.Wait()
		p.exitMu.Lock()
		p.exit = err
		p.exitMu.Unlock()
		close(p.done)
	}()
	t.Cleanup(func() { p.Kill() })
	return p
}

// Healthy reports whether /healthz answers 200 now.
func (p *Process) Healthy() bool {
	resp, err := http.Get("http://" + p.Addr + "/healthz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == 200
}

// WaitHealthy waits until /healthz answers, failing the test if the relay
// exits first or limit passes.
func (p *Process) WaitHealthy(limit time.Duration) {
	p.t.Helper()
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			p.t.Fatalf("relay exited during start-up: %v\n%s", p.ExitErr(), p.Output())
		default:
		}
		if p.Healthy() {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	p.t.Fatalf("relay did not serve /healthz within %s\n%s", limit, p.Output())
}

// Output returns what the process printed so far.
func (p *Process) Output() string { return p.out.String() }

// Pid returns the process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// ExitErr returns the process's exit error once it has exited.
func (p *Process) ExitErr() error {
	p.exitMu.Lock()
	defer p.exitMu.Unlock()
	return p.exit
}

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Stop sends SIGTERM and waits for the exit, failing the test if it takes
// longer than limit or exits non-zero.
func (p *Process) Stop(limit time.Duration) {
	p.t.Helper()
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(limit):
		p.Kill()
		p.t.Fatalf("relay did not stop within %s\n%s", limit, p.Output())
	}
	if err := p.ExitErr(); err != nil {
		p.t.Fatalf("relay exited with %v after SIGTERM\n%s", err, p.Output())
	}
}

// Kill sends SIGKILL (no graceful stop) and waits for the exit.
func (p *Process) Kill() {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Kill()
	<-p.done
}

// Signal sends sig to the process (SIGSTOP, SIGCONT, ...).
func (p *Process) Signal(sig syscall.Signal) error { return p.cmd.Process.Signal(sig) }

// Wait waits for the process to exit by itself and returns its exit code.
func (p *Process) Wait(limit time.Duration) (int, bool) {
	select {
	case <-p.done:
	case <-time.After(limit):
		return 0, false
	}
	if ee, ok := p.ExitErr().(*exec.ExitError); ok {
		return ee.ExitCode(), true
	}
	return 0, true
}

func freeAddr(t testing.TB) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
