package relay_test

import (
	"context"
	"html"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/compensa/compensa/internal/pgcluster"
	"github.com/compensa/compensa/migrations"
	"github.com/compensa/compensa/relay"
	"github.com/compensa/compensa/test/testkit"
)

// haltableDB starts a cluster of the test's own (the test stops and starts
// it), creates database name with the relay's schema and the order saga's
// table, and returns the cluster and a superuser URL of the database.
func haltableDB(t *testing.T, name string) (*pgcluster.Cluster, string) {
	t.Helper()
	ctx := context.Background()
	sctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	c, err := pgcluster.Start(sctx, pgcluster.Options{})
	cancel()
	if err != nil {
		t.Fatalf("start a cluster of its own: %v", err)
	}
	t.Cleanup(func() { c.Stop() })
	if c.Kind != pgcluster.KindLocal {
		t.Skipf("this test stops and starts PostgreSQL itself: it needs a local cluster, got %s (unset %s)", c.Kind, pgcluster.EnvURL)
	}
	admin, err := pgx.Connect(ctx, c.URL)
	if err != nil {
		t.Fatal(err)
	}
	_, err = admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	admin.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	u := c.DSN(name)
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := migrations.Apply(ctx, conn, migrations.Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE relay_test_steps (order_id text, step text)`); err != nil {
		t.Fatal(err)
	}
	return c, u
}

// startRelay starts cfg and stops it when the test ends.
func startRelay(t *testing.T, cfg relay.Config) *relay.Relay {
	t.Helper()
	ctx := context.Background()
	r, err := relay.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		r.Stop(sctx)
	})
	return r
}

func cdcLines(lines []map[string]any, prefix string) int {
	var out []map[string]any
	for _, m := range lines {
		if m["component"] == "cdc" {
			out = append(out, m)
		}
	}
	return withMsg(out, prefix)
}

// An idle relay (no outbox rows, heartbeats an hour apart) through a
// database outage: the stream logs its recovery, once, when it streams
// again, not at the next batch, which may be hours away.
func TestStreamLogsRecoveryWhenItReconnects(t *testing.T) {
	testkit.SkipShort(t, "stops and restarts a cluster of its own")
	t.Parallel()
	ctx := context.Background()
	began := time.Now()
	c, dsn := haltableDB(t, "idle")
	t.Logf("cluster ready after %s", time.Since(began).Round(time.Millisecond))
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var logs logLines
	began = time.Now()
	startRelay(t, relay.Config{
		DatabaseURL: dsn, Registry: orderRegistry(t), Workers: 1,
		StatusInterval: 200 * time.Millisecond, HeartbeatInterval: time.Hour,
		HTTPAddr: "127.0.0.1:0", Logger: logs.logger(),
	})
	testkit.WaitFor(t, 30*time.Second, "the stream to stream", func() bool {
		return cdcLines(logs.between(began, time.Now()), "streaming") > 0
	})
	outboxRows := func() int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	rows := outboxRows()

	halted := time.Now()
	if err := c.Halt(true); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 30*time.Second, "the stream to log the outage", func() bool {
		return cdcLines(logs.between(halted, time.Now()), "replication session ended; reconnecting") > 0
	})
	resuming := time.Now()
	rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	err = c.Resume(rctx)
	cancel()
	if err != nil {
		t.Fatalf("start PostgreSQL again: %v", err)
	}
	resumed := time.Now()
	// The reconnect waits for the backoff (at most 15 s) and the server's
	// start-up: a generous deadline, polled.
	testkit.WaitFor(t, 45*time.Second, "the stream to log its recovery with no new outbox row", func() bool {
		return cdcLines(logs.between(resuming, time.Now()), "stream recovered") > 0
	})
	t.Logf("recovery logged %s after PostgreSQL accepted connections again", time.Since(resumed).Round(time.Millisecond))
	time.Sleep(time.Second) // a second line would come at once
	if n := cdcLines(logs.between(resuming, time.Now()), "stream recovered"); n != 1 {
		t.Errorf("%d 'stream recovered' lines, want 1", n)
	}
	if n := outboxRows(); n != rows {
		t.Fatalf("%d outbox rows after the outage, %d before: the recovery must not need a new one", n, rows)
	}
}

// With the database stopped, the page answers with what the relay knows:
// 503, the page rendered with a banner saying the database is unreachable
// and the reasons /readyz gives, and nothing of the database's error nor
// the URL's password.
func TestPageDuringDatabaseOutage(t *testing.T) {
	testkit.SkipShort(t, "stops and restarts a cluster of its own")
	t.Parallel()
	ctx := context.Background()
	c, dsn := haltableDB(t, "pagedown")
	const password = "pw-Zq7TUQ1vN3xR" // trust auth ignores it; it must not show
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	// The cluster commits asynchronously and Halt stops it as a crash
	// would: a commit still in the WAL buffers when the test halts it is
	// lost, and the relay would come back to a database without its role.
	// This commit waits for its WAL.
	_, err = admin.Exec(ctx, `SET synchronous_commit = on; CREATE ROLE pager LOGIN SUPERUSER PASSWORD '`+password+`'`)
	admin.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(dsn)
	u.User = url.UserPassword("pager", password)
	const token = "page-outage-token-6f1c2b9e8d7a4c3b"
	r := startRelay(t, relay.Config{
		DatabaseURL: u.String(), Registry: orderRegistry(t), Workers: 1,
		StatusInterval: 200 * time.Millisecond, StallAfter: 2 * time.Second,
		HTTPAddr: "127.0.0.1:0", APIToken: token, Logger: (&logLines{}).logger(),
	})
	base := "http://" + r.Addr()
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.PostForm(base+"/login", url.Values{"token": {token}, "next": {"/"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	cookie := strings.SplitN(resp.Header.Get("Set-Cookie"), ";", 2)[0]
	if resp.StatusCode != http.StatusSeeOther || cookie == "" {
		t.Fatalf("sign in: %d, cookie %q", resp.StatusCode, cookie)
	}
	get := func(path string) (int, string) {
		req, _ := http.NewRequest("GET", base+path, nil)
		req.Header.Set("Cookie", cookie)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if st, body := get("/"); st != http.StatusOK {
		t.Fatalf("page with the database up: %d\n%s", st, body)
	}

	if err := c.Halt(true); err != nil {
		t.Fatal(err)
	}
	// Once the stream's own reason is there (after StallAfter), the page
	// must carry it as /readyz does.
	var ready readiness
	testkit.WaitFor(t, 30*time.Second, "/readyz to give the database's and the stream's reasons", func() bool {
		ready = probe(t, r.Addr())
		return ready.status == http.StatusServiceUnavailable && len(ready.reasons) >= 2
	})
	st, page := get("/")
	if st != http.StatusServiceUnavailable {
		t.Fatalf("page with the database down: %d, want 503 with the page\n%s", st, page)
	}
	if !strings.Contains(page, `id="outage-banner"`) || !strings.Contains(page, "The database is unreachable") {
		t.Errorf("no outage banner on the page:\n%s", page)
	}
	for _, reason := range ready.reasons {
		// A reason may name how long the stream has been down: compare
		// what comes before the duration.
		want, _, _ := strings.Cut(reason, " for ")
		if !strings.Contains(page, html.EscapeString(want)) {
			t.Errorf("the page lacks the readiness reason %q:\n%s", want, page)
		}
	}
	for _, leak := range []string{password, "SQLSTATE", "internal error"} {
		if strings.Contains(page, leak) {
			t.Errorf("the page shows %q:\n%s", leak, page)
		}
	}
	if st, page := get("/search?q=0123456789ab"); st != http.StatusServiceUnavailable || !strings.Contains(page, `id="outage-banner"`) {
		t.Errorf("search page with the database down: %d\n%s", st, page)
	}

	rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	err = c.Resume(rctx)
	cancel()
	if err != nil {
		t.Fatalf("start PostgreSQL again: %v", err)
	}
	testkit.WaitFor(t, 45*time.Second, "the page to answer 200 again", func() bool {
		st, _ := get("/")
		return st == http.StatusOK
	})
}
