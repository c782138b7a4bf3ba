package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/relaytest"
	"github.com/compensa/compensa/test/testkit"
)

type readmeBlock struct{ lang, body string }

// quickstartBlocks returns the fenced blocks between docs/getting-started.md's quickstart
// markers, in order.
func quickstartBlocks(t *testing.T) []readmeBlock {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	b, err := os.ReadFile(filepath.Join(filepath.Dir(file), "..", "..", "docs", "getting-started.md"))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	start := strings.Index(s, "<!-- quickstart")
	end := strings.Index(s, "<!-- /quickstart -->")
	if start < 0 || end < start {
		t.Fatal("docs/getting-started.md has no <!-- quickstart --> ... <!-- /quickstart --> section")
	}
	var out []readmeBlock
	for _, m := range regexp.MustCompile("(?s)```(\\w+)\n(.*?)```").FindAllStringSubmatch(s[start:end], -1) {
		out = append(out, readmeBlock{m[1], m[2]})
	}
	return out
}

func sqlStatements(body string) []string {
	var out []string
	for _, st := range strings.Split(body, ";") {
		var lines []string
		for _, l := range strings.Split(st, "\n") {
			if l, _, _ = strings.Cut(l, "--"); strings.TrimSpace(l) != "" {
				lines = append(lines, l)
			}
		}
		if len(lines) > 0 {
			out = append(out, strings.Join(lines, "\n"))
		}
	}
	return out
}

func metricValue(t *testing.T, addr, series string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return -1
}

