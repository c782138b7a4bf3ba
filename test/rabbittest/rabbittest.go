// Package rabbittest runs a real RabbitMQ node (the distribution's
// rabbitmq-server) as a child process: its own node name, AMQP and
// distribution ports, a private epmd on a free port, its database, logs,
// config and Erlang cookie (HOME) in a temporary folder, the management
// plugin off. A node can be killed with -9 and started again on the same
// port and database, so durable queues and persistent messages survive.
//
// Starting a node takes seconds: share one per test binary (Shared, and
// StopShared in TestMain) and start one of its own only for a test that
// kills it or configures it (Launch returns while it boots). Without
// rabbitmq-server a test skips, saying so, unless CI is set: then it
// fails, since make test installs it (make brokers).
package rabbittest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/compensa/compensa/test/testkit"
)

// User is the node's default user; Server.Password is its password.
const User = "relay"

// serverScripts are where the node's start script is looked for: the
// distribution's own (not /usr/sbin's wrapper, which switches to the
// rabbitmq user), then PATH.
var serverScripts = []string{"/usr/lib/rabbitmq/bin/rabbitmq-server"}

// ErrMissing is returned when rabbitmq-server or epmd is not installed.
var ErrMissing = errors.New("rabbitmq-server is not installed (apt-get install rabbitmq-server, or make brokers)")

func lookup() (script, epmd string, err error) {
	for _, s := range serverScripts {
		if _, err := os.Stat(s); err == nil {
			script = s
			break
		}
	}
	if script == "" {
		if script, err = exec.LookPath("rabbitmq-server"); err != nil {
			return "", "", ErrMissing
		}
	}
	if epmd, err = exec.LookPath("epmd"); err != nil {
		return "", "", ErrMissing
	}
	return script, epmd, nil
}

// Missing returns ErrMissing when rabbitmq-server or epmd is not
// installed, else nil.
func Missing() error {
	_, _, err := lookup()
	return err
}

// Require skips t in the quick tier (-short), and when RabbitMQ is missing
// and CI is not set; it fails t when it is missing and CI is set.
func Require(t testing.TB) {
	t.Helper()
	testkit.RequireTool(t, "needs a real RabbitMQ server, installed with apt", Missing())
}

// Server is a RabbitMQ node.
type Server struct {
	// Password is the password of User.
	Password            string
	script, epmdBin     string
	dir                 string
	port, dist, epmdPrt int
	mu                  sync.Mutex
	cmd, epmd           *exec.Cmd
	done, epmdDone      chan struct{}
	ready               chan struct{} // closed when the first start ended
	readyErr            error
}

// Start starts a node for t, stopped when t ends.
func Start(t testing.TB) *Server {
	t.Helper()
	Require(t)
	s, err := StartProcess(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

var shared testkit.Shared[*Server]

// Shared returns one node for the whole test binary, started on first use;
// StopShared (from TestMain, after m.Run) stops it.
func Shared(t testing.TB) *Server {
	t.Helper()
	Require(t)
	return shared.Get(t, "rabbittest", StartProcess)
}

// StopShared stops the node Shared started, if any, and removes its files.
func StopShared() { shared.Stop() }

// StartProcess starts a node with its files under dir.
func StartProcess(dir string) (*Server, error) {
	s, err := Launch(dir)
	if err != nil {
		return nil, err
	}
	if err := s.Ready(); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

// Launch starts a node like StartProcess, with conf as more rabbitmq.conf
// lines (max_message_size = 262144, say), and returns while it boots: its
// URL and password are known, and Ready waits until it takes connections.
// A node takes seconds to boot, which a test spends on its other setup.
func Launch(dir string, conf ...string) (*Server, error) {
	script, epmd, err := lookup()
	if err != nil {
		return nil, err
	}
	s := &Server{Password: fmt.Sprintf("rabbittest-%d", time.Now().UnixNano()), script: script, epmdBin: epmd, dir: dir}
	for _, p := range []*int{&s.port, &s.dist, &s.epmdPrt} {
		if *p, err = testkit.FreePort(); err != nil {
			return nil, err
		}
	}
	for _, d := range []string{"home", "mnesia", "log"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			return nil, err
		}
	}
	file := fmt.Sprintf(`listeners.tcp.default = 127.0.0.1:%d
default_user = %s
default_pass = %s
default_permissions.configure = .*
default_permissions.read = .*
default_permissions.write = .*
loopback_users = none
disk_free_limit.absolute = 10MB
vm_memory_high_watermark.absolute = 1GB
log.console = false
log.file.level = warning
`, s.port, User, s.Password)
	for _, line := range conf {
		file += line + "\n"
	}
	files := map[string]string{"rabbitmq.conf": file, "enabled_plugins": "[].\n", "rabbitmq-env.conf": ""}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			return nil, err
		}
	}
	if err := s.startEPMD(); err != nil {
		return nil, err
	}
	s.ready = make(chan struct{})
	go func() {
		defer close(s.ready)
		s.readyErr = s.start()
	}()
	return s, nil
}

// Ready waits until the node Launch started takes connections, or returns
// why it did not.
func (s *Server) Ready() error {
	<-s.ready
	return s.readyErr
}

// Port is the AMQP port.
func (s *Server) Port() int { return s.port }

