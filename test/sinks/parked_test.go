package sinks

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/compensa/compensa/internal/apitoken"
	"github.com/compensa/compensa/internal/httpapi"
	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/sink"
	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/relaytest"
	"github.com/compensa/compensa/test/testkit"
)

// logLines collects the JSON log lines of a slog handler.
type logLines struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// records returns the records whose message starts with msg.
func (l *logLines) records(t *testing.T, msg string) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(l.buf.String()), "\n") {
		var rec map[string]any
		if line == "" {
			continue
		}
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if m, _ := rec["msg"].(string); strings.HasPrefix(m, msg) {
			out = append(out, rec)
		}
	}
	return out
}

// parkedEvent is one event the test writes.
type parkedEvent struct {
	name, agg string
	tenant    uuid.UUID
}

// api calls the monitor with a bearer token.
func api(t *testing.T, srv *httptest.Server, token, method, path, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, raw)
	}
	return resp.StatusCode, out
}

// itemIDs reads the event ids of a parked listing, in its order.
func itemIDs(t *testing.T, listing map[string]any) []string {
	t.Helper()
	items, ok := listing["items"].([]any)
	if !ok {
		t.Fatalf("no items in %v", listing)
	}
	out := []string{}
	for _, it := range items {
		out = append(out, it.(map[string]any)["event_id"].(string))
	}
	return out
}

