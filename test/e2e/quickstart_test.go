package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/relaytest"
)

type readmeBlock struct{ lang, body string }

// quickstartBlocks returns the fenced blocks between README.md's quickstart
// markers, in order.
func quickstartBlocks(t *testing.T) []readmeBlock {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	b, err := os.ReadFile(filepath.Join(filepath.Dir(file), "..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	start := strings.Index(s, "<!-- quickstart")
	end := strings.Index(s, "<!-- /quickstart -->")
	if start < 0 || end < start {
		t.Fatal("README.md has no <!-- quickstart --> ... <!-- /quickstart --> section")
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

// The quickstart, followed as README.md writes it, with two roles: a schema
// owner that migrates and a least-privilege role that runs. Then the example
// saga, added the same way, runs to completion under the unprivileged role.
func TestQuickstartWithTwoRoles(t *testing.T) {
	ctx := context.Background()
	db := pgtest.NewEmptyDB(t)
	u, err := url.Parse(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	// The README's placeholders: host db:5432, database app.
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
	if strings.Join(langs, ",") != "sql,sh,sql,sh" {
		t.Fatalf("the quickstart's blocks are %v; this test follows superuser SQL, migrate, owner SQL, run", langs)
	}
	shCommand := func(b readmeBlock, want string) []string {
		f := strings.Fields(local(b.body))
		if len(f) < 2 || f[0] != "relay" || f[1] != want {
			t.Fatalf("quickstart block %q is not `relay %s ...`", b.body, want)
		}
		return f[1:]
	}
	migrate := shCommand(blocks[1], "migrate")
	run := shCommand(blocks[3], "run")

	// 1. As a superuser. Right after the owner's role exists, before its
	//    grants, relay migrate says what is missing and how to grant it.
	stmts := sqlStatements(local(blocks[0].body))
	for i, st := range stmts {
		if _, err := super.Exec(ctx, st); err != nil {
			t.Fatalf("superuser block: %s: %v", st, err)
		}
		if i == 0 {
			out, code := relaytest.Run(t, nil, migrate...)
			if code == 0 || !strings.Contains(out, `GRANT CREATE ON SCHEMA public TO "app_owner"`) || !strings.Contains(out, `role "app_owner" lacks CREATE on schema public`) {
				t.Fatalf("migrate without the grants: code %d, want the missing privilege and its GRANT:\n%s", code, out)
			}
		}
	}

	// 2. As the schema owner.
	out, code := relaytest.Run(t, nil, migrate...)
	if code != 0 || !strings.Contains(out, "applied core 0001") {
		t.Fatalf("relay migrate as the schema owner: code %d\n%s", code, out)
	}
	ownerURL := local("postgres://app_owner:owner-secret@db:5432/app")
	owner, err := pgx.Connect(ctx, ownerURL)
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close(ctx)
	for _, st := range sqlStatements(local(blocks[2].body)) {
		if _, err := owner.Exec(ctx, st); err != nil {
			t.Fatalf("owner block: %s: %v", st, err)
		}
	}

	// 3. As the relay's role: it streams, and an event no saga listens to
	//    is counted as ignored.
	var rolsuper, rolrepl bool
	super.QueryRow(ctx, `SELECT rolsuper, rolreplication FROM pg_roles WHERE rolname = 'relay'`).Scan(&rolsuper, &rolrepl)
	if rolsuper || !rolrepl {
		t.Fatalf("the relay's role: superuser %v, replication %v", rolsuper, rolrepl)
	}
	p := relaytest.Start(t, nil, append(run[1:], "--status-interval", "200ms", "--heartbeat-interval", "1s")...)
	if _, err := owner.Exec(ctx, `INSERT INTO outbox (tenant_id, aggregate_type, aggregate_id, event_type, payload)
		VALUES ($1, 'order', '42', 'order.placed', '{"total": 10}')`, uuid.New()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, `compensa_events_total{outcome="ignored"} to count the event no saga listens to`, func() bool {
		return metricValue(t, p.Addr, `compensa_events_total{outcome="ignored"}`) >= 1
	})
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
	out, code = relaytest.Run(t, nil, append(migrate, "--with-examples")...)
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
	p = relaytest.Start(t, nil, append(run[1:], "--status-interval", "200ms", "--heartbeat-interval", "1s")...)
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
	waitFor(t, 60*time.Second, "the example saga to complete under the relay's role", func() bool {
		var n int
		super.QueryRow(ctx, `SELECT count(*) FROM saga_instances WHERE status = 'COMPLETED' AND tenant_id = $1`, tenant).Scan(&n)
		return n == 1
	})
	if !strings.Contains(p.Output(), `msg="saga registered" saga=brief_enrichment@v1`) || !strings.Contains(p.Output(), "triggers=research_brief.created") {
		t.Errorf("the relay does not log its sagas and their triggers at start:\n%s", p.Output())
	}
	if v := metricValue(t, p.Addr, `compensa_events_total{outcome="started"}`); v < 1 {
		t.Fatalf(`compensa_events_total{outcome="started"} = %v after a saga started`, v)
	}
	p.Stop(30 * time.Second)
}
