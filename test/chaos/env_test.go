//go:build chaos

package chaos

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/compensa/compensa/internal/pgcluster"
	"github.com/compensa/compensa/internal/pgcluster/pgdocker"
	"github.com/compensa/compensa/migrations"
	"github.com/compensa/compensa/test/pgtest"
)

// target is one migrated database the relay runs against.
type target struct {
	URL         string
	Pool        *pgxpool.Pool
	Slot        string
	Publication string
	Cluster     *pgcluster.Cluster
}

func fromPgtest(db *pgtest.DB) *target {
	return &target{URL: db.URL, Pool: db.Pool, Slot: db.Slot, Publication: db.Publication, Cluster: db.Cluster}
}

// ownCluster starts a cluster for this scenario alone (settings that are
// cluster-wide, restarts), with one migrated database.
func ownCluster(t *testing.T, opts pgcluster.Options) *target {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := pgdocker.Start(ctx, opts)
	if err != nil {
		t.Fatalf("start a cluster of its own: %v", err)
	}
	t.Cleanup(func() { c.Stop() })
	admin, err := pgx.Connect(ctx, c.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE chaos"); err != nil {
		t.Fatal(err)
	}
	url := c.DSN("chaos")
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	_, err = migrations.Apply(ctx, conn, migrations.Options{WithExamples: true})
	conn.Close(ctx)
	if err != nil {
		t.Fatalf("migrate: %v", err)
	}
	pool, err := pgxpool.New(ctx, withApp(url, "chaos-harness"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return &target{URL: url, Pool: pool, Slot: "chaos_slot", Publication: "chaos_pub", Cluster: c}
}

// withApp sets application_name on a URL: the audit triggers tell the
// relay processes apart by it.
func withApp(url, app string) string {
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	return url + sep + "application_name=" + app
}

// relayArgs are the flags of one relay process against tg; app names the
// process in the audit.
func relayArgs(tg *target, app string, extra ...string) []string {
	return append([]string{
		"--database-url", withApp(tg.URL, app), "--slot", tg.Slot, "--publication", tg.Publication,
		"--status-interval", "1s", "--heartbeat-interval", "2s", "--workers", "4", "--lease", "5s",
		"--stop-timeout", "30s",
	}, extra...)
}

// auditSQL adds test-only triggers that record, in the writer's own
// transaction, what each committed transaction did:
//
//   - chaos_leases: every lease granted, and the process (application_name)
//     that claimed it;
//   - chaos_writes: every journal write (a new current_version), the process
//     that made it and the process that held the lease the row carried at
//     that moment. A write by another process than the lease holder is a
//     write accepted from a stale lease;
//   - chaos_effects: every step effect on a brief (status transitions,
//     enrichment set or cleared, sources attached or deleted) with its
//     transaction id, so that "each step's effects exactly once" is counted
//     in committed transactions, not inferred from the final state.
//
// Rolled-back transactions leave no audit row.
const auditSQL = `
CREATE TABLE chaos_leases (lease_id uuid PRIMARY KEY, instance_id uuid NOT NULL, app text NOT NULL, at timestamptz NOT NULL);
CREATE TABLE chaos_writes (instance_id uuid NOT NULL, version bigint NOT NULL, app text NOT NULL,
	lease_id uuid, lease_app text, at timestamptz NOT NULL);
CREATE TABLE chaos_effects (brief_id uuid NOT NULL, kind text NOT NULL,
	xid xid8 NOT NULL DEFAULT pg_current_xact_id(), at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE INDEX ON chaos_effects (brief_id);

CREATE FUNCTION chaos_audit_instance() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF NEW.lease_id IS NOT NULL AND NEW.lease_id IS DISTINCT FROM OLD.lease_id THEN
		INSERT INTO chaos_leases VALUES (NEW.lease_id, NEW.id, current_setting('application_name'), clock_timestamp())
		ON CONFLICT DO NOTHING;
	END IF;
	IF NEW.current_version <> OLD.current_version THEN
		INSERT INTO chaos_writes VALUES (NEW.id, NEW.current_version, current_setting('application_name'), OLD.lease_id,
			(SELECT l.app FROM chaos_leases l WHERE l.lease_id = OLD.lease_id), clock_timestamp());
	END IF;
	RETURN NULL;
END $$;
CREATE TRIGGER chaos_audit_instance AFTER UPDATE ON saga_instances
	FOR EACH ROW EXECUTE FUNCTION chaos_audit_instance();

CREATE FUNCTION chaos_audit_brief() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF NEW.status IS DISTINCT FROM OLD.status THEN
		INSERT INTO chaos_effects (brief_id, kind) VALUES (NEW.id, OLD.status::text || '>' || NEW.status::text);
	END IF;
	IF NEW.enrichment IS NOT NULL AND OLD.enrichment IS NULL THEN
		INSERT INTO chaos_effects (brief_id, kind) VALUES (NEW.id, 'score');
	ELSIF NEW.enrichment IS NULL AND OLD.enrichment IS NOT NULL THEN
		INSERT INTO chaos_effects (brief_id, kind) VALUES (NEW.id, 'unscore');
	END IF;
	RETURN NULL;
END $$;
CREATE TRIGGER chaos_audit_brief AFTER UPDATE ON research_briefs
	FOR EACH ROW EXECUTE FUNCTION chaos_audit_brief();

CREATE FUNCTION chaos_audit_sources() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF TG_OP = 'INSERT' THEN
		INSERT INTO chaos_effects (brief_id, kind) VALUES (NEW.brief_id, 'attach');
	ELSE
		INSERT INTO chaos_effects (brief_id, kind) VALUES (OLD.brief_id, 'detach');
	END IF;
	RETURN NULL;
END $$;
CREATE TRIGGER chaos_audit_sources AFTER INSERT OR DELETE ON brief_sources
	FOR EACH ROW EXECUTE FUNCTION chaos_audit_sources();
`

func installAudit(t *testing.T, tg *target) {
	t.Helper()
	if _, err := tg.Pool.Exec(context.Background(), auditSQL); err != nil {
		t.Fatalf("install the audit triggers: %v", err)
	}
}

// waitUntil polls cond every 100ms until it holds or limit passes.
func waitUntil(limit time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(limit)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func count(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, sql string, args ...any) (int64, error) {
	var n int64
	err := q.QueryRow(ctx, sql, args...).Scan(&n)
	return n, err
}

func mustCount(t *testing.T, tg *target, sql string, args ...any) int64 {
	t.Helper()
	n, err := count(context.Background(), tg.Pool, sql, args...)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// drained reports whether every committed trigger has its saga and every saga
// is terminal.
func drained(ctx context.Context, tg *target) bool {
	n, err := count(ctx, tg.Pool, `SELECT
		(SELECT count(*) FROM outbox o WHERE o.event_type = 'research_brief.created'
			AND NOT EXISTS (SELECT 1 FROM saga_instances i WHERE i.trigger_event_id = o.id))
		+ (SELECT count(*) FROM saga_instances WHERE status IN ('RUNNING', 'COMPENSATING'))`)
	return err == nil && n == 0
}

// waitDrained waits for drained and reports how long it took.
func waitDrained(t *testing.T, tg *target, limit time.Duration) (time.Duration, bool) {
	began := time.Now()
	ok := waitUntil(limit, func() bool { return drained(context.Background(), tg) })
	return time.Since(began), ok
}

// resumeAfter waits until a saga starts whose trigger was committed after
// fault, and returns the time from fault to that start on the database's
// clock (the same host's clock as ours). It gives up early when abort is
// closed (the relay died first).
func resumeAfter(tg *target, outboxTable string, fault time.Time, limit time.Duration, abort <-chan struct{}) (time.Duration, bool) {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		var first *time.Time
		err := tg.Pool.QueryRow(ctx, `SELECT min(i.created_at) FROM saga_instances i
			JOIN `+outboxTable+` o ON o.id = i.trigger_event_id
			WHERE i.created_at >= $1 AND o.created_at >= $1`, fault).Scan(&first)
		cancel()
		if err == nil && first != nil {
			return first.Sub(fault), true
		}
		select {
		case <-abort:
			return 0, false
		case <-time.After(100 * time.Millisecond):
		}
	}
	return 0, false
}

// metric sums the samples of a Prometheus family whose labels contain all of
// want, from a relay's /metrics.
func metric(addr, family string, want ...string) (float64, error) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, family) || len(line) > len(family) && line[len(family)] != '{' && line[len(family)] != ' ' {
			continue
		}
		ok := true
		for _, w := range want {
			ok = ok && strings.Contains(line, w)
		}
		if !ok {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			sum += v
		}
	}
	io.Copy(io.Discard, resp.Body)
	return sum, sc.Err()
}

