package httpapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/compensa/compensa/internal/httpapi"
	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/test/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

const token = "s3cret-token-for-tests"

var (
	tenantA = uuid.MustParse("aaaaaaaa-0000-0000-0000-000000000001")
	tenantB = uuid.MustParse("bbbbbbbb-0000-0000-0000-000000000002")
)

// recordingJournal stands in for the journal at the edge of the HTTP layer:
// these tests are about routing, auth and errors; saga/admin's tests run
// retry and cancel against the real journal.
type recordingJournal struct {
	mu    sync.Mutex
	calls []string
}

func (j *recordingJournal) RequestRetry(_ context.Context, id uuid.UUID, reason, actor string) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.calls = append(j.calls, fmt.Sprintf("retry %s %q %s", id, reason, actor))
	return nil
}

func (j *recordingJournal) RequestCancel(_ context.Context, id uuid.UUID, reason, actor string) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.calls = append(j.calls, fmt.Sprintf("cancel %s %q %s", id, reason, actor))
	return nil
}

func (j *recordingJournal) RequestPause(_ context.Context, id uuid.UUID, reason, actor string) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.calls = append(j.calls, fmt.Sprintf("pause %s %q %s", id, reason, actor))
	return nil
}

func (j *recordingJournal) RequestResume(_ context.Context, id uuid.UUID, reason, actor string) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.calls = append(j.calls, fmt.Sprintf("resume %s %q %s", id, reason, actor))
	return nil
}

func (j *recordingJournal) RequestRestart(_ context.Context, id uuid.UUID, step int, reason, actor string) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.calls = append(j.calls, fmt.Sprintf("restart %s %d %q %s", id, step, reason, actor))
	return nil
}

func (j *recordingJournal) count() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return len(j.calls)
}

type testBundle struct {
	db      *pgtest.DB
	reg     *saga.Registry
	journal *recordingJournal
	srv     *httpapi.Server
	metrics *httpapi.Metrics
	ts      *httptest.Server
}

func noop(context.Context, *saga.StepTx) error { return nil }

func orderDef() saga.Definition {
	return saga.Definition{Name: "order", Version: 1,
		Triggers: []saga.Trigger{{EventType: "order.placed"}},
		Steps: []saga.Step{
			{Name: "reserve", Do: noop, Compensate: noop},
			{Name: "charge", Do: noop, Compensate: noop},
			{Name: "ship", Do: noop, Compensate: noop},
		}}
}

type options struct {
	wake        func()
	token       string
	replication httpapi.ReplicationFunc
	journal     bool
	// configure changes the server's config after the defaults of these
	// tests (auth failures not throttled, answers of /readyz never reused).
	configure func(*httpapi.Config)
}

func setup(t *testing.T, o options) *testBundle {
	t.Helper()
	b := &testBundle{db: pgtest.NewDB(t), reg: saga.NewRegistry(), journal: &recordingJournal{}}
	b.reg.MustRegister(orderDef())
	var err error
	if b.metrics, err = httpapi.NewMetrics(nil); err != nil {
		t.Fatal(err)
	}
	cfg := httpapi.Config{Pool: b.db.Pool, Registry: b.reg, APIToken: o.token, Replication: o.replication, Metrics: b.metrics, Wake: o.wake}
	if o.journal {
		cfg.Journal = b.journal
	}
	// Tests that send wrong tokens on purpose are not about the throttle,
	// and the readiness tests change the slot between two probes.
	cfg.AuthFailures, cfg.ReadinessMaxAge = 1000, time.Nanosecond
	if o.configure != nil {
		o.configure(&cfg)
	}
	if b.srv, err = httpapi.New(cfg); err != nil {
		t.Fatal(err)
	}
	b.ts = httptest.NewServer(b.srv)
	t.Cleanup(b.ts.Close)
	return b
}