// TestParkedEventsListedAndSkipped: a webhook refuses two events with 422
// for good. They are parked with the reason, their aggregates' later events
// queue behind them, other aggregates flow; the refusals, however many,
// are one WARN per status; `relay sinks list` shows the last reason;
// `relay sinks parked` and GET /v1/sinks/{name}/parked list them in
// delivery order (a tenant-scoped token its tenant's only); a skip through
// the API and one through the CLI move each into relay_sink_skipped with
// who, when and why, and the aggregate's later events are then delivered
// in order. Skips of an unknown event, another sink's event or another
// tenant's event are refused with a clear error.
func TestParkedEventsListedAndSkipped(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	logs := &logLines{}
	logger := slog.New(slog.NewJSONHandler(logs, nil))
	b := setupOn(t, pgtest.NewDB(t), 2*time.Second, 0, func(c *sink.FanoutConfig) { c.Logger = logger })
	db := b.db
	tenant1, tenant2 := uuid.New(), uuid.New()

	// A1 and C1 are refused for good; B is another aggregate.
	evs := []parkedEvent{{"A1", "a", tenant1}, {"B1", "b", tenant2}, {"A2", "a", tenant1}, {"C1", "c", tenant2},
		{"B2", "b", tenant2}, {"A3", "a", tenant1}, {"C2", "c", tenant2}}
	// The ids are chosen by outbox.Write; the refusal must be in place
	// before the event streams, so A1 and C1 are written first with ids of
	// their own.
	idA1, idC1 := uuid.NewString(), uuid.NewString()
	b.ep.refuse.Store(idA1, 422)
	b.ep.refuse.Store(idC1, 422)
	ids := map[string]string{}
	for _, e := range evs {
		tx, err := db.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		m := outbox.Message{TenantID: e.tenant, AggregateType: "order", AggregateID: e.agg, EventType: "order.placed", Payload: map[string]string{"name": e.name}}
		switch e.name {
		case "A1":
			m.ID = uuid.MustParse(idA1)
		case "C1":
			m.ID = uuid.MustParse(idC1)
		}
		ms := []outbox.Message{m}
		if err := outbox.Write(ctx, tx, ms...); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		ids[e.name] = ms[0].ID.String()
	}
	name := map[string]string{}
	for n, id := range ids {
		name[id] = n
	}
	names := func(idList []string) []string {
		out := []string{}
		for _, id := range idList {
			out = append(out, name[id])
		}
		return out
	}

	// Other aggregates are unaffected; the refused ones are parked with
	// their aggregates' later events behind them.
	testkit.WaitFor(t, 30*time.Second, "B1 and B2 delivered", func() bool { return len(b.ep.ids()) == 2 })
	if got := names(b.ep.ids()); !slices.Equal(got, []string{"B1", "B2"}) {
		t.Fatalf("delivered %v, want [B1 B2]", got)
	}
	testkit.WaitFor(t, 30*time.Second, "five events parked", func() bool {
		return count(t, db, `SELECT count(*) FROM relay_sink_parked WHERE sink = 'hook'`) == 5
	})

	// A burst of refusals: the drainer retries both heads with backoff.
	testkit.WaitFor(t, 30*time.Second, "a burst of 422 answers", func() bool { return b.ep.refused.Load() >= 12 })
	const refusedMsg = "destination refused events"
	if warns := logs.records(t, refusedMsg); len(warns) != 1 || warns[0]["level"] != "WARN" || warns[0]["sink"] != "hook" ||
		warns[0]["status"] != 422.0 || !strings.Contains(warns[0]["reason"].(string), "answered 422") {
		t.Fatalf("%d refusals logged as %v; want one WARN with sink hook, status 422 and the reason", b.ep.refused.Load(), warns)
	}
	// Another status is logged at once, once.
	idF := uuid.NewString()
	b.ep.refuse.Store(idF, 400)
	tx, _ := db.Pool.Begin(ctx)
	if err := outbox.Write(ctx, tx, outbox.Message{ID: uuid.MustParse(idF), TenantID: tenant1, AggregateType: "order", AggregateID: "f", EventType: "order.placed"}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	name[idF] = "F1"
	testkit.WaitFor(t, 30*time.Second, "the 400 logged", func() bool { return len(logs.records(t, refusedMsg)) == 2 })
	n400 := b.ep.refused.Load()
	testkit.WaitFor(t, 30*time.Second, "more refusals", func() bool { return b.ep.refused.Load() >= n400+6 })
	if warns := logs.records(t, refusedMsg); len(warns) != 2 || warns[1]["status"] != 400.0 {
		t.Fatalf("after a 400: %v; want a second WARN, for status 400", warns)
	}

	// relay sinks list shows the reason of the last failure.
	env := []string{"RELAY_DATABASE_URL=" + db.URL}
	testkit.WaitFor(t, 10*time.Second, "last_reason", func() bool {
		st, err := sink.List(ctx, db.Pool)
		return err == nil && len(st) == 1 && strings.Contains(st[0].LastReason, "answered 4")
	})
	out, code := relaytest.Run(t, env, "sinks", "list", "--json")
	if code != 0 || !strings.Contains(out, `"last_reason":"POST `+b.ep.srv.URL+` answered 4`) {
		t.Fatalf("relay sinks list --json: exit %d\n%s", code, out)
	}
	out, code = relaytest.Run(t, env, "sinks", "list")
	if code != 0 || !strings.Contains(out, "LAST REASON") || !strings.Contains(out, "answered 4") {
		t.Fatalf("relay sinks list: exit %d\n%s", code, out)
	}

	// relay sinks parked: in delivery order, heads marked, with reasons.
	out, code = relaytest.Run(t, env, "sinks", "parked", "hook", "--json")
	var listing map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &listing) != nil {
		t.Fatalf("relay sinks parked --json: exit %d\n%s", code, out)
	}
	if got := names(itemIDs(t, listing)); !inAggregateOrder(got, "A1", "A2", "A3", "C1", "C2", "F1") {
		t.Fatalf("relay sinks parked lists %v, want A1 A2 A3 C1 C2 F1, each aggregate's in commit order", got)
	}
	for _, it := range listing["items"].([]any) {
		e := it.(map[string]any)
		n := name[e["event_id"].(string)]
		head := n == "A1" || n == "C1" || n == "F1"
		if e["head"] != head || e["aggregate_type"] != "order" || e["event_type"] != "order.placed" || e["age_seconds"].(float64) <= 0 {
			t.Errorf("%s: %v", n, e)
		}
		if head && (e["attempts"].(float64) < 1 || !strings.Contains(e["reason"].(string), "answered 4") || e["next_attempt_at"] == nil) {
			t.Errorf("head %s: %v; want attempts, the refusal and the next attempt", n, e)
		}
		if !head && !strings.Contains(e["reason"].(string), "behind") {
			t.Errorf("%s waits behind its head, but the reason says %q", n, e["reason"])
		}
	}
	first2 := itemIDs(t, listing)[:2]
	out, code = relaytest.Run(t, env, "sinks", "parked", "hook", "--limit", "2")
	if code != 0 || !strings.Contains(out, "REASON") || !strings.Contains(out, first2[0]) || !strings.Contains(out, first2[1]) ||
		strings.Contains(out, ids["C2"]) || !strings.Contains(out, "--limit shows more") {
		t.Fatalf("relay sinks parked --limit 2: exit %d\n%s", code, out)
	}
	if out, code := relaytest.Run(t, env, "sinks", "parked", "nope"); code != 2 || !strings.Contains(out, `sink "nope": no such sink`) {
		t.Fatalf("relay sinks parked of an unknown sink: exit %d\n%s", code, out)
	}

	// The API: the * token sees all, a tenant-scoped token its own only.
	tokens, err := apitoken.Parse("tokens.yaml", []byte(fmt.Sprintf(`tokens:
  - {name: ops, token_env: OPS, tenant: "*", role: operate}
  - {name: t1-ops, token_env: T1, tenant: %s, role: operate}
`, tenant1)), func(k string) string {
		return map[string]string{"OPS": "ops-token-every-tenant-0123456789", "T1": "t1-token-one-tenant-0123456789ab"}[k]
	})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := httpapi.New(httpapi.Config{Pool: db.Pool, Tokens: tokens})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	defer hs.Close()
	const ops, t1 = "ops-token-every-tenant-0123456789", "t1-token-one-tenant-0123456789ab"
	if code, body := api(t, hs, ops, "GET", "/v1/sinks/hook/parked", ""); code != 200 || !inAggregateOrder(names(itemIDs(t, body)), "A1", "A2", "A3", "C1", "C2", "F1") {
		t.Fatalf("GET parked as ops: %d %v", code, body)
	}
	if code, body := api(t, hs, t1, "GET", "/v1/sinks/hook/parked", ""); code != 200 || !inAggregateOrder(names(itemIDs(t, body)), "A1", "A2", "A3", "F1") {
		t.Fatalf("GET parked as tenant 1: %d %v; want its own events only", code, body)
	}
	if code, body := api(t, hs, ops, "GET", "/v1/sinks/hook/parked?limit=1", ""); code != 200 || !slices.Equal(names(itemIDs(t, body)), []string{"A1"}) {
		t.Fatalf("GET parked?limit=1: %d %v", code, body)
	}
	if code, _ := api(t, hs, ops, "GET", "/v1/sinks/nope/parked", ""); code != 404 {
		t.Fatalf("GET parked of an unknown sink: %d, want 404", code)
	}
	if code, body := api(t, hs, t1, "POST", "/v1/sinks/hook/parked/"+ids["C1"]+"/skip", `{"reason": "not mine"}`); code != 404 {
		t.Fatalf("tenant 1 skips tenant 2's event: %d %v, want 404, as for an unknown id", code, body)
	}
	if code, body := api(t, hs, ops, "POST", "/v1/sinks/hook/parked/"+ids["A1"]+"/skip", `{}`); code != 400 || !strings.Contains(body["error"].(string), "reason") {
		t.Fatalf("skip without a reason: %d %v, want 400", code, body)
	}
	if code, _ := api(t, hs, ops, "POST", "/v1/sinks/hook/parked/"+uuid.NewString()+"/skip", `{"reason": "r"}`); code != 404 {
		t.Fatalf("skip of an unknown event: %d, want 404", code)
	}
	if got := names(b.ep.ids()); !slices.Equal(got, []string{"B1", "B2"}) {
		t.Fatalf("refused skips let events through: delivered %v", got)
	}

	// Skip A1 through the API: A2 and A3 follow, in order.
	code, res := api(t, hs, ops, "POST", "/v1/sinks/hook/parked/"+ids["A1"]+"/skip", `{"reason": "the receiver rejects this order for good"}`)
	if code != 200 || res["skipped_by"] != "ops" || res["event_id"] != ids["A1"] || !strings.Contains(res["reason"].(string), "answered 422") {
		t.Fatalf("skip A1: %d %v", code, res)
	}
	testkit.WaitFor(t, 30*time.Second, "A2 and A3 delivered after the skip", func() bool { return len(b.ep.ids()) == 4 })
	if got := names(b.ep.ids()); !slices.Equal(got, []string{"B1", "B2", "A2", "A3"}) {
		t.Fatalf("delivered %v, want [B1 B2 A2 A3]", got)
	}
	var role string
	db.Pool.QueryRow(ctx, `SELECT current_user`).Scan(&role)
	if n := count(t, db, `SELECT count(*) FROM relay_sink_skipped WHERE sink = 'hook' AND event_id = $1 AND skipped_by = 'ops'
		AND skipped_role = $2 AND skip_reason = 'the receiver rejects this order for good' AND reason LIKE '%answered 422%'
		AND attempts >= 1 AND skipped_at BETWEEN now() - interval '1 minute' AND now() AND event->>'id' = $1
		AND event->>'tenant_id' = $3`, ids["A1"], role, tenant1.String()); n != 1 {
		t.Fatalf("%d rows in relay_sink_skipped for A1 with who, when, why and the event, want 1", n)
	}

	// The CLI: bad skips are usage errors that say what is wrong.
	if _, err := db.Pool.Exec(ctx, `INSERT INTO relay_sinks (name, kind) VALUES ('other', 'webhook');
		INSERT INTO relay_sink_parked (sink, event_id, aggregate_key, event, reason) VALUES ('other', 'x-1', 'k', '{"id": "x-1"}', 'seed')`); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"hook", "--id", "x-1", "--reason", "r"}, `event "x-1" is not parked for it (it is parked for sink other`},
		{[]string{"hook", "--id", ids["A1"], "--reason", "r"}, "is not parked for it"},
		{[]string{"nope", "--id", ids["C1"], "--reason", "r"}, `sink "nope": no such sink`},
		{[]string{"hook", "--id", ids["C1"]}, "--reason is required"},
		{[]string{"hook", "--reason", "r"}, "--id is required"},
	} {
		out, code := relaytest.Run(t, env, append([]string{"sinks", "skip"}, c.args...)...)
		if code != 2 || !strings.Contains(out, c.want) {
			t.Errorf("relay sinks skip %v: exit %d\n%s\nwant exit 2 and %q", c.args, code, out, c.want)
		}
	}
	if n := count(t, db, `SELECT count(*) FROM relay_sink_skipped`); n != 1 {
		t.Fatalf("%d skipped rows after refused skips, want 1", n)
	}

	// Skip C1 through the CLI: C2 follows.
	out, code = relaytest.Run(t, env, "sinks", "skip", "hook", "--id", ids["C1"], "--reason", "duplicate of an order already settled", "--actor", "alice")
	if code != 0 || !strings.Contains(out, "skipped by alice") {
		t.Fatalf("relay sinks skip: exit %d\n%s", code, out)
	}
	testkit.WaitFor(t, 30*time.Second, "C2 delivered after the skip", func() bool { return len(b.ep.ids()) == 5 })
	if got := names(b.ep.ids()); !slices.Equal(got, []string{"B1", "B2", "A2", "A3", "C2"}) {
		t.Fatalf("delivered %v, want [B1 B2 A2 A3 C2]", got)
	}
	if n := count(t, db, `SELECT count(*) FROM relay_sink_skipped WHERE event_id = $1 AND skipped_by = 'alice'
		AND skip_reason = 'duplicate of an order already settled'`, ids["C1"]); n != 1 {
		t.Fatalf("%d rows in relay_sink_skipped for C1 by alice, want 1", n)
	}
	// What is left parked: F1 (still refused) and the other sink's row;
	// nothing was lost: every event is delivered, parked or skipped.
	if got := parkedIDs(t, db); len(got) != 1 || !got[idF] {
		t.Fatalf("parked for hook: %v, want only F1", got)
	}
	if got := names(b.ep.ids()); slices.Contains(got, "A1") || slices.Contains(got, "C1") {
		t.Fatalf("a skipped event was delivered: %v", got)
	}
}

// inAggregateOrder reports whether got holds exactly want, the events of
// each aggregate (the letter of a name) in the order want gives them.
func inAggregateOrder(got []string, want ...string) bool {
	if len(got) != len(want) {
		return false
	}
	byAgg := func(names []string) map[byte][]string {
		out := map[byte][]string{}
		for _, n := range names {
			out[n[0]] = append(out[n[0]], n)
		}
		return out
	}
	g, w := byAgg(got), byAgg(want)
	for k, v := range w {
		if !slices.Equal(g[k], v) {
			return false
		}
	}
	return len(g) == len(w)
}