// rss returns a process's peak resident memory in MB (VmHWM).
func rss(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmHWM:") {
			f := strings.Fields(l)
			if len(f) >= 2 {
				kb, _ := strconv.ParseFloat(f[1], 64)
				return kb / 1024
			}
		}
	}
	return 0
}

// durations summarises a sample.
type durations []time.Duration

func (d durations) pct(p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append(durations(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

func (d durations) String() string {
	if len(d) == 0 {
		return "no samples"
	}
	r := func(x time.Duration) string { return x.Round(10 * time.Millisecond).String() }
	return fmt.Sprintf("p50 %s, p99 %s, max %s (n=%d)", r(d.pct(50)), r(d.pct(99)), r(d.pct(100)), len(d))
}

// rng is the fault schedule's random source, from the run's seed and the
// scenario's name, so that -chaos.seed repeats a schedule.
func rng(name string) *rand.Rand {
	var h uint64 = 1469598103934665603
	for _, c := range []byte(name) {
		h = (h ^ uint64(c)) * 1099511628211
	}
	return rand.New(rand.NewPCG(uint64(seed()), h))
}

func between(r *rand.Rand, lo, hi time.Duration) time.Duration {
	return lo + time.Duration(r.Int64N(int64(hi-lo)+1))
}

// child is one relay process. startRelay waits until it serves /healthz;
// startChild does not, for a relay whose failpoint may strike first.
type child struct {
	cmd  *exec.Cmd
	Addr string
	out  *lockedBuffer
	done chan struct{}
	err  error
}

func startChild(t *testing.T, env []string, args ...string) *child {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	c := &child{Addr: addr, out: &lockedBuffer{}, done: make(chan struct{})}
	// The chaos database holds the example schema: its relays run the
	// example saga the producer writes events for.
	c.cmd = exec.Command(relayBinary(t), append([]string{"run", "--http-addr", addr, "--with-examples"}, args...)...)
	c.cmd.Env = append(relayEnv(), env...)
	c.cmd.Stdout, c.cmd.Stderr = c.out, c.out
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := c.cmd.Start(); err != nil {
		t.Fatalf("start relay: %v", err)
	}
	go func() {
		c.err = c.cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(c.Kill)
	return c
}

// startRelay starts `relay run` with args and waits until it is healthy.
func startRelay(t *testing.T, env []string, args ...string) *child {
	t.Helper()
	c := startChild(t, env, args...)
	if !c.healthy(60 * time.Second) {
		t.Fatalf("relay did not become healthy (%s):\n%s", c.Exit(), c.Output())
	}
	return c
}

// runRelay runs `relay args...` to completion (at most 2 minutes) and
// returns its output and exit code.
func runRelay(t *testing.T, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if len(args) > 0 && args[0] == "run" {
		args = append([]string{"run", "--with-examples"}, args[1:]...)
	}
	cmd := exec.CommandContext(ctx, relayBinary(t), args...)
	cmd.Env = relayEnv()
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("relay %v: %v", args, err)
	}
	return string(out), code
}

// relayEnv is this process's environment without RELAY_* and DATABASE_URL,
// so that each relay sees only its flags.
func relayEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "RELAY_") && !strings.HasPrefix(kv, "DATABASE_URL=") {
			env = append(env, kv)
		}
	}
	return env
}