// insert adds an instance in the given state; nextAgo puts next_attempt_at
// in the past.
func (b *testBundle) insert(t *testing.T, tenant uuid.UUID, status saga.Status, step int, nextAgo time.Duration) uuid.UUID {
	t.Helper()
	id := uuid.New()
	_, err := b.db.Pool.Exec(context.Background(), `
INSERT INTO saga_instances (id, tenant_id, saga_name, saga_version, status, current_step, trigger_event_id, next_attempt_at, last_error)
VALUES ($1, $2, 'order', 1, $3::saga_status, $4, gen_random_uuid(), now() - $5::bigint * interval '1 microsecond', $6)`,
		id, tenant, string(status), step, nextAgo.Microseconds(), "<script>alert(1)</script> refund refused")
	if err != nil {
		t.Fatal(err)
	}
	return id
}

type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("body is not a JSON object: %v: %s", err, r.body)
	}
	return m
}

// unready checks that the body is exactly {"status": "unready", "reasons":
// [...]} with at least one reason, and returns the reasons joined.
func (r response) unready(t *testing.T) string {
	t.Helper()
	m := r.json(t)
	reasons, ok := m["reasons"].([]any)
	if m["status"] != "unready" || !ok || len(reasons) == 0 || len(m) != 2 {
		t.Fatalf("status %d: body is not {\"status\": \"unready\", \"reasons\": [...]}: %s", r.status, r.body)
	}
	var out []string
	for _, x := range reasons {
		out = append(out, x.(string))
	}
	return strings.Join(out, "\n")
}

// errorMessage checks that the body is exactly {"error": "..."}.
func (r response) errorMessage(t *testing.T) string {
	t.Helper()
	m := r.json(t)
	msg, ok := m["error"].(string)
	if !ok || msg == "" || len(m) != 1 {
		t.Fatalf("status %d: body is not {\"error\": \"...\"}: %s", r.status, r.body)
	}
	if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("error Content-Type %q", ct)
	}
	return msg
}

func (b *testBundle) do(t *testing.T, method, path string, body string, headers ...string) response {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, b.ts.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	data, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return response{status: res.StatusCode, header: res.Header, body: data}
}

var bearer = []string{"Authorization", "Bearer " + token}

func TestAuthWithToken(t *testing.T) {
	t.Parallel()
	b := setup(t, options{token: token, journal: true})
	id := b.insert(t, tenantA, saga.StatusFailed, 1, 0)

	for _, c := range []struct {
		method, path, body string
	}{
		{"GET", "/v1/sagas", ""},
		{"GET", "/v1/sagas/" + id.String(), ""},
		{"POST", "/v1/sagas/" + id.String() + "/retry", `{"reason":"x"}`},
		{"POST", "/v1/sagas/" + id.String() + "/cancel", ``},
		{"GET", "/v1/replication", ""},
		{"GET", "/v1/nothing", ""},
	} {
		r := b.do(t, c.method, c.path, c.body)
		if r.status != http.StatusUnauthorized {
			t.Errorf("%s %s without a token: %d, want 401", c.method, c.path, r.status)
			continue
		}
		r.errorMessage(t)
		if !strings.HasPrefix(r.header.Get("WWW-Authenticate"), "Bearer") {
			t.Errorf("%s %s: WWW-Authenticate %q", c.method, c.path, r.header.Get("WWW-Authenticate"))
		}
		for _, wrong := range []string{"Bearer nope", "Bearer " + token + "x", "Basic " + token, token} {
			if r := b.do(t, c.method, c.path, c.body, "Authorization", wrong); r.status != http.StatusUnauthorized {
				t.Errorf("%s %s with Authorization %q: %d, want 401", c.method, c.path, wrong, r.status)
			}
		}
	}
	if n := b.journal.count(); n != 0 {
		t.Fatalf("unauthenticated requests reached the journal %d times", n)
	}

	if r := b.do(t, "GET", "/v1/sagas", "", bearer...); r.status != http.StatusOK {
		t.Errorf("list with the token: %d %s", r.status, r.body)
	}
	if r := b.do(t, "GET", "/v1/sagas", "", "Authorization", "bearer "+token); r.status != http.StatusOK {
		t.Errorf("the scheme is case-insensitive: %d", r.status)
	}
	r := b.do(t, "POST", "/v1/sagas/"+id.String()+"/retry", `{"reason":"refund service fixed"}`, bearer...)
	if r.status != http.StatusOK {
		t.Fatalf("retry with the token: %d %s", r.status, r.body)
	}
	if n := b.journal.count(); n != 1 || !strings.Contains(b.journal.calls[0], `"refund service fixed" api-token`) {
		t.Errorf("journal calls %q", b.journal.calls)
	}

	// Metrics and health stay open.
	for _, p := range []string{"/metrics", "/healthz", "/readyz"} {
		if r := b.do(t, "GET", p, ""); r.status != http.StatusOK {
			t.Errorf("GET %s without a token: %d", p, r.status)
		}
	}
}

