package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/compensa/compensa/internal/apitoken"
	"github.com/compensa/compensa/internal/httpapi"
	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/pgjournal"
	"github.com/compensa/compensa/test/pgtest"
)

// Tokens of the scoped setup.
const (
	opsToken    = "ops-token-every-tenant-0123456789"
	acmeToken   = "acme-token-tenant-a-0123456789ab"
	readerToken = "reader-token-tenant-a-0123456789"
)

// fixture is one tenant's instances, each findable by another id.
type fixture struct {
	failed, running       uuid.UUID
	trigger, correlation  uuid.UUID
	aggregate, commandID  string
	failedJournalVersions int
}

type scoped struct {
	*testBundle
	a, b fixture
	doc  map[string]any
	sc   *jsonschema.Compiler
}

func setupScoped(t *testing.T) *scoped {
	t.Helper()
	tokens, err := apitoken.Parse("tokens.yaml", []byte(fmt.Sprintf(`tokens:
  - {name: ops, token_env: OPS, tenant: "*", role: operate}
  - {name: acme-ops, token_env: ACME, tenant: %s, role: operate}
  - {name: acme-read, token_env: READER, tenant: %s, role: read}
`, tenantA, tenantA)), func(k string) string {
		return map[string]string{"OPS": opsToken, "ACME": acmeToken, "READER": readerToken}[k]
	})
	if err != nil {
		t.Fatal(err)
	}
	s := &scoped{testBundle: &testBundle{db: pgtest.NewDB(t), reg: saga.NewRegistry()}}
	s.reg.MustRegister(orderDef())
	j, err := pgjournal.New(s.db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if s.metrics, err = httpapi.NewMetrics(nil); err != nil {
		t.Fatal(err)
	}
	if s.srv, err = httpapi.New(httpapi.Config{Pool: s.db.Pool, Registry: s.reg, Journal: j, Tokens: tokens, Metrics: s.metrics, OutboxTable: "outbox"}); err != nil {
		t.Fatal(err)
	}
	s.ts = httptest.NewServer(s.srv)
	t.Cleanup(s.ts.Close)
	s.a = s.fixture(t, tenantA, "A")
	s.b = s.fixture(t, tenantB, "B")

	raw, err := os.ReadFile("openapi/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &s.doc); err != nil {
		t.Fatal(err)
	}
	docAny, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	s.sc = jsonschema.NewCompiler()
	s.sc.AssertFormat()
	if err := s.sc.AddResource("openapi.json", docAny); err != nil {
		t.Fatal(err)
	}
	return s
}

// fixture inserts a FAILED and a RUNNING instance of tenant; the RUNNING one
// carries a correlation id, an aggregate id and a command its step sent.
func (s *scoped) fixture(t *testing.T, tenant uuid.UUID, tag string) fixture {
	t.Helper()
	ctx := context.Background()
	f := fixture{failed: uuid.New(), running: uuid.New(), trigger: uuid.New(), correlation: uuid.New(),
		aggregate: "order-" + tag + "-42", commandID: uuid.NewString()}
	_, err := s.db.Pool.Exec(ctx, `
INSERT INTO saga_instances (id, tenant_id, saga_name, saga_version, status, current_step, trigger_event_id, correlation_id,
                            trigger_aggregate_id, next_attempt_at, last_error, completed_at, current_version)
VALUES ($1, $3, 'order', 1, 'FAILED', 1, gen_random_uuid(), NULL, NULL, now(), 'refund refused for order 7 of tenant ' || $6, now(), 0),
       ($2, $3, 'order', 1, 'RUNNING', 2, $4, $5, $7, now() + interval '1 hour', '', NULL, 1)`,
		f.failed, f.running, tenant, f.trigger, f.correlation, tag, f.aggregate)
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.db.Pool.Exec(ctx, `INSERT INTO saga_events (instance_id, version, kind, step, payload)
		VALUES ($1, 1, 'step_awaiting', 2, jsonb_build_object('kind', 'step_awaiting', 'step', 2, 'correlation_id', $2::text))`, f.running, f.commandID)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func (s *scoped) call(t *testing.T, token, method, path, body string, headers ...string) response {
	t.Helper()
	return s.do(t, method, path, body, append([]string{"Authorization", "Bearer " + token, "Content-Type", "application/json"}, headers...)...)
}

// journal returns how many journal entries an instance has.
func (s *scoped) journal(t *testing.T, id uuid.UUID) int {
	t.Helper()
	var n int
	if err := s.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM saga_events WHERE instance_id = $1`, id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// conforms validates a real answer against the description's schema for
// that route, method and status.
func (s *scoped) conforms(t *testing.T, rt httpapi.Route, r response) {
	t.Helper()
	ptr := fmt.Sprintf("openapi.json#/paths/%s/%s/responses/%d/content/application~1json/schema",
		strings.ReplaceAll(strings.ReplaceAll(rt.Path, "~", "~0"), "/", "~1"), strings.ToLower(rt.Method), r.status)
	sch, err := s.sc.Compile(ptr)
	if err != nil {
		t.Errorf("%s %s: status %d is not described: %v", rt.Method, rt.Path, r.status, err)
		return
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(r.body))
	if err != nil {
		t.Errorf("%s %s: answer is not JSON: %v", rt.Method, rt.Path, err)
		return
	}
	if err := sch.Validate(v); err != nil {
		t.Errorf("%s %s %d: answer does not match the description: %v\n%s", rt.Method, rt.Path, r.status, err, r.body)
	}
}

func ids(t *testing.T, r response) []string {
	t.Helper()
	var body struct {
		Items []struct {
			ID string `json:"id"`
		} `json:"items"`
	}
	if err := json.Unmarshal(r.body, &body); err != nil {
		t.Fatalf("%v: %s", err, r.body)
	}
	var out []string
	for _, it := range body.Items {
		out = append(out, it.ID)
	}
	return out
}

// TestTenantScopedTokenOnEveryRoute: for every /v1 route, a token scoped
// to tenant A neither sees nor changes tenant B's instances, whatever
// headers and parameters it sends, while the "*" token sees both. The
// test fails when a route is added without a case here.
func TestTenantScopedTokenOnEveryRoute(t *testing.T) {
	t.Parallel()
	s := setupScoped(t)
	bIDs := []string{s.b.failed.String(), s.b.running.String()}
	noneOfB := func(t *testing.T, what string, got []string) {
		t.Helper()
		for _, id := range got {
			if slices.Contains(bIDs, id) {
				t.Errorf("%s: the tenant-A token sees tenant B's instance %s", what, id)
			}
		}
	}
	bJournal := s.journal(t, s.b.failed) + s.journal(t, s.b.running)
	xB := []string{"X-Tenant-ID", tenantB.String()}

	cases := map[string]func(t *testing.T){
		"GET /v1/sagas": func(t *testing.T) {
			got := ids(t, s.call(t, acmeToken, "GET", "/v1/sagas", ""))
			if len(got) != 2 {
				t.Errorf("tenant A lists %d instances, want its 2", len(got))
			}
			noneOfB(t, "list", got)
			noneOfB(t, "list ?tenant=B", ids(t, s.call(t, acmeToken, "GET", "/v1/sagas?tenant="+tenantB.String(), "")))
			noneOfB(t, "list ?stuck=true", ids(t, s.call(t, acmeToken, "GET", "/v1/sagas?stuck=true", "")))
			if r := s.call(t, acmeToken, "GET", "/v1/sagas", "", xB...); r.status != http.StatusForbidden {
				t.Errorf("X-Tenant-ID of another tenant: %d, want 403", r.status)
			}
			if got := ids(t, s.call(t, opsToken, "GET", "/v1/sagas", "")); len(got) != 4 {
				t.Errorf("the * token lists %d, want 4", len(got))
			}
		},
		"GET /v1/sagas/{id}": func(t *testing.T) {
			for _, id := range bIDs {
				if r := s.call(t, acmeToken, "GET", "/v1/sagas/"+id, ""); r.status != http.StatusNotFound {
					t.Errorf("show B's %s: %d, want 404", id, r.status)
				}
			}
			if r := s.call(t, acmeToken, "GET", "/v1/sagas/"+s.a.failed.String(), ""); r.status != http.StatusOK {
				t.Errorf("show A's own: %d", r.status)
			}
		},
		"POST /v1/sagas/{id}/retry": func(t *testing.T) {
			for _, h := range [][]string{nil, xB} {
				if r := s.call(t, acmeToken, "POST", "/v1/sagas/"+s.b.failed.String()+"/retry", `{"reason":"x"}`, h...); r.status != http.StatusNotFound && r.status != http.StatusForbidden {
					t.Errorf("retry B's (headers %v): %d, want 404 or 403", h, r.status)
				}
			}
			if r := s.call(t, readerToken, "POST", "/v1/sagas/"+s.a.failed.String()+"/retry", `{"reason":"x"}`); r.status != http.StatusForbidden {
				t.Errorf("retry by a read token: %d, want 403", r.status)
			}
		},
		"POST /v1/sagas/{id}/cancel": func(t *testing.T) {
			if r := s.call(t, acmeToken, "POST", "/v1/sagas/"+s.b.running.String()+"/cancel", `{"reason":"x"}`); r.status != http.StatusNotFound {
				t.Errorf("cancel B's: %d, want 404", r.status)
			}
		},
		"POST /v1/sagas/{id}/pause": func(t *testing.T) {
			if r := s.call(t, acmeToken, "POST", "/v1/sagas/"+s.b.running.String()+"/pause", `{"reason":"x"}`); r.status != http.StatusNotFound {
				t.Errorf("pause B's: %d, want 404", r.status)
			}
			if r := s.call(t, readerToken, "POST", "/v1/sagas/"+s.a.running.String()+"/pause", `{"reason":"x"}`); r.status != http.StatusForbidden {
				t.Errorf("pause by a read token: %d, want 403", r.status)
			}
		},
		"POST /v1/sagas/{id}/resume": func(t *testing.T) {
			if r := s.call(t, acmeToken, "POST", "/v1/sagas/"+s.b.running.String()+"/resume", `{"reason":"x"}`); r.status != http.StatusNotFound {
				t.Errorf("resume B's: %d, want 404", r.status)
			}
			if r := s.call(t, readerToken, "POST", "/v1/sagas/"+s.a.running.String()+"/resume", `{"reason":"x"}`); r.status != http.StatusForbidden {
				t.Errorf("resume by a read token: %d, want 403", r.status)
			}
		},
		"POST /v1/sagas/pause": func(t *testing.T) {
			r := s.call(t, acmeToken, "POST", "/v1/sagas/pause", `{"filter": {"tenant": "`+tenantB.String()+`"}, "reason": "x", "dry_run": false}`)
			if r.status == http.StatusOK && !strings.Contains(string(r.body), `"matched": 0`) {
				t.Errorf("bulk pause of tenant B's by tenant A: %d %s", r.status, r.body)
			}
			if got := ids(t, s.call(t, opsToken, "GET", "/v1/sagas?status=PAUSED", "", xB...)); len(got) != 0 {
				t.Errorf("tenant A's bulk pause paused B's %v", got)
			}
			if r := s.call(t, readerToken, "POST", "/v1/sagas/pause", `{"filter": {}, "reason": "x"}`); r.status != http.StatusForbidden {
				t.Errorf("bulk pause by a read token: %d, want 403", r.status)
			}
		},
		"POST /v1/sagas/resume": func(t *testing.T) {
			r := s.call(t, acmeToken, "POST", "/v1/sagas/resume", `{"filter": {}, "reason": "x", "dry_run": true}`)
			var res struct {
				Sample []string `json:"sample"`
			}
			if r.status != http.StatusOK || json.Unmarshal(r.body, &res) != nil {
				t.Fatalf("bulk resume dry run: %d %s", r.status, r.body)
			}
			noneOfB(t, "bulk resume sample", res.Sample)
		},
		"POST /v1/sagas/upgrade": func(t *testing.T) {
			r := s.call(t, acmeToken, "POST", "/v1/sagas/upgrade", `{"saga": "order", "from_version": 1, "to_version": 2, "dry_run": true}`)
			var res struct {
				Moved   []string `json:"moved"`
				Refused []struct {
					ID string `json:"instance_id"`
				} `json:"refused"`
			}
			if r.status == http.StatusOK {
				if err := json.Unmarshal(r.body, &res); err != nil {
					t.Fatal(err)
				}
				noneOfB(t, "upgrade dry run", res.Moved)
				for _, x := range res.Refused {
					noneOfB(t, "upgrade refusals", []string{x.ID})
				}
			}
			if r := s.call(t, readerToken, "POST", "/v1/sagas/upgrade", `{"saga": "order", "from_version": 1, "to_version": 2}`); r.status != http.StatusForbidden {
				t.Errorf("upgrade by a read token: %d, want 403", r.status)
			}
		},
		"POST /v1/sagas/retry": func(t *testing.T) {
			for _, body := range []string{
				`{"filter": {}, "reason": "x", "dry_run": false}`,
				`{"filter": {"tenant": "` + tenantB.String() + `"}, "reason": "x", "dry_run": false}`,
				`{"filter": {"status": "FAILED"}, "reason": "x", "dry_run": true}`,
			} {
				r := s.call(t, acmeToken, "POST", "/v1/sagas/retry", body)
				var res struct {
					Matched int64    `json:"matched"`
					Sample  []string `json:"sample"`
				}
				if r.status != http.StatusOK || json.Unmarshal(r.body, &res) != nil {
					t.Fatalf("bulk retry %s: %d %s", body, r.status, r.body)
				}
				noneOfB(t, "bulk retry sample", res.Sample)
				if res.Matched > 2 {
					t.Errorf("bulk retry %s matched %d: more than tenant A's", body, res.Matched)
				}
			}
			if r := s.call(t, readerToken, "POST", "/v1/sagas/retry", `{"filter": {}, "reason": "x"}`); r.status != http.StatusForbidden {
				t.Errorf("bulk retry by a read token: %d, want 403", r.status)
			}
		},
		"POST /v1/sagas/cancel": func(t *testing.T) {
			r := s.call(t, acmeToken, "POST", "/v1/sagas/cancel", `{"filter": {"status": "RUNNING"}, "reason": "x", "dry_run": false}`)
			if r.status != http.StatusOK || !strings.Contains(string(r.body), `"matched": 1`) {
				t.Errorf("bulk cancel as tenant A: %d %s, want its one RUNNING instance", r.status, r.body)
			}
		},
		"GET /v1/overview": func(t *testing.T) {
			var o struct {
				Sagas []struct {
					Total int64 `json:"total"`
				} `json:"sagas"`
				TopErrors []struct {
					Message string `json:"message"`
				} `json:"top_errors"`
			}
			r := s.call(t, acmeToken, "GET", "/v1/overview", "")
			if err := json.Unmarshal(r.body, &o); err != nil || len(o.Sagas) != 1 || o.Sagas[0].Total != 2 {
				t.Errorf("overview as tenant A: %s, want 2 instances", r.body)
			}
			if strings.Contains(string(r.body), "tenant B") {
				t.Errorf("overview shows tenant B's errors: %s", r.body)
			}
			if r := s.call(t, acmeToken, "GET", "/v1/overview", "", xB...); r.status != http.StatusForbidden {
				t.Errorf("overview with X-Tenant-ID B: %d", r.status)
			}
		},
		"GET /v1/search": func(t *testing.T) {
			for kind, q := range map[string]string{"instance": s.b.running.String(), "trigger": s.b.trigger.String(),
				"correlation": s.b.correlation.String(), "aggregate": s.b.aggregate, "command": s.b.commandID} {
				if got := ids(t, s.call(t, acmeToken, "GET", "/v1/search?q="+q, "")); len(got) != 0 {
					t.Errorf("search by B's %s id found %v", kind, got)
				}
				if got := ids(t, s.call(t, opsToken, "GET", "/v1/search?q="+q, "")); len(got) != 1 || got[0] != s.b.running.String() {
					t.Errorf("the * token's search by B's %s id found %v", kind, got)
				}
			}
		},
		"GET /v1/definitions": func(t *testing.T) {
			// No tenant data: the definitions are the relay's, the same for
			// every token.
			if r := s.call(t, acmeToken, "GET", "/v1/definitions", ""); r.status != http.StatusOK || bytes.Contains(r.body, []byte(tenantB.String())) {
				t.Errorf("definitions: %d", r.status)
			}
		},
		"GET /v1/replication": func(t *testing.T) {
			// No tenant data: the slot is the relay's. Without a stream it
			// answers 503 for every token alike.
			if r := s.call(t, acmeToken, "GET", "/v1/replication", ""); r.status != http.StatusServiceUnavailable {
				t.Errorf("replication: %d", r.status)
			}
		},
		"POST /v1/events": func(t *testing.T) {
			// An event naming tenant B is refused; one naming no tenant is
			// written under the token's tenant A.
			body := `{"event_type": "isolation.probe", "tenant_id": "` + tenantB.String() + `", "payload": {}}`
			if r := s.call(t, acmeToken, "POST", "/v1/events", body); r.status != http.StatusForbidden {
				t.Errorf("post an event of tenant B: %d %s, want 403", r.status, r.body)
			}
			r := s.call(t, acmeToken, "POST", "/v1/events", `{"event_type": "isolation.probe", "payload": {}}`)
			var res struct {
				ID string `json:"id"`
			}
			if r.status != http.StatusCreated || json.Unmarshal(r.body, &res) != nil {
				t.Fatalf("post an event without a tenant: %d %s", r.status, r.body)
			}
			var tenant uuid.UUID
			if err := s.db.Pool.QueryRow(context.Background(), `SELECT tenant_id FROM outbox WHERE id = $1`, res.ID).Scan(&tenant); err != nil || tenant != tenantA {
				t.Errorf("the posted event's tenant is %s (%v), want the token's %s", tenant, err, tenantA)
			}
			if r := s.call(t, readerToken, "POST", "/v1/events", `{"event_type": "isolation.probe"}`); r.status != http.StatusForbidden {
				t.Errorf("post by a read token: %d, want 403", r.status)
			}
		},
		"POST /v1/sagas": func(t *testing.T) {
			// A start naming tenant B is refused; one naming no tenant
			// writes the trigger event under the token's tenant A.
			body := `{"saga": "order", "tenant_id": "` + tenantB.String() + `", "payload": {}}`
			if r := s.call(t, acmeToken, "POST", "/v1/sagas", body); r.status != http.StatusForbidden {
				t.Errorf("start for tenant B: %d %s, want 403", r.status, r.body)
			}
			r := s.call(t, acmeToken, "POST", "/v1/sagas", `{"saga": "order", "payload": {}, "idempotency_key": "isolation"}`)
			var res struct {
				EventID string `json:"event_id"`
			}
			if r.status != http.StatusAccepted || json.Unmarshal(r.body, &res) != nil {
				t.Fatalf("start without a tenant: %d %s", r.status, r.body)
			}
			var tenant uuid.UUID
			if err := s.db.Pool.QueryRow(context.Background(), `SELECT tenant_id FROM outbox WHERE id = $1`, res.EventID).Scan(&tenant); err != nil || tenant != tenantA {
				t.Errorf("the trigger event's tenant is %s (%v), want the token's %s", tenant, err, tenantA)
			}
			if r := s.call(t, readerToken, "POST", "/v1/sagas", `{"saga": "order"}`); r.status != http.StatusForbidden {
				t.Errorf("start by a read token: %d, want 403", r.status)
			}
		},
		"GET /v1/sinks": func(t *testing.T) {
			if r := s.call(t, acmeToken, "GET", "/v1/sinks", ""); r.status != http.StatusForbidden {
				t.Errorf("sinks as a tenant-scoped token: %d, want 403 (a sink carries every tenant's events)", r.status)
			}
			if r := s.call(t, opsToken, "GET", "/v1/sinks", ""); r.status != http.StatusOK {
				t.Errorf("sinks as the * token: %d", r.status)
			}
		},
		"POST /v1/sinks/{name}/retry": func(t *testing.T) {
			if r := s.call(t, acmeToken, "POST", "/v1/sinks/any/retry", ""); r.status != http.StatusForbidden {
				t.Errorf("sink retry as a tenant-scoped token: %d, want 403", r.status)
			}
		},
		"GET /v1/sinks/{name}/parked": func(t *testing.T) {
			s.seedParked(t)
			if got := parkedIDs(t, s.call(t, acmeToken, "GET", "/v1/sinks/hook/parked", "")); !slices.Equal(got, []string{"ev-a1", "ev-a2"}) {
				t.Errorf("tenant A sees parked events %v, want only its own [ev-a1 ev-a2]", got)
			}
			if got := parkedIDs(t, s.call(t, opsToken, "GET", "/v1/sinks/hook/parked", "")); !slices.Equal(got, []string{"ev-a1", "ev-b1", "ev-a2", "ev-none"}) {
				t.Errorf("the * token sees parked events %v, want all four in delivery order", got)
			}
			all := s.call(t, opsToken, "GET", "/v1/sinks/hook/parked", "").json(t)["items"].([]any)
			for i, want := range []struct {
				head, held bool
			}{{true, false}, {true, false}, {false, false}, {true, true}} {
				it := all[i].(map[string]any)
				if it["head"] != want.head || (it["next_attempt_at"] == nil) != want.held {
					t.Errorf("parked event %v: want head %v, held (next_attempt_at null) %v", it, want.head, want.held)
				}
			}
			if got := parkedIDs(t, s.call(t, opsToken, "GET", "/v1/sinks/hook/parked", "", xB...)); !slices.Equal(got, []string{"ev-b1"}) {
				t.Errorf("the * token narrowed to B sees %v", got)
			}
			if r := s.call(t, acmeToken, "GET", "/v1/sinks/hook/parked", "", xB...); r.status != http.StatusForbidden {
				t.Errorf("tenant A's token with X-Tenant-ID B: %d, want 403", r.status)
			}
		},
		"POST /v1/sinks/{name}/parked/{id}/skip": func(t *testing.T) {
			s.seedParked(t)
			// Another tenant's event answers as an unknown id does: 404,
			// the same words, nothing that tells it exists.
			unknown := s.call(t, acmeToken, "POST", "/v1/sinks/hook/parked/ev-unknown/skip", `{"reason": "r"}`)
			for _, id := range []string{"ev-b1", "ev-none"} {
				r := s.call(t, acmeToken, "POST", "/v1/sinks/hook/parked/"+id+"/skip", `{"reason": "r"}`)
				if r.status != http.StatusNotFound || unknown.status != http.StatusNotFound ||
					strings.ReplaceAll(string(r.body), id, "ID") != strings.ReplaceAll(string(unknown.body), "ev-unknown", "ID") {
					t.Errorf("tenant A skips %s: %d %s; an unknown id: %d %s; want the same 404", id, r.status, r.body, unknown.status, unknown.body)
				}
			}
			if r := s.call(t, readerToken, "POST", "/v1/sinks/hook/parked/ev-a1/skip", `{"reason": "r"}`); r.status != http.StatusForbidden {
				t.Errorf("a read token skips: %d, want 403", r.status)
			}
			if n := s.count(t, `SELECT count(*) FROM relay_sink_parked WHERE sink = 'hook'`); n != 4 {
				t.Fatalf("%d events parked after refused skips, want 4", n)
			}
			r := s.call(t, acmeToken, "POST", "/v1/sinks/hook/parked/ev-a1/skip", `{"reason": "the receiver dropped this order type"}`)
			if r.status != http.StatusOK || r.json(t)["skipped_by"] != "acme-ops" {
				t.Fatalf("tenant A skips its own event: %d %s", r.status, r.body)
			}
			if n := s.count(t, `SELECT count(*) FROM relay_sink_skipped WHERE event_id = 'ev-a1' AND skipped_by = 'acme-ops'
				AND skip_reason = 'the receiver dropped this order type' AND reason = 'POST answered 422'`); n != 1 {
				t.Errorf("%d rows in relay_sink_skipped for the skip, want 1", n)
			}
		},
		"POST /v1/sinks/{name}/replay": func(t *testing.T) {
			if r := s.call(t, acmeToken, "POST", "/v1/sinks/any/replay", `{"since": "2026-01-01T00:00:00Z"}`); r.status != http.StatusForbidden {
				t.Errorf("sink replay as a tenant-scoped token: %d, want 403", r.status)
			}
		},
		"GET /v1/deadletters": func(t *testing.T) {
			s.seedDeadLetters(t)
			if got := deadLetterEvents(t, s.call(t, acmeToken, "GET", "/v1/deadletters", "")); !slices.Equal(got, []string{"dl-a-msg", "dl-a1"}) {
				t.Errorf("tenant A sees dead letters %v, want only its own [dl-a-msg dl-a1]", got)
			}
			if got := deadLetterEvents(t, s.call(t, acmeToken, "GET", "/v1/deadletters?all=true", "")); !slices.Equal(got, []string{"dl-a-msg", "dl-a-retried", "dl-a1"}) {
				t.Errorf("tenant A sees dead letters %v with all=true, want [dl-a-msg dl-a-retried dl-a1]", got)
			}
			if got := deadLetterEvents(t, s.call(t, opsToken, "GET", "/v1/deadletters", "")); !slices.Equal(got, []string{"dl-none", "dl-a-msg", "dl-b1", "dl-a1"}) {
				t.Errorf("the * token sees dead letters %v, want the four pending, newest first", got)
			}
			if got := deadLetterEvents(t, s.call(t, opsToken, "GET", "/v1/deadletters?limit=1", "", xB...)); !slices.Equal(got, []string{"dl-b1"}) {
				t.Errorf("the * token narrowed to B sees %v", got)
			}
			if r := s.call(t, acmeToken, "GET", "/v1/deadletters", "", xB...); r.status != http.StatusForbidden {
				t.Errorf("tenant A's token with X-Tenant-ID B: %d, want 403", r.status)
			}
		},
		"GET /v1/openapi.json": func(t *testing.T) {
			if r := s.call(t, acmeToken, "GET", "/v1/openapi.json", ""); r.status != http.StatusOK || bytes.Contains(r.body, []byte(tenantB.String())) {
				t.Errorf("openapi: %d", r.status)
			}
		},
	}
	for _, rt := range s.srv.Routes() {
		key := rt.Method + " " + rt.Path
		c, ok := cases[key]
		if !ok {
			t.Errorf("route %s has no tenant-isolation case: add one", key)
			continue
		}
		t.Run(key, c)
	}
	if after := s.journal(t, s.b.failed) + s.journal(t, s.b.running); after != bJournal {
		t.Errorf("tenant B's journal went from %d to %d entries: a tenant-A token changed it", bJournal, after)
	}
}

// TestOpenAPIDescribesEveryRoute: every route is in the description (and
// nothing else is), and a real answer of each, as a success and as an
// error, matches its schema.
func TestOpenAPIDescribesEveryRoute(t *testing.T) {
	t.Parallel()
	s := setupScoped(t)
	if s.doc["openapi"] != "3.1.0" {
		t.Fatalf("openapi %v, want 3.1.0", s.doc["openapi"])
	}
	paths := s.doc["paths"].(map[string]any)
	described := map[string]bool{}
	for p, ops := range paths {
		for m := range ops.(map[string]any) {
			described[strings.ToUpper(m)+" "+p] = true
		}
	}
	served := map[string]bool{}
	for _, rt := range s.srv.Routes() {
		served[rt.Method+" "+rt.Path] = true
		if !described[rt.Method+" "+rt.Path] {
			t.Errorf("route %s %s is not in openapi.json", rt.Method, rt.Path)
		}
	}
	for k := range described {
		if !served[k] {
			t.Errorf("openapi.json describes %s, which the server does not serve", k)
		}
	}

	// The served document is the one in the repository.
	if r := s.call(t, opsToken, "GET", "/v1/openapi.json", ""); r.status != http.StatusOK || !strings.Contains(string(r.body), `"openapi": "3.1.0"`) {
		t.Errorf("GET /v1/openapi.json: %d", r.status)
	}

	a := s.a.failed.String()
	requests := map[string][][2]string{ // route → (path, body) pairs to send
		"GET /v1/sagas":              {{"/v1/sagas", ""}, {"/v1/sagas?stuck=true&limit=1", ""}, {"/v1/sagas?status=nope", ""}},
		"GET /v1/sagas/{id}":         {{"/v1/sagas/" + a, ""}, {"/v1/sagas/" + uuid.NewString(), ""}, {"/v1/sagas/x", ""}},
		"POST /v1/sagas/retry":       {{"/v1/sagas/retry", `{"filter": {"status": "FAILED"}, "reason": "r"}`}, {"/v1/sagas/retry", `{"filter": {"status": "FAILED"}, "reason": "r", "dry_run": false, "limit": 1}`}, {"/v1/sagas/retry", `{"reason": ""}`}},
		"POST /v1/sagas/cancel":      {{"/v1/sagas/cancel", `{"filter": {"saga": "order"}, "reason": "r"}`}, {"/v1/sagas/cancel", `{"filter": {"bogus": 1}, "reason": "r"}`}},
		"POST /v1/sagas/{id}/retry":  {{"/v1/sagas/" + s.b.failed.String() + "/retry", `{"reason": "r"}`}, {"/v1/sagas/" + uuid.NewString() + "/retry", `{"reason": "r"}`}},
		"POST /v1/sagas/{id}/cancel": {{"/v1/sagas/" + s.b.running.String() + "/cancel", `{}`}, {"/v1/sagas/" + s.b.failed.String() + "/cancel", `{}`}},
		"POST /v1/sagas/pause":       {{"/v1/sagas/pause", `{"filter": {"saga": "order"}, "reason": "r"}`}, {"/v1/sagas/pause", `{"filter": {"bogus": 1}, "reason": "r"}`}},
		"POST /v1/sagas/upgrade": {{"/v1/sagas/upgrade", `{"saga": "order", "from_version": 1, "to_version": 2}`},
			{"/v1/sagas/upgrade", `{"saga": "order", "from_version": 1, "to_version": 1}`}, {"/v1/sagas/upgrade", `{"bogus": 1}`}},
		"POST /v1/sagas/resume": {{"/v1/sagas/resume", `{"filter": {"saga": "order"}, "reason": "r"}`}, {"/v1/sagas/resume", `{"reason": ""}`}},
		"POST /v1/sagas/{id}/pause": {{"/v1/sagas/" + s.b.running.String() + "/pause", `{"reason": "r"}`}, {"/v1/sagas/" + s.b.failed.String() + "/pause", `{"reason": "r"}`},
			{"/v1/sagas/" + s.b.running.String() + "/pause", `{}`}},
		"POST /v1/sagas/{id}/resume": {{"/v1/sagas/" + s.b.running.String() + "/resume", `{"reason": "r"}`}, {"/v1/sagas/" + s.b.failed.String() + "/resume", `{"reason": "r"}`}},
		"GET /v1/replication":        {{"/v1/replication", ""}},
		"GET /v1/definitions":        {{"/v1/definitions", ""}},
		"GET /v1/overview":           {{"/v1/overview", ""}, {"/v1/overview?x=1", ""}},
		"GET /v1/search":             {{"/v1/search?q=" + s.a.aggregate, ""}, {"/v1/search?q=", ""}},
		"GET /v1/openapi.json":       {{"/v1/openapi.json", ""}},
		"POST /v1/events": {{"/v1/events", `{"event_type": "openapi.probe", "payload": {"n": 1}}`},
			{"/v1/events", `{"id": "` + s.a.trigger.String() + `", "event_type": "openapi.probe"}`}, {"/v1/events", `{"bogus": 1}`}},
		"POST /v1/sagas": {{"/v1/sagas", `{"saga": "order", "payload": {"n": 1}, "idempotency_key": "openapi"}`},
			{"/v1/sagas", `{"saga": "order", "payload": {"n": 1}, "idempotency_key": "openapi"}`},
			{"/v1/sagas", `{"saga": "nope"}`}, {"/v1/sagas", `{"bogus": 1}`}},
		"GET /v1/sinks":               {{"/v1/sinks", ""}},
		"POST /v1/sinks/{name}/retry": {{"/v1/sinks/nope/retry", ""}},
		"GET /v1/sinks/{name}/parked": {{"/v1/sinks/hook/parked", ""}, {"/v1/sinks/hook/parked?limit=1", ""},
			{"/v1/sinks/hook/parked?limit=0", ""}, {"/v1/sinks/nope/parked", ""}},
		"POST /v1/sinks/{name}/parked/{id}/skip": {{"/v1/sinks/hook/parked/ev-b1/skip", `{"reason": "r"}`},
			{"/v1/sinks/hook/parked/ev-b1/skip", `{"reason": "r"}`}, {"/v1/sinks/hook/parked/ev-a1/skip", `{}`}},
		"POST /v1/sinks/{name}/replay": {{"/v1/sinks/nope/replay", `{"since": "2026-01-01T00:00:00Z", "dry_run": true}`}, {"/v1/sinks/nope/replay", `{}`}},
		"GET /v1/deadletters": {{"/v1/deadletters", ""}, {"/v1/deadletters?all=true&limit=2", ""},
			{"/v1/deadletters?limit=0", ""}, {"/v1/deadletters?all=maybe", ""}, {"/v1/deadletters?x=1", ""}},
	}
	s.seedParked(t)
	s.seedDeadLetters(t)
	for _, rt := range s.srv.Routes() {
		reqs, ok := requests[rt.Method+" "+rt.Path]
		if !ok {
			t.Errorf("route %s %s has no request in this test", rt.Method, rt.Path)
			continue
		}
		for _, pb := range reqs {
			r := s.call(t, opsToken, rt.Method, pb[0], pb[1])
			s.conforms(t, rt, r)
		}
		// Unauthenticated: 401, described too.
		r := s.do(t, rt.Method, strings.ReplaceAll(rt.Path, "{id}", a), "")
		if r.status != http.StatusUnauthorized {
			t.Errorf("%s %s without a token: %d", rt.Method, rt.Path, r.status)
		}
		s.conforms(t, rt, r)
	}
}

// seedParked parks four events for a sink "hook": two of tenant A, one of
// tenant B, one without a tenant, in the order ev-a1, ev-b1, ev-a2, ev-none.
func (s *scoped) seedParked(t *testing.T) {
	t.Helper()
	_, err := s.db.Pool.Exec(context.Background(), `INSERT INTO relay_sinks (name, kind) VALUES ('hook', 'webhook') ON CONFLICT DO NOTHING;
		INSERT INTO relay_sink_parked (sink, event_id, aggregate_key, event, reason, attempts) VALUES
		('hook', 'ev-a1', 'a', '{"id": "ev-a1", "tenant_id": "`+tenantA.String()+`", "aggregate_type": "order", "aggregate_id": "a", "event_type": "order.placed", "payload": {}}', 'POST answered 422', 3),
		('hook', 'ev-b1', 'b', '{"id": "ev-b1", "tenant_id": "`+tenantB.String()+`", "aggregate_type": "order", "aggregate_id": "b", "event_type": "order.placed", "payload": {}}', 'POST answered 422', 1),
		('hook', 'ev-a2', 'a', '{"id": "ev-a2", "tenant_id": "`+tenantA.String()+`", "aggregate_type": "order", "aggregate_id": "a", "event_type": "order.paid", "payload": {}}', 'queued', 0),
		('hook', 'ev-none', 'n', '{"id": "ev-none", "event_type": "ping", "payload": {}}', 'held: no id', 0)
		ON CONFLICT DO NOTHING;
		UPDATE relay_sink_parked SET next_attempt_at = 'infinity' WHERE event_id = 'ev-none'`)
	if err != nil {
		t.Fatal(err)
	}
}

// seedDeadLetters parks, oldest first, dead letters of tenant A (one a
// table row, one already re-driven), of tenant B, a logical decoding
// message of tenant A and a row without a tenant.
func (s *scoped) seedDeadLetters(t *testing.T) {
	t.Helper()
	a, b := tenantA.String(), tenantB.String()
	_, err := s.db.Pool.Exec(context.Background(), `INSERT INTO relay_dead_letters (event_id, event_type, lsn, reason, raw, retried_at) VALUES
		('dl-a1', 'order.placed', '0/10', 'no saga accepts order.placed v9', '{"id": "dl-a1", "tenant_id": "`+a+`", "event_type": "order.placed"}', NULL),
		('dl-a-retried', 'order.placed', '0/11', 'payload is not JSON', '{"id": "dl-a-retried", "tenant_id": "`+a+`"}', now()),
		('dl-b1', 'order.placed', '0/12', 'no saga accepts order.placed v9', '{"id": "dl-b1", "tenant_id": "`+b+`", "event_type": "order.placed"}', NULL),
		('dl-a-msg', 'order.paid', '0/13', 'a non-transactional message', jsonb_build_object('source', 'message', 'content', '{"id": "dl-a-msg", "tenant_id": "`+a+`", "event_type": "order.paid"}'), NULL),
		('dl-none', 'ping', '0/14', 'tenant_id "x" is not a UUID', '{"id": "dl-none", "tenant_id": "x"}', NULL)
		ON CONFLICT DO NOTHING`)
	if err != nil {
		t.Fatal(err)
	}
}

// deadLetterEvents reads the event ids of a GET /v1/deadletters answer.
func deadLetterEvents(t *testing.T, r response) []string {
	t.Helper()
	var body struct {
		Items []struct {
			EventID    string  `json:"event_id"`
			Reason     string  `json:"reason"`
			AgeSeconds float64 `json:"age_seconds"`
		} `json:"items"`
	}
	if r.status != http.StatusOK || json.Unmarshal(r.body, &body) != nil {
		t.Fatalf("dead letters: %d %s", r.status, r.body)
	}
	out := []string{}
	for _, it := range body.Items {
		if it.Reason == "" || it.AgeSeconds < 0 {
			t.Errorf("dead letter %s: reason %q, age %v", it.EventID, it.Reason, it.AgeSeconds)
		}
		out = append(out, it.EventID)
	}
	return out
}

func (s *scoped) count(t *testing.T, q string) int {
	t.Helper()
	var n int
	if err := s.db.Pool.QueryRow(context.Background(), q).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// parkedIDs reads the event ids of a GET /v1/sinks/{name}/parked answer.
func parkedIDs(t *testing.T, r response) []string {
	t.Helper()
	var body struct {
		Items []struct {
			EventID string `json:"event_id"`
		} `json:"items"`
	}
	if r.status != http.StatusOK || json.Unmarshal(r.body, &body) != nil {
		t.Fatalf("parked events: %d %s", r.status, r.body)
	}
	out := []string{}
	for _, it := range body.Items {
		out = append(out, it.EventID)
	}
	return out
}
