package relay_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/relay"
	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/testkit"
)

// logLines collects a relay's JSON log lines.
type logLines struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	lines []map[string]any
	at    []time.Time
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(p)
	for {
		line, err := l.buf.ReadBytes('\n')
		if err != nil {
			l.buf.Write(line) // an unfinished line waits for its end
			break
		}
		m := map[string]any{}
		if json.Unmarshal(line, &m) == nil {
			l.lines = append(l.lines, m)
			l.at = append(l.at, time.Now())
		}
	}
	return len(p), nil
}

// between returns the lines written in [from, to).
func (l *logLines) between(from, to time.Time) []map[string]any {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for i, at := range l.at {
		if !at.Before(from) && at.Before(to) {
			out = append(out, l.lines[i])
		}
	}
	return out
}

func (l *logLines) logger() *slog.Logger {
	return slog.New(slog.NewJSONHandler(l, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

func withMsg(lines []map[string]any, prefix string) int {
	n := 0
	for _, m := range lines {
		if s, _ := m["msg"].(string); strings.HasPrefix(s, prefix) {
			n++
		}
	}
	return n
}

func mustExec(t *testing.T, pool *pgxpool.Pool, sql string) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// leastRole creates a login role with REPLICATION and every privilege on
// the test database's tables and sequences (the test then takes one away),
// and the publication, made by the table's owner. It returns the role's
// quoted name and its URL.
func leastRole(t *testing.T, db *pgtest.DB) (quoted, dsn string) {
	t.Helper()
	role := db.Name + "_relay"
	quoted = pgx.Identifier{role}.Sanitize()
	mustExec(t, db.Pool, `CREATE ROLE `+quoted+` LOGIN REPLICATION PASSWORD 'readyz-Pw-1'`)
	t.Cleanup(func() {
		ctx := context.Background()
		db.Pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1`, role)
		db.Pool.Exec(ctx, `DROP OWNED BY `+quoted)
		db.Pool.Exec(ctx, `DROP ROLE `+quoted)
	})
	mustExec(t, db.Pool, `GRANT ALL ON ALL TABLES IN SCHEMA public TO `+quoted)
	mustExec(t, db.Pool, `GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO `+quoted)
	mustExec(t, db.Pool, `CREATE PUBLICATION `+pgx.Identifier{db.Publication}.Sanitize()+` FOR TABLE outbox WITH (publish = 'insert')`)
	u, err := url.Parse(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(role, "readyz-Pw-1")
	return quoted, u.String()
}

type readiness struct {
	status  int
	state   string
	reasons []string
	body    string
	// asked and answered bound when the probe saw this (dbdown_test).
	asked, answered time.Time
}

func probe(t *testing.T, addr string) readiness {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var m struct {
		Status  string   `json:"status"`
		Reasons []string `json:"reasons"`
	}
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("/readyz: %v: %s", err, body)
	}
	return readiness{status: resp.StatusCode, state: m.Status, reasons: m.Reasons, body: string(body)}
}

func metricValue(t *testing.T, addr, name string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == name {
			return f[1]
		}
	}
	t.Fatalf("/metrics has no %s", name)
	return ""
}

func writeOrder(t *testing.T, pool *pgxpool.Pool, id string) {
	t.Helper()
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return outbox.Write(ctx, tx, outbox.Message{AggregateType: "order", AggregateID: id, EventType: "order.placed",
			Payload: map[string]string{"order_id": id}})
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Revoking a privilege the stream needs (writing its checkpoint) while the
// relay runs turns /readyz unready within --stall-after, with the reason;
// granting it back makes it ready again without a restart, and every event
// written meanwhile starts its saga exactly once.
func TestReadyzUnreadyWhileAPrivilegeIsRevoked(t *testing.T) {
	testkit.SkipShort(t, "waits out --stall-after twice")
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := t.Context()
	mustExec(t, db.Pool, `CREATE TABLE relay_test_steps (order_id text, step text)`)
	role, dsn := leastRole(t, db)
	const stallAfter = 2 * time.Second
	var logs logLines
	r := startRelay(t, relay.Config{
		DatabaseURL: dsn, Registry: orderRegistry(t), Slot: db.Slot, Publication: db.Publication,
		Workers: 2, StatusInterval: 200 * time.Millisecond, HeartbeatInterval: 500 * time.Millisecond,
		HTTPAddr: "127.0.0.1:0", StallAfter: stallAfter, Logger: logs.logger(),
	})
	stepsDone := func(n int) bool {
		var got int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM relay_test_steps`).Scan(&got); err != nil {
			t.Fatal(err)
		}
		return got == 2*n
	}
	writeOrder(t, db.Pool, "o-0")
	testkit.WaitFor(t, 30*time.Second, "the first saga's two steps", func() bool { return stepsDone(1) })
	if rd := probe(t, r.Addr()); rd.status != 200 || rd.state != "ok" {
		t.Fatalf("/readyz before the revoke: %d %s", rd.status, rd.body)
	}

	mustExec(t, db.Pool, `REVOKE INSERT, UPDATE ON relay_checkpoints FROM `+role)
	revoked := time.Now()
	for i := 1; i <= 5; i++ {
		writeOrder(t, db.Pool, fmt.Sprintf("o-%d", i))
	}
	var rd readiness
	testkit.WaitFor(t, 20*time.Second, "/readyz unready after the revoke", func() bool {
		rd = probe(t, r.Addr())
		return rd.status == http.StatusServiceUnavailable
	})
	took := time.Since(revoked)
	t.Logf("unready %s after the revoke: %s", took.Round(10*time.Millisecond), rd.body)
	// Within --stall-after, plus the second /readyz may reuse its last
	// answer and the time the first failing batch takes to arrive.
	if took > stallAfter+2*time.Second {
		t.Errorf("unready only %s after the revoke, --stall-after is %s", took, stallAfter)
	}
	if rd.state != "unready" || len(rd.reasons) == 0 || !strings.HasPrefix(rd.reasons[0], "stream: ") ||
		!strings.Contains(rd.reasons[0], "permission denied for table relay_checkpoints") {
		t.Errorf("/readyz body %s: want the stream's reason naming the missing privilege", rd.body)
	}
	if v := metricValue(t, r.Addr(), "compensa_stream_stalled"); v != "1" {
		t.Errorf("compensa_stream_stalled = %s while unready", v)
	}
	if v := metricValue(t, r.Addr(), "compensa_stream_batch_failures_total"); v == "0" {
		t.Error("compensa_stream_batch_failures_total is 0 while a batch keeps failing")
	}
	// Still unready a while later, and the failure is not logged per retry.
	for i := 6; i <= 10; i++ {
		writeOrder(t, db.Pool, fmt.Sprintf("o-%d", i))
	}
	time.Sleep(3 * time.Second)
	if rd := probe(t, r.Addr()); rd.status != http.StatusServiceUnavailable {
		t.Fatalf("/readyz ready again while the privilege is still missing: %s", rd.body)
	}
	during := logs.between(revoked, time.Now())
	if n := withMsg(during, "replication session ended"); n < 1 || n > 2 {
		t.Errorf("%d 'replication session ended' lines in the %s since the revoke, want 1 (then one a minute)", n, time.Since(revoked).Round(time.Second))
	}

	mustExec(t, db.Pool, `GRANT INSERT, UPDATE ON relay_checkpoints TO `+role)
	granted := time.Now()
	testkit.WaitFor(t, 40*time.Second, "/readyz ready again after the grant", func() bool { return probe(t, r.Addr()).status == 200 })
	t.Logf("ready %s after the grant", time.Since(granted).Round(10*time.Millisecond))
	testkit.WaitFor(t, 30*time.Second, "every saga's steps", func() bool { return stepsDone(11) })
	var sagas, orders int
	if err := db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM saga_instances WHERE saga_name = 'order'),
		(SELECT count(DISTINCT order_id) FROM relay_test_steps)`).Scan(&sagas, &orders); err != nil {
		t.Fatal(err)
	}
	if sagas != 11 || orders != 11 {
		t.Errorf("%d saga instances, steps for %d orders; want 11 and 11", sagas, orders)
	}
	if v := metricValue(t, r.Addr(), "compensa_stream_stalled"); v != "0" {
		t.Errorf("compensa_stream_stalled = %s after recovery", v)
	}
	if n := withMsg(logs.between(granted, time.Now()), "stream recovered"); n != 1 {
		t.Errorf("%d 'stream recovered' lines after the grant, want 1", n)
	}
	select {
	case <-r.Done():
		t.Fatalf("the relay stopped: %v", r.Err())
	default:
	}
}