func TestNoTokenMeansReadOnly(t *testing.T) {
	t.Parallel()
	b := setup(t, options{journal: true})
	id := b.insert(t, tenantA, saga.StatusFailed, 1, 0)
	running := b.insert(t, tenantA, saga.StatusRunning, 0, 0)
	if r := b.do(t, "GET", "/v1/sagas", ""); r.status != http.StatusOK {
		t.Errorf("read without a configured token: %d", r.status)
	}
	if r := b.do(t, "GET", "/v1/sagas/"+id.String(), ""); r.status != http.StatusOK {
		t.Errorf("show without a configured token: %d", r.status)
	}
	for _, p := range []string{"/v1/sagas/" + id.String() + "/retry", "/v1/sagas/" + running.String() + "/cancel"} {
		// Whatever the caller sends: there is no token to match.
		for _, h := range [][]string{nil, bearer} {
			r := b.do(t, "POST", p, `{"reason":"x"}`, h...)
			if r.status != http.StatusForbidden {
				t.Errorf("POST %s (headers %v): %d, want 403", p, h, r.status)
				continue
			}
			if msg := r.errorMessage(t); !strings.Contains(msg, "--api-token") {
				t.Errorf("403 message does not say how to enable it: %q", msg)
			}
		}
	}
	if n := b.journal.count(); n != 0 {
		t.Fatalf("mutations reached the journal %d times without a configured token", n)
	}
}

func TestTenantScope(t *testing.T) {
	t.Parallel()
	b := setup(t, options{token: token, journal: true})
	a := b.insert(t, tenantA, saga.StatusFailed, 1, 0)
	bID := b.insert(t, tenantB, saga.StatusFailed, 1, 0)
	asB := append(append([]string{}, bearer...), "X-Tenant-ID", tenantB.String())
	asA := append(append([]string{}, bearer...), "X-Tenant-ID", tenantA.String())

	for _, c := range []struct{ method, path, body string }{
		{"GET", "/v1/sagas/" + a.String(), ""},
		{"POST", "/v1/sagas/" + a.String() + "/retry", `{"reason":"x"}`},
		{"POST", "/v1/sagas/" + a.String() + "/cancel", `{}`},
	} {
		r := b.do(t, c.method, c.path, c.body, asB...)
		if r.status != http.StatusNotFound {
			t.Errorf("%s %s as another tenant: %d, want 404", c.method, c.path, r.status)
			continue
		}
		r.errorMessage(t)
	}
	if n := b.journal.count(); n != 0 {
		t.Fatalf("another tenant's request reached the journal: %v", b.journal.calls)
	}
	// A tenant's own instance, and an unscoped caller, see it.
	if r := b.do(t, "GET", "/v1/sagas/"+a.String(), "", asA...); r.status != http.StatusOK {
		t.Errorf("own tenant: %d", r.status)
	}
	var list struct {
		Items []struct {
			ID uuid.UUID `json:"id"`
		} `json:"items"`
	}
	r := b.do(t, "GET", "/v1/sagas", "", asB...)
	if err := json.Unmarshal(r.body, &list); err != nil || len(list.Items) != 1 || list.Items[0].ID != bID {
		t.Errorf("list as tenant B: %s", r.body)
	}
	// The query's tenant cannot widen the header's scope.
	r = b.do(t, "GET", "/v1/sagas?tenant="+tenantA.String(), "", asB...)
	if err := json.Unmarshal(r.body, &list); err != nil || len(list.Items) != 0 {
		t.Errorf("tenant=A under X-Tenant-ID B: %s", r.body)
	}
	if r := b.do(t, "GET", "/v1/sagas", "", append(append([]string{}, bearer...), "X-Tenant-ID", "acme")...); r.status != http.StatusBadRequest {
		t.Errorf("malformed X-Tenant-ID: %d, want 400", r.status)
	} else {
		r.errorMessage(t)
	}
}

