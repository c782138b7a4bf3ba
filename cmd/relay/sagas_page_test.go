package main

import (
	"context"
	"html"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/compensa/compensa/internal/httpapi"
	"github.com/compensa/compensa/migrations"
	"github.com/compensa/compensa/saga/pgjournal"
	"github.com/compensa/compensa/test/sagamix"
)

// TestSagasListAndThePageAgree: `relay sagas list` and the monitor's list
// say the same thing about every row of a mixed set (running, waiting for a
// reply, failed, compensated, completed), cell by cell.
func TestSagasListAndThePageAgree(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, pool := migratedCluster(ctx, t, migrations.Options{})
	j, err := pgjournal.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	set := sagamix.Write(t, j, uuid.New())

	// The page, with the registry the CLI uses against this database.
	reg, err := registryFor(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := httpapi.New(httpapi.Config{Pool: pool, Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	defer ts.Close()
	res, err := http.Get(ts.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	page := pageRows(t, string(body))

	out, err := runSagas(t, c.URL, "sagas", "list")
	if err != nil {
		t.Fatalf("sagas list: %v\n%s", err, out)
	}
	cli := cliRows(t, out)
	t.Logf("relay sagas list:\n%s", out)

	for _, id := range set.All() {
		p, ok := page[id.String()]
		if !ok {
			t.Fatalf("the page does not list %s", id)
		}
		l, ok := cli[id.String()]
		if !ok {
			t.Fatalf("the CLI does not list %s", id)
		}
		if p["id"] != id.String()[24:] {
			t.Errorf("the page shows %s as %q, want its last 12 characters", id, p["id"])
		}
		for _, f := range []string{"saga", "status", "step", "attempt", "next", "stuck", "reason"} {
			if p[f] != l[f] {
				t.Errorf("%s %s: the page says %q, the CLI %q", id, f, p[f], l[f])
			}
		}
	}
	for id, want := range map[uuid.UUID]string{set.Completed: "completed 4/4", set.Compensated: "compensated after score_brief",
		set.Failed: "compensation of reserve failed", set.Waiting: "charge · waiting for a reply", set.Running: "charge"} {
		if got := cli[id.String()]["step"]; got != want {
			t.Errorf("%s: step %q, want %q", id, got, want)
		}
	}
	for _, id := range []uuid.UUID{set.Completed, set.Compensated, set.Failed} {
		if r := cli[id.String()]; r["next"] != "-" || r["attempt"] != "-" {
			t.Errorf("%s has ended or waits for a person, yet shows attempt %q, next attempt %q", id, r["attempt"], r["next"])
		}
	}
}

var (
	pageRowRE   = regexp.MustCompile(`(?s)<tr data-id="([0-9a-f-]{36})" class="instance-row">(.*?)</tr>`)
	pageIDRE    = regexp.MustCompile(`(?s)<a [^>]*class="id"[^>]*><code>(.*?)</code>`)
	pageTdRE    = regexp.MustCompile(`(?s)<td[^>]*data-field="(\w+)"[^>]*>(.*?)</td>`)
	pageSpanRE  = regexp.MustCompile(`(?s)<span[^>]*data-field="(\w+)"[^>]*>(.*?)</span>`)
	tagRE       = regexp.MustCompile(`<[^>]*>`)
	cliColumnRE = regexp.MustCompile(`\s{2,}`)
)

// norm is a cell as a person reads it: no markup, one space, "-" for none.
func norm(s string) string {
	s = strings.Join(strings.Fields(html.UnescapeString(tagRE.ReplaceAllString(s, ""))), " ")
	if s == "—" || s == "" {
		return "-"
	}
	return s
}

// pageRows reads the list's rows, by instance id.
func pageRows(t *testing.T, body string) map[string]map[string]string {
	t.Helper()
	rows := map[string]map[string]string{}
	for _, m := range pageRowRE.FindAllStringSubmatch(body, -1) {
		r := map[string]string{"stuck": "-"}
		if id := pageIDRE.FindStringSubmatch(m[2]); id != nil {
			r["id"] = id[1]
		}
		for _, c := range pageTdRE.FindAllStringSubmatch(m[2], -1) {
			r[c[1]] = norm(c[2])
		}
		for _, c := range pageSpanRE.FindAllStringSubmatch(m[2], -1) {
			r[c[1]] = norm(strings.TrimPrefix(c[2], "stuck: "))
		}
		rows[m[1]] = r
	}
	if len(rows) == 0 {
		t.Fatalf("no instance rows on the page:\n%s", body)
	}
	return rows
}

// cliRows reads `relay sagas list`'s table, by instance id.
func cliRows(t *testing.T, out string) map[string]map[string]string {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	want := []string{"ID", "SAGA", "STATUS", "STEP", "ATTEMPT", "NEXT ATTEMPT", "STUCK", "REASON"}
	if head := cliColumnRE.Split(strings.TrimSpace(lines[0]), -1); strings.Join(head, "|") != strings.Join(want, "|") {
		t.Fatalf("header %q, want %q", head, want)
	}
	rows := map[string]map[string]string{}
	for _, line := range lines[1:] {
		cells := cliColumnRE.Split(strings.TrimSpace(line), -1)
		if len(cells) != len(want) {
			t.Fatalf("row %q has %d cells, want %d", line, len(cells), len(want))
		}
		rows[cells[0]] = map[string]string{"saga": strings.Replace(cells[1], "@v", " v", 1), "status": cells[2], "step": cells[3],
			"attempt": cells[4], "next": cells[5], "stuck": cells[6], "reason": cells[7]}
	}
	return rows
}
