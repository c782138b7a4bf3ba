// Package redistest runs a real redis-server (the distribution's binary) as
// a child process on a free port, with its data in a temporary folder and
// an append-only file fsynced on every write, so that a kill -9 loses no
// acknowledged entry and a restart on the same port and folder finds them.
//
// Without redis-server on PATH a test skips, saying so, unless CI is set:
// then it fails, since make test installs it (make brokers).
package redistest

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/compensa/compensa/test/testkit"
)

// Binary is the server's executable name.
const Binary = "redis-server"

// Server is a redis-server process.
type Server struct {
	// Password is what clients authenticate with (requirepass).
	Password string
	bin, dir string
	args     []string // more redis-server arguments
	port     int
	mu       sync.Mutex
	cmd      *exec.Cmd
	done     chan struct{}
}

// ErrMissing is returned by StartProcess when redis-server is not installed.
var ErrMissing = errors.New("redis-server is not installed (apt-get install redis-server, or make brokers)")

// Missing returns ErrMissing when redis-server is not installed, else nil.
func Missing() error {
	if _, err := exec.LookPath(Binary); err != nil {
		return ErrMissing
	}
	return nil
}

// Require skips t in the quick tier (-short), and when redis-server is
// missing and CI is not set; it fails t when it is missing and CI is set.
func Require(t testing.TB) {
	t.Helper()
	testkit.RequireTool(t, "needs a real Redis server, installed with apt", Missing())
}

// Start starts a server for t, stopped when t ends; args are more
// redis-server arguments (--cluster-enabled yes, say).
func Start(t testing.TB, args ...string) *Server {
	t.Helper()
	Require(t)
	s, err := StartProcess(t.TempDir(), args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

var shared testkit.Shared[*Server]

// Shared returns one server for the whole test binary, started on first use;
// StopShared (from TestMain, after m.Run) stops it.
func Shared(t testing.TB) *Server {
	t.Helper()
	Require(t)
	return shared.Get(t, "redistest", func(dir string) (*Server, error) { return StartProcess(dir) })
}

// StopShared stops the server Shared started, if any, and removes its files.
func StopShared() { shared.Stop() }

// StartProcess starts a server with its data under dir; args are more
// redis-server arguments.
func StartProcess(dir string, args ...string) (*Server, error) {
	bin, err := exec.LookPath(Binary)
	if err != nil {
		return nil, ErrMissing
	}
	port, err := testkit.FreePort()
	if err != nil {
		return nil, err
	}
	s := &Server{Password: "redistest-" + fmt.Sprint(time.Now().UnixNano()), bin: bin, dir: dir, args: args, port: port}
	if err := s.start(); err != nil {
		return nil, err
	}
	return s, nil
}

// Addr is host:port.
func (s *Server) Addr() string { return fmt.Sprintf("127.0.0.1:%d", s.port) }

// URL is a redis:// URL without the password.
func (s *Server) URL() string { return "redis://" + s.Addr() + "/0" }

func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	args := append([]string{"--port", fmt.Sprint(s.port), "--bind", "127.0.0.1", "--dir", s.dir,
		"--save", "", "--appendonly", "yes", "--appendfsync", "always", "--requirepass", s.Password,
		"--daemonize", "no", "--protected-mode", "no", "--logfile", filepath.Join(s.dir, "redis.log")}, s.args...)
	cmd := exec.Command(s.bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	s.cmd, s.done = cmd, done
	deadline := time.Now().Add(30 * time.Second)
	for {
		if s.ping() {
			return nil
		}
		select {
		case <-done:
			log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
			return fmt.Errorf("redis-server exited before it was ready:\n%s", log)
		default:
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			<-done
			return errors.New("redis-server not ready within 30s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ping reports whether the server answers and has loaded its data.
func (s *Server) ping() bool {
	c, err := net.DialTimeout("tcp", s.Addr(), time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	fmt.Fprintf(c, "AUTH %s\r\nPING\r\n", s.Password)
	r := bufio.NewReader(c)
	for range 2 {
		line, err := r.ReadString('\n')
		if err != nil || !strings.HasPrefix(line, "+") {
			return false
		}
	}
	return true
}

// Kill sends SIGKILL: no flush, no goodbye to clients.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		s.cmd.Process.Kill()
		<-s.done
		s.cmd = nil
	}
}

// Restart starts the server again on the same port and data folder.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	if err := s.start(); err != nil {
		t.Fatal(err)
	}
}

// Stop shuts the server down (SIGTERM, then SIGKILL after 10 s).
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		s.cmd.Process.Kill()
		<-s.done
	}
	s.cmd = nil
}