func TestErrors(t *testing.T) {
	t.Parallel()
	b := setup(t, options{token: token, journal: true})
	done := b.insert(t, tenantA, saga.StatusCompleted, 3, 0)
	compensated := b.insert(t, tenantA, saga.StatusCompensated, -1, 0)
	timedOut := b.insert(t, tenantA, saga.StatusTimedOut, -1, 0)
	failed := b.insert(t, tenantA, saga.StatusFailed, 1, 0)

	cases := []struct {
		method, path, body string
		want               int
		mention            string
	}{
		{"GET", "/v1/sagas/not-a-uuid", "", 400, "not a saga instance id"},
		{"GET", "/v1/sagas/" + strings.ReplaceAll(done.String(), "-", ""), "", 400, "not a saga instance id"},
		{"POST", "/v1/sagas/12345/retry", `{"reason":"x"}`, 400, "not a saga instance id"},
		{"GET", "/v1/sagas/" + uuid.NewString(), "", 404, "does not exist"},
		{"POST", "/v1/sagas/" + uuid.NewString() + "/retry", `{"reason":"x"}`, 404, "does not exist"},
		{"POST", "/v1/sagas/" + uuid.NewString() + "/cancel", ``, 404, "does not exist"},
		{"GET", "/v1/sagas?status=DONE", "", 400, "status"},
		{"GET", "/v1/sagas?limit=0", "", 400, "limit"},
		{"GET", "/v1/sagas?limit=501", "", 400, "limit"},
		{"GET", "/v1/sagas?limit=ten", "", 400, "limit"},
		{"GET", "/v1/sagas?stuck=maybe", "", 400, "stuck"},
		{"GET", "/v1/sagas?tenant=acme", "", 400, "tenant"},
		{"GET", "/v1/sagas?stuk=true", "", 400, "unknown parameter"},
		{"GET", "/v1/sagas?status=FAILED&status=RUNNING", "", 400, "2 times"},
		{"GET", "/v1/sagas?cursor=%25%25%25", "", 400, "cursor"},
		{"POST", "/v1/sagas/" + failed.String() + "/retry", `{"reason":`, 400, "JSON object"},
		{"POST", "/v1/sagas/" + failed.String() + "/retry", `{"reason":"x","force":true}`, 400, "unknown field"},
		{"POST", "/v1/sagas/" + failed.String() + "/retry", `{"reason":"   "}`, 400, "reason is required"},
		{"POST", "/v1/sagas/" + failed.String() + "/retry", ``, 400, "reason is required"},
		{"POST", "/v1/sagas/" + failed.String() + "/retry", `{"reason":"` + strings.Repeat("x", 70000) + `"}`, 400, "larger than"},
		{"POST", "/v1/sagas/" + done.String() + "/retry", `{"reason":"x"}`, 409, "COMPLETED"},
		{"POST", "/v1/sagas/" + compensated.String() + "/retry", `{"reason":"x"}`, 409, "COMPENSATED"},
		{"POST", "/v1/sagas/" + timedOut.String() + "/retry", `{"reason":"x"}`, 409, "TIMED_OUT"},
		{"POST", "/v1/sagas/" + failed.String() + "/cancel", ``, 409, "only a RUNNING instance"},
		{"GET", "/v1/sagas/" + failed.String() + "/retry", "", 405, "POST"},
		{"DELETE", "/v1/sagas", "", 405, "GET"},
		{"GET", "/v1/teapot", "", 404, "no such endpoint"},
	}
	for _, c := range cases {
		r := b.do(t, c.method, c.path, c.body, bearer...)
		if r.status != c.want {
			t.Errorf("%s %.60s: %d, want %d: %s", c.method, c.path, r.status, c.want, r.body)
			continue
		}
		if msg := r.errorMessage(t); !strings.Contains(msg, c.mention) {
			t.Errorf("%s %.60s: error %q does not mention %q", c.method, c.path, msg, c.mention)
		}
	}
	if n := b.journal.count(); n != 0 {
		t.Errorf("refused requests reached the journal: %v", b.journal.calls)
	}
}