// The quickstart, followed as docs/getting-started.md writes it, with two roles: a schema
// owner that migrates and a least-privilege role that runs. Then the example
// saga, added the same way, runs to completion under the unprivileged role.
func TestQuickstartWithTwoRoles(t *testing.T) {
	ctx := context.Background()
	db := pgtest.NewEmptyDB(t)
	u, err := url.Parse(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	// The page's placeholders: host db:5432, database app.
	local := func(s string) string {
		s = strings.ReplaceAll(s, "db:5432/app", u.Host+"/"+db.Name)
		return strings.ReplaceAll(s, "DATABASE app ", "DATABASE "+db.Name+" ")
	}
	t.Cleanup(func() {
		pgtest.Drop(db.Cluster, db.Name)
		if admin, err := pgx.Connect(context.Background(), db.Cluster.URL); err == nil {
			admin.Exec(context.Background(), `DROP ROLE IF EXISTS relay`)
			admin.Exec(context.Background(), `DROP ROLE IF EXISTS app_owner`)
			admin.Close(context.Background())
		}
	})
	super, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer super.Close(ctx)

	blocks := quickstartBlocks(t)
	var langs []string
	for _, b := range blocks {
		langs = append(langs, b.lang)
	}
	if strings.Join(langs, ",") != "sql,sh,yaml,sh" {
		t.Fatalf("the quickstart's blocks are %v; this test follows superuser SQL, migrate --grant-to, the sinks file, run --sinks", langs)
	}
	// A shell block: `export NAME=VALUE` lines (the password, kept off the
	// command line and out of ps), then one `relay ...` command.
	shCommand := func(b readmeBlock, want string) (env, args []string) {
		for _, line := range strings.Split(local(b.body), "\n") {
			line, _, _ = strings.Cut(line, "#")
			f := strings.Fields(line)
			switch {
			case len(f) == 0:
			case f[0] == "export" && len(f) == 2 && strings.Contains(f[1], "="):
				env = append(env, f[1])
			case len(f) >= 2 && f[0] == "relay" && f[1] == want && args == nil:
				args = f[1:]
			default:
				t.Fatalf("quickstart block %q: line %q is neither export NAME=VALUE nor `relay %s ...`", b.body, line, want)
			}
		}
		if args == nil {
			t.Fatalf("quickstart block %q has no `relay %s ...`", b.body, want)
		}
		for _, a := range args {
			if u, err := url.Parse(a); err == nil && u.User != nil {
				if _, has := u.User.Password(); has {
					t.Fatalf("quickstart block %q puts a password on the command line", b.body)
				}
			}
		}
		return env, args
	}
	migrateEnv, migrate := shCommand(blocks[1], "migrate")
	if !slices.Contains(migrateEnv, "PGPASSWORD=owner-secret") {
		t.Fatalf("the quickstart's migrate does not give the owner's password in PGPASSWORD: %v", migrateEnv)
	}
	if !slices.Contains(migrate, "--grant-to") {
		t.Fatalf("the quickstart's migrate does not grant the relay's role: %v", migrate)
	}
	// The webhook the sinks file names: it answers 503 until the test lets
	// it through, so that the relay's role parks an event first.
	hook := newQuickstartHook()
	srv := httptest.NewServer(hook)
	defer srv.Close()
	sinksFile := filepath.Join(t.TempDir(), "sinks.yaml")
	if !strings.Contains(blocks[2].body, "http://127.0.0.1:8099/events") {
		t.Fatalf("the quickstart's sinks file does not name the webhook this test serves:\n%s", blocks[2].body)
	}
	if err := os.WriteFile(sinksFile, []byte(strings.ReplaceAll(blocks[2].body, "http://127.0.0.1:8099", srv.URL)), 0o600); err != nil {
		t.Fatal(err)
	}
	runEnv, run := shCommand(blocks[3], "run")
	if !slices.Contains(runEnv, "PGPASSWORD=relay-secret") {
		t.Fatalf("the quickstart's run does not give the relay's password in PGPASSWORD: %v", runEnv)
	}
	if i := slices.Index(run, "sinks.yaml"); i < 0 || run[i-1] != "--sinks" {
		t.Fatalf("the quickstart's run has no --sinks sinks.yaml: %v", run)
	}
	run[slices.Index(run, "sinks.yaml")] = sinksFile

	// 1. As a superuser. Right after the owner's role exists, before its
	//    grants, relay migrate says what is missing and how to grant it.
	stmts := sqlStatements(local(blocks[0].body))
	for i, st := range stmts {
		if _, err := super.Exec(ctx, st); err != nil {
			t.Fatalf("superuser block: %s: %v", st, err)
		}
		if i == 0 {
			out, code := relaytest.Run(t, migrateEnv, migrate...)
			if code == 0 || !strings.Contains(out, `GRANT CREATE ON SCHEMA public TO "app_owner"`) || !strings.Contains(out, `role "app_owner" lacks CREATE on schema public`) {
				t.Fatalf("migrate without the grants: code %d, want the missing privilege and its GRANT:\n%s", code, out)
			}
		}
	}

	// 2. As the schema owner.
	out, code := relaytest.Run(t, migrateEnv, migrate...)
	if code != 0 || !strings.Contains(out, "applied core 0001") ||
		!strings.Contains(out, `GRANT USAGE ON SEQUENCE relay_sink_parked_seq_seq TO "relay";`) ||
		!strings.Contains(out, "created publication relay_outbox_pub") {
		t.Fatalf("relay migrate --grant-to as the schema owner: code %d; want the migrations, the grants and the publication:\n%s", code, out)
	}
	// Idempotent: a second run migrates and grants nothing.
	out, code = relaytest.Run(t, migrateEnv, migrate...)
	if code != 0 || !strings.Contains(out, "schema is up to date") || !strings.Contains(out, "role relay already has every privilege relay run needs") || strings.Contains(out, "GRANT") {
		t.Fatalf("relay migrate --grant-to, again: code %d\n%s", code, out)
	}
	ownerURL := local("postgres://app_owner:owner-secret@db:5432/app")
	owner, err := pgx.Connect(ctx, ownerURL)
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close(ctx)
	// The relay's role migrating the up-to-date schema: a no-op.
	relayMigrate := slices.Clone(migrate)
	for i, a := range relayMigrate {
		if strings.HasPrefix(a, "postgres://") {
			relayMigrate[i] = local("postgres://relay:relay-secret@db:5432/app")
		}
	}
	relayMigrate = slices.DeleteFunc(relayMigrate, func(a string) bool { return a == "--grant-to" || a == "relay" })
	if out, code := relaytest.Run(t, nil, relayMigrate...); code != 0 || !strings.Contains(out, "schema is up to date") {
		t.Fatalf("relay migrate as the relay's role on an up-to-date schema: code %d\n%s", code, out)
	}

	// 3. As the relay's role: it streams, and an event no saga listens to
	//    is counted as ignored.
	var rolsuper, rolrepl bool
	super.QueryRow(ctx, `SELECT rolsuper, rolreplication FROM pg_roles WHERE rolname = 'relay'`).Scan(&rolsuper, &rolrepl)
	if rolsuper || !rolrepl {
		t.Fatalf("the relay's role: superuser %v, replication %v", rolsuper, rolrepl)
	}
	p := relaytest.Start(t, runEnv, append(run[1:], "--status-interval", "200ms", "--heartbeat-interval", "1s")...)
	if _, err := owner.Exec(ctx, `INSERT INTO outbox (tenant_id, aggregate_type, aggregate_id, event_type, payload)
		VALUES ($1, 'order', '42', 'order.placed', '{"total": 10}')`, uuid.New()); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 30*time.Second, `compensa_events_total{outcome="ignored"} to count the event no saga listens to`, func() bool {
		return metricValue(t, p.Addr, `compensa_events_total{outcome="ignored"}`) >= 1
	})
	// The webhook is down: the relay's role parks the event (a row and its
	// sequence), then delivers it once the webhook is back.
	testkit.WaitFor(t, 30*time.Second, "the event parked while the webhook answers 503", func() bool {
		var n int
		super.QueryRow(ctx, `SELECT count(*) FROM relay_sink_parked WHERE sink = 'events'`).Scan(&n)
		return n == 1
	})
	hook.up.Store(true)
	testkit.WaitFor(t, 60*time.Second, "the parked event delivered once the webhook is back", func() bool {
		var n int
		super.QueryRow(ctx, `SELECT count(*) FROM relay_sink_parked`).Scan(&n)
		return n == 0 && hook.delivered.Load() >= 1
	})
	if strings.Contains(p.Output(), "permission denied") {
		t.Fatalf("the relay's role met a permission error:\n%s", p.Output())
	}
	p.Stop(30 * time.Second)
	if !strings.Contains(p.Output(), "no sagas registered") {
		t.Errorf("a relay with no sagas does not say so at start:\n%s", p.Output())
	}
	if strings.Contains(p.Output(), "relay-secret") {
		t.Fatal("the relay's password appears in its output")
	}

	// 4. The example saga, added the same way: the owner migrates the example
	//    schema and grants what its steps touch ("plus what your saga steps
	//    read and write"); the relay's role runs it to completion.
	out, code = relaytest.Run(t, migrateEnv, append(migrate, "--with-examples")...)
	if code != 0 {
		t.Fatalf("migrate --with-examples: code %d\n%s", code, out)
	}
	for _, st := range []string{
		`GRANT SELECT, UPDATE ON research_briefs TO relay`,
		`GRANT SELECT ON documents TO relay`,
		`GRANT SELECT, INSERT, DELETE ON brief_sources TO relay`,
	} {
		if _, err := owner.Exec(ctx, st); err != nil {
			t.Fatalf("%s: %v", st, err)
		}
	}
	p = relaytest.Start(t, runEnv, append(run[1:], "--with-examples", "--status-interval", "200ms", "--heartbeat-interval", "1s")...)
	brief, tenant := uuid.New(), uuid.New()
	tx, err := owner.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tx.Exec(ctx, `INSERT INTO research_briefs (id, tenant_id, title, body) VALUES ($1, $2, 'Quickstart', 'Outbox relays.')`, brief, tenant)
	if _, err := tx.Exec(ctx, plainSQLInsert, tenant, brief.String(), fmt.Sprintf(`{"brief_id": %q}`, brief)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var n int
		super.QueryRow(ctx, `SELECT count(*) FROM saga_instances WHERE status = 'COMPLETED' AND tenant_id = $1`, tenant).Scan(&n)
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the example saga did not complete within 60s under the relay's role; its output:\n%s", p.Output())
		}
	}
	if !strings.Contains(p.Output(), `msg="saga registered" saga=brief_enrichment@v1`) || !strings.Contains(p.Output(), "triggers=research_brief.created") {
		t.Errorf("the relay does not log its sagas and their triggers at start:\n%s", p.Output())
	}
	if v := metricValue(t, p.Addr, `compensa_events_total{outcome="started"}`); v < 1 {
		t.Fatalf(`compensa_events_total{outcome="started"} = %v after a saga started`, v)
	}
	p.Stop(30 * time.Second)
}

// quickstartHook is the quickstart's webhook: 503 until up is set, then 200.
type quickstartHook struct {
	up        atomic.Bool
	delivered atomic.Int64
}

func newQuickstartHook() *quickstartHook { return &quickstartHook{} }

func (h *quickstartHook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	if !h.up.Load() {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	h.delivered.Add(1)
	w.WriteHeader(http.StatusOK)
}