// URL is an amqp:// URL with the user but without the password.
func (s *Server) URL() string { return fmt.Sprintf("amqp://%s@127.0.0.1:%d/", User, s.port) }

// AdminURL is the URL with the password, for the test's own clients.
func (s *Server) AdminURL() string {
	return fmt.Sprintf("amqp://%s:%s@127.0.0.1:%d/", User, s.Password, s.port)
}

// Dial connects as User.
func (s *Server) Dial() (*amqp.Connection, error) { return amqp.Dial(s.AdminURL()) }

func (s *Server) env() []string {
	return append(os.Environ(),
		"HOME="+filepath.Join(s.dir, "home"),
		fmt.Sprintf("RABBITMQ_NODENAME=rabbittest%d@localhost", s.port),
		"RABBITMQ_USE_LONGNAME=false",
		"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		fmt.Sprintf("RABBITMQ_NODE_PORT=%d", s.port),
		fmt.Sprintf("RABBITMQ_DIST_PORT=%d", s.dist),
		fmt.Sprintf("ERL_EPMD_PORT=%d", s.epmdPrt),
		"RABBITMQ_MNESIA_BASE="+filepath.Join(s.dir, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(s.dir, "log"),
		"RABBITMQ_LOGS="+filepath.Join(s.dir, "log", "rabbit.log"),
		"RABBITMQ_CONFIG_FILE="+filepath.Join(s.dir, "rabbitmq.conf"),
		"RABBITMQ_ADVANCED_CONFIG_FILE="+filepath.Join(s.dir, "advanced.config"),
		"RABBITMQ_CONF_ENV_FILE="+filepath.Join(s.dir, "rabbitmq-env.conf"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(s.dir, "enabled_plugins"),
		"RABBITMQ_PID_FILE="+filepath.Join(s.dir, "rabbit.pid"),
	)
}

// startEPMD runs the node's own epmd in the foreground, so that it is a
// child of the test (stopped by pid) and outlives a kill -9 of the node.
func (s *Server) startEPMD() error {
	cmd := exec.Command(s.epmdBin, "-port", fmt.Sprint(s.epmdPrt))
	cmd.Env = s.env()
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start epmd: %w", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	s.epmd, s.epmdDone = cmd, done
	for deadline := time.Now().Add(10 * time.Second); ; {
		if c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", s.epmdPrt)); err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("epmd not listening within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *Server) stopEPMD() {
	if s.epmd != nil {
		s.epmd.Process.Kill()
		<-s.epmdDone
		s.epmd = nil
	}
}

// bootLimit is how long a node may take to accept connections: seconds on
// an idle machine, but beside a loaded test suite it has taken more than 90.
const bootLimit = 3 * time.Minute

func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	cmd := exec.Command(s.script)
	cmd.Dir = s.dir
	cmd.Env = s.env()
	// A group of its own: the start script, the Erlang VM and its helpers
	// are killed together.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	out, err := os.OpenFile(filepath.Join(s.dir, "log", "stdout.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start rabbitmq-server: %w", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	s.cmd, s.done = cmd, done
	deadline := time.Now().Add(bootLimit)
	for {
		if c, err := amqp.DialConfig(s.AdminURL(), amqp.Config{Dial: amqp.DefaultDial(2 * time.Second)}); err == nil {
			c.Close()
			return nil
		}
		select {
		case <-done:
			s.cmd = nil
			log, _ := os.ReadFile(filepath.Join(s.dir, "log", "stdout.log"))
			return fmt.Errorf("rabbitmq-server exited before it was ready:\n%s", tailOf(string(log)))
		default:
		}
		if time.Now().After(deadline) {
			s.killLocked()
			log, _ := os.ReadFile(filepath.Join(s.dir, "log", "stdout.log"))
			return fmt.Errorf("rabbitmq-server not ready within %s:\n%s", bootLimit, tailOf(string(log)))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func tailOf(s string) string {
	if len(s) > 4000 {
		return s[len(s)-4000:]
	}
	return s
}

// Ctl runs rabbitmqctl against the node (set_vm_memory_high_watermark,
// say) and returns its output.
func (s *Server) Ctl(args ...string) (string, error) {
	ctl := filepath.Join(filepath.Dir(s.script), "rabbitmqctl")
	cmd := exec.Command(ctl, append([]string{"-n", fmt.Sprintf("rabbittest%d@localhost", s.port)}, args...)...)
	cmd.Env = s.env()
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// Kill sends SIGKILL to the node's processes: no flush, no goodbye to
// clients.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.killLocked()
}

func (s *Server) killLocked() {
	if s.cmd == nil {
		return
	}
	syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	<-s.done
	s.cmd = nil
}

// Restart starts the node again on the same ports and database.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	if err := s.start(); err != nil {
		t.Fatal(err)
	}
}

// Stop stops the node (SIGTERM, SIGKILL after 20 s) and its epmd; a node
// still booting is stopped once its boot ended.
func (s *Server) Stop() {
	s.Ready()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		syscall.Kill(-s.cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-s.done:
			// The script may end before the VM: make sure of the group.
			syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		case <-time.After(20 * time.Second):
			s.killLocked()
		}
		s.cmd = nil
	}
	s.stopEPMD()
}