func TestListOverHTTP(t *testing.T) {
	t.Parallel()
	b := setup(t, options{token: token})
	want := map[uuid.UUID]bool{}
	for i := range 5 {
		st := saga.StatusRunning
		if i%2 == 0 {
			st = saga.StatusFailed
		}
		want[b.insert(t, tenantA, st, 1, 0)] = true
	}
	seen := map[uuid.UUID]bool{}
	path := "/v1/sagas?limit=2"
	for pages := 0; ; pages++ {
		if pages > 5 {
			t.Fatal("pagination does not end")
		}
		r := b.do(t, "GET", path, "", bearer...)
		if r.status != http.StatusOK {
			t.Fatalf("%s: %d %s", path, r.status, r.body)
		}
		m := r.json(t)
		next, present := m["next_cursor"]
		if !present {
			t.Fatalf("next_cursor missing: %s", r.body)
		}
		items := m["items"].([]any)
		for _, it := range items {
			item := it.(map[string]any)
			for _, k := range []string{"id", "saga_name", "saga_version", "status", "current_step", "attempt", "next_attempt_at", "timeout_at", "last_error", "stuck_reason", "created_at", "updated_at"} {
				if _, ok := item[k]; !ok {
					t.Fatalf("item lacks %q: %v", k, item)
				}
			}
			id := uuid.MustParse(item["id"].(string))
			if seen[id] {
				t.Fatalf("%s listed twice", id)
			}
			seen[id] = true
			if item["status"] == "FAILED" && item["stuck_reason"] != "failed" {
				t.Errorf("FAILED item with stuck_reason %v", item["stuck_reason"])
			}
		}
		if next == nil {
			break
		}
		path = "/v1/sagas?limit=2&cursor=" + url.QueryEscape(next.(string))
	}
	if len(seen) != len(want) {
		t.Errorf("paged through %d of %d instances", len(seen), len(want))
	}
	r := b.do(t, "GET", "/v1/sagas?stuck=true&status=failed", "", bearer...)
	if items := r.json(t)["items"].([]any); len(items) != 3 {
		t.Errorf("stuck FAILED: %d items, want 3", len(items))
	}
	// An empty page is an empty list, not null.
	r = b.do(t, "GET", "/v1/sagas?saga=none", "", bearer...)
	if !strings.Contains(string(r.body), `"items": []`) || !strings.Contains(string(r.body), `"next_cursor": null`) {
		t.Errorf("empty page: %s", r.body)
	}
}

func TestShowOverHTTP(t *testing.T) {
	t.Parallel()
	b := setup(t, options{token: token})
	id := b.insert(t, tenantA, saga.StatusFailed, 1, 0)
	r := b.do(t, "GET", "/v1/sagas/"+id.String(), "", bearer...)
	if r.status != http.StatusOK {
		t.Fatalf("%d %s", r.status, r.body)
	}
	var d struct {
		Instance struct {
			ID          uuid.UUID `json:"id"`
			StuckReason string    `json:"stuck_reason"`
		} `json:"instance"`
		Steps  []map[string]any `json:"steps"`
		Events []map[string]any `json:"events"`
	}
	if err := json.Unmarshal(r.body, &d); err != nil {
		t.Fatal(err)
	}
	if d.Instance.ID != id || d.Instance.StuckReason != "failed" || len(d.Steps) != 3 || d.Events == nil {
		t.Errorf("show: %s", r.body)
	}
}