var (
	binMu  sync.Mutex
	binDir string
)

// relayBinary builds cmd/relay, with the failpoint compiled in, into a
// folder of the suite's own, and builds it again if something removed it
// while the suite runs (a long run outlives more than one /tmp clean-up).
func relayBinary(t *testing.T) string {
	t.Helper()
	binMu.Lock()
	defer binMu.Unlock()
	if binDir == "" {
		d, err := os.MkdirTemp("", "compensa-chaos-relay-")
		if err != nil {
			t.Fatal(err)
		}
		binDir = d
	}
	path := filepath.Join(binDir, "relay")
	if _, err := os.Stat(path); err == nil {
		return path
	}
	os.MkdirAll(binDir, 0o755)
	cmd := exec.Command("go", "build", "-tags", "failpoint", "-o", path, "./cmd/relay")
	cmd.Dir = repoRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build -tags failpoint ./cmd/relay: %v\n%s", err, out)
	}
	return path
}

func removeRelayBinary() {
	binMu.Lock()
	defer binMu.Unlock()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
}

// healthy waits until /healthz answers; false when the process exited first
// or limit passed.
func (c *child) healthy(limit time.Duration) bool {
	deadline := time.Now().Add(limit)
	hc := http.Client{Timeout: time.Second}
	for time.Now().Before(deadline) {
		select {
		case <-c.done:
			return false
		default:
		}
		if resp, err := hc.Get("http://" + c.Addr + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return true
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}

func (c *child) Done() <-chan struct{} { return c.done }
func (c *child) Output() string        { return c.out.String() }
func (c *child) Pid() int              { return c.cmd.Process.Pid }

// Kill sends SIGKILL and waits for the exit.
func (c *child) Kill() {
	select {
	case <-c.done:
		return
	default:
	}
	c.cmd.Process.Kill()
	<-c.done
}

// Wait waits up to limit for the process to exit by itself.
func (c *child) Wait(limit time.Duration) bool {
	select {
	case <-c.done:
		return true
	case <-time.After(limit):
		return false
	}
}

// Stop sends SIGTERM and waits up to limit; it reports the exit.
func (c *child) Stop(limit time.Duration) (string, bool) {
	c.cmd.Process.Signal(syscall.SIGTERM)
	if !c.Wait(limit) {
		c.Kill()
		return "killed after " + limit.String(), false
	}
	if c.err != nil {
		return c.err.Error(), false
	}
	return "exit status 0", true
}

// Signal sends sig (SIGSTOP, SIGCONT, ...).
func (c *child) Signal(sig syscall.Signal) error { return c.cmd.Process.Signal(sig) }

// Code is the exit code once the process has exited (-1 for a signal).
func (c *child) Code() int {
	if ee, ok := c.err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	return 0
}

// Exit describes how the process ended.
func (c *child) Exit() string {
	if c.err != nil {
		return c.err.Error()
	}
	return "exit status 0"
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