func TestReplicationAndReadiness(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	status := httpapi.ReplicationStatus{Slot: "relay_outbox", Exists: true, Active: true, WALStatus: "reserved",
		LagBytes: 4096, LagSeconds: ptr(1.5), ConfirmedFlushLSN: "0/16B3748", CurrentLSN: "0/16B4748", Streamer: "pid 42 relay@host-a"}
	var fail error
	repl := func(context.Context) (httpapi.ReplicationStatus, error) {
		mu.Lock()
		defer mu.Unlock()
		return status, fail
	}
	b := setup(t, options{token: token, replication: repl})

	r := b.do(t, "GET", "/v1/replication", "", bearer...)
	m := r.json(t)
	if r.status != 200 || m["slot"] != "relay_outbox" || m["lag_bytes"] != float64(4096) || m["wal_status"] != "reserved" || m["active"] != true || m["streamer"] == "" {
		t.Errorf("/v1/replication: %d %s", r.status, r.body)
	}
	if r := b.do(t, "GET", "/readyz", ""); r.status != 200 {
		t.Errorf("readyz healthy: %d %s", r.status, r.body)
	}

	mu.Lock()
	status.WALStatus = "lost"
	mu.Unlock()
	if r := b.do(t, "GET", "/readyz", ""); r.status != 503 || !strings.Contains(r.unready(t), "lost") {
		t.Errorf("readyz with a lost slot: %d %s", r.status, r.body)
	}
	mu.Lock()
	status.WALStatus, status.Exists = "", false
	mu.Unlock()
	if r := b.do(t, "GET", "/readyz", ""); r.status != 503 || !strings.Contains(r.unready(t), "does not exist") {
		t.Errorf("readyz with no slot: %d %s", r.status, r.body)
	}
	mu.Lock()
	fail = errors.New("connection refused password=hunter2")
	mu.Unlock()
	r = b.do(t, "GET", "/readyz", "")
	if r.status != 503 || strings.Contains(string(r.body), "hunter2") || !strings.Contains(r.unready(t), "replication slot's status") {
		t.Errorf("readyz with an unreadable slot: %d %s", r.status, r.body)
	}
	r = b.do(t, "GET", "/v1/replication", "", bearer...)
	if r.status != 500 || strings.Contains(string(r.body), "hunter2") {
		t.Errorf("/v1/replication failing: %d %s", r.status, r.body)
	}
	if samples := b.srv.LagSamples(); len(samples) == 0 {
		t.Error("no lag sample was kept")
	}

	// No stream in this process: 503 on /v1/replication, ready on the
	// database alone.
	nb := setup(t, options{token: token})
	if r := nb.do(t, "GET", "/v1/replication", "", bearer...); r.status != 503 {
		t.Errorf("/v1/replication without a stream: %d", r.status)
	}
	if r := nb.do(t, "GET", "/readyz", ""); r.status != 200 {
		t.Errorf("readyz without a stream: %d", r.status)
	}
	if r := nb.do(t, "GET", "/healthz", ""); r.status != 200 {
		t.Errorf("healthz: %d", r.status)
	}
}

func ptr[T any](v T) *T { return &v }

// TestStreamerNamed: when the slot is active, /v1/replication names the
// walsender that streams it (which replica), from pg_stat_replication.
func TestStreamerNamed(t *testing.T) {
	t.Parallel()
	var slot string
	repl := func(context.Context) (httpapi.ReplicationStatus, error) {
		return httpapi.ReplicationStatus{Slot: slot, Exists: true, Active: true, WALStatus: "reserved"}, nil
	}
	b := setup(t, options{replication: repl})
	slot = b.db.Slot
	ctx := context.Background()
	if _, err := b.db.Pool.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'test_decoding')`, slot); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgconn.ParseConfig(pgtest.ReplicationURL(b.db.URL))
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["application_name"] = "relay-replica-a"
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if err := pglogrepl.StartReplication(ctx, conn, slot, 0, pglogrepl.StartReplicationOptions{}); err != nil {
		t.Fatal(err)
	}
	r := b.do(t, "GET", "/v1/replication", "")
	streamer, _ := r.json(t)["streamer"].(string)
	if !strings.Contains(streamer, "walsender pid") || !strings.Contains(streamer, "relay-replica-a") {
		t.Errorf("streamer %q, want the walsender's pid and application name", streamer)
	}
	// The page shows the slot and the lag chart from the kept samples.
	page := string(b.do(t, "GET", "/", "").body)
	if !strings.Contains(page, "<polyline") || !strings.Contains(page, "relay-replica-a") {
		t.Error("the page lacks the lag chart or the streamer")
	}
}

// TestLagSampler: Run samples the lag at its interval into a bounded ring,
// oldest first, and returns when its context ends.
func TestLagSampler(t *testing.T) {
	t.Parallel()
	var n atomic.Int64
	repl := func(context.Context) (httpapi.ReplicationStatus, error) {
		v := n.Add(1)
		return httpapi.ReplicationStatus{Slot: "s", Exists: true, WALStatus: "reserved", LagBytes: v}, nil
	}
	db := pgtest.NewDB(t)
	srv, err := httpapi.New(httpapi.Config{Pool: db.Pool, Replication: repl, LagSampleInterval: 10 * time.Millisecond, LagSamples: 5})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for n.Load() < 12 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	samples := srv.LagSamples()
	if len(samples) != 5 {
		t.Fatalf("%d samples kept, want the ring's 5", len(samples))
	}
	for i := 1; i < len(samples); i++ {
		if samples[i].LagBytes <= samples[i-1].LagBytes || samples[i].At.Before(samples[i-1].At) {
			t.Errorf("samples out of order: %+v", samples)
		}
	}
	if last := samples[len(samples)-1].LagBytes; last < 10 {
		t.Errorf("newest sample %d: the ring kept old samples", last)
	}
}

// The stream's and the sinks' own health turns /readyz unready with their
// reasons and back, and drives compensa_stream_stalled.
func TestReadyzHealthReasons(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var reasons []string
	var stalled bool
	var failures uint64
	b := setup(t, options{configure: func(c *httpapi.Config) {
		c.Health = func() []string {
			mu.Lock()
			defer mu.Unlock()
			return append([]string(nil), reasons...)
		}
	}})
	b.metrics.SetSources(httpapi.Sources{Stream: func() (bool, uint64) {
		mu.Lock()
		defer mu.Unlock()
		return stalled, failures
	}})
	metric := func(name string) string {
		t.Helper()
		for _, line := range strings.Split(string(b.do(t, "GET", "/metrics", "").body), "\n") {
			if f := strings.Fields(line); len(f) == 2 && f[0] == name {
				return f[1]
			}
		}
		t.Fatalf("/metrics has no %s", name)
		return ""
	}
	if r := b.do(t, "GET", "/readyz", ""); r.status != 200 || r.json(t)["status"] != "ok" {
		t.Fatalf("readyz healthy: %d %s", r.status, r.body)
	}
	if v := metric("compensa_stream_stalled"); v != "0" {
		t.Errorf("compensa_stream_stalled %s while healthy", v)
	}

	mu.Lock()
	reasons = []string{"stream: the batch at 0/1A4A210 failed 5 times: permission denied for table relay_checkpoints", "sink hooks: can neither deliver nor park its events: cannot park: permission denied"}
	stalled, failures = true, 5
	mu.Unlock()
	r := b.do(t, "GET", "/readyz", "")
	if got := r.unready(t); r.status != 503 || !strings.Contains(got, "failed 5 times") || !strings.Contains(got, "sink hooks") {
		t.Errorf("readyz stalled: %d %s", r.status, r.body)
	}
	if v := metric("compensa_stream_stalled"); v != "1" {
		t.Errorf("compensa_stream_stalled %s while stalled", v)
	}
	if v := metric("compensa_stream_batch_failures_total"); v != "5" {
		t.Errorf("compensa_stream_batch_failures_total %s, want 5", v)
	}

	mu.Lock()
	reasons, stalled = nil, false
	mu.Unlock()
	if r := b.do(t, "GET", "/readyz", ""); r.status != 200 {
		t.Errorf("readyz after recovery: %d %s", r.status, r.body)
	}
}

func TestReadyzDatabaseDown(t *testing.T) {
	t.Parallel()
	// A port nothing listens on: the pool fails on first use.
	pool, err := pgxpool.New(context.Background(), "postgres://nobody:pw@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	srv, err := httpapi.New(httpapi.Config{Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	srv.ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "database unreachable") {
		t.Errorf("readyz with the database down: %d %s", rec.Code, rec.Body)
	}
	rec = httptest.NewRecorder()
	srv.ServeHTTP(rec, httptest.NewRequest("GET", "/healthz", nil))
	if rec.Code != http.StatusOK {
		t.Errorf("healthz with the database down: %d", rec.Code)
	}
}

func TestMetricsParse(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	b.metrics.SetSources(httpapi.Sources{
		Lag: func() (int64, float64) { return 8192, 2.25 },
	})
	b.insert(t, tenantA, saga.StatusFailed, 1, 0)
	b.insert(t, tenantA, saga.StatusRunning, 1, time.Hour)
	if _, err := b.db.Pool.Exec(context.Background(), `INSERT INTO relay_dead_letters (event_id, lsn, reason, raw) VALUES ('e1', '0/10', 'bad', '{}')`); err != nil {
		t.Fatal(err)
	}
	hooks := b.metrics.RunnerHooks()
	hooks.OnStep(saga.StepEvent{Saga: saga.Key{Name: "order", Version: 1}, StepName: "charge", Outcome: saga.OutcomeRetry, Duration: 30 * time.Millisecond})
	hooks.OnStep(saga.StepEvent{Saga: saga.Key{Name: "order", Version: 1}, StepName: "charge", Compensation: true, Outcome: saga.OutcomeCompleted, Duration: 2 * time.Second})
	hooks.OnTerminal(saga.TerminalEvent{Saga: saga.Key{Name: "order", Version: 1}, Status: saga.StatusCompensated})
	b.metrics.SagasStarted("order", 3)

	r := b.do(t, "GET", "/metrics", "")
	if r.status != http.StatusOK {
		t.Fatalf("/metrics: %d", r.status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(string(r.body)))
	if err != nil {
		t.Fatalf("/metrics does not parse as Prometheus text: %v", err)
	}
	value := func(name string, labels map[string]string) float64 {
		t.Helper()
		f, ok := fams[name]
		if !ok {
			t.Fatalf("family %s missing", name)
		}
	metrics:
		for _, m := range f.Metric {
			got := map[string]string{}
			for _, l := range m.Label {
				got[l.GetName()] = l.GetValue()
			}
			for k, v := range labels {
				if got[k] != v {
					continue metrics
				}
			}
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue()
			case m.Gauge != nil:
				return m.Gauge.GetValue()
			case m.Histogram != nil:
				return float64(m.Histogram.GetSampleCount())
			}
		}
		t.Fatalf("%s%v missing", name, labels)
		return 0
	}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"compensa_replication_lag_bytes", nil, 8192},
		{"compensa_replication_lag_seconds", nil, 2.25},
		{"compensa_sagas_stuck", map[string]string{"saga": "order", "reason": "failed"}, 1},
		{"compensa_parked_events", nil, 1},
		{"compensa_step_duration_seconds", map[string]string{"saga": "order", "step": "charge", "phase": "do", "outcome": "retry"}, 1},
		{"compensa_step_duration_seconds", map[string]string{"phase": "compensate", "outcome": "completed"}, 1},
		{"compensa_step_retries_total", map[string]string{"saga": "order", "step": "charge", "phase": "do"}, 1},
		{"compensa_sagas_ended_total", map[string]string{"saga": "order", "status": "compensated"}, 1},
		{"compensa_sagas_started_total", map[string]string{"saga": "order"}, 3},
	} {
		if got := value(c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if _, ok := fams["go_goroutines"]; !ok {
		t.Error("the Go runtime collector is missing")
	}
}
