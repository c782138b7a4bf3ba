package httpapi_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/compensa/compensa/internal/httpapi"
)

func TestSinksOnThePageAndTheAPI(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	if r := b.do(t, "GET", "/", ""); strings.Contains(string(r.body), `id="sinks"`) {
		t.Error("the page shows a sinks section without sinks")
	}
	_, err := b.db.Pool.Exec(context.Background(), `INSERT INTO relay_sinks (name, kind, state, reason, delivered) VALUES
		('payments', 'webhook', 'disabled', 'POST http://h/x answered 410 Gone', 7), ('bus', 'nats', 'up', NULL, 3);
		INSERT INTO relay_sink_parked (sink, event_id, aggregate_key, event, reason) VALUES ('payments', 'e1', 'k', '{}', 'sink disabled')`)
	if err != nil {
		t.Fatal(err)
	}
	page := string(b.do(t, "GET", "/", "").body)
	for _, want := range []string{`id="sink-payments"`, `<strong class="bad">disabled</strong>`, "410 Gone", `id="sink-bus"`} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %s", want)
		}
	}
	r := b.do(t, "GET", "/v1/sinks", "")
	list, _ := r.json(t)["sinks"].([]any)
	if r.status != http.StatusOK || len(list) != 2 {
		t.Fatalf("GET /v1/sinks: %d %s", r.status, r.body)
	}
	first := list[0].(map[string]any)
	if first["name"] != "bus" || first["oldest_parked_seconds"] != nil || list[1].(map[string]any)["parked"] != 1.0 {
		t.Errorf("GET /v1/sinks: %s", r.body)
	}
	if r := b.do(t, "POST", "/v1/sinks/payments/retry", ""); r.status != http.StatusForbidden {
		t.Errorf("retry without a token configured: %d", r.status)
	}
}

func TestPostEventValidation(t *testing.T) {
	t.Parallel()
	b := setup(t, options{token: token, configure: func(c *httpapi.Config) { c.OutboxTable = "outbox" }})
	for _, c := range []struct {
		body   string
		status int
		want   string
	}{
		{`{"payload": {}}`, 400, "event_type is missing"},
		{`{"event_type": "x", "extra": 1}`, 400, `unknown field "extra"`},
		{`{"event_type": "x", "id": "not-a-uuid"}`, 400, "body is not an event"},
		{`{"event_type": "x"} {"event_type": "y"}`, 400, "more than one JSON value"},
		{`{"event_type": "x", "id": "2b1c1f0e-8f3e-4d0b-9a43-5d2c1e6f8b90", "payload": {"a": 1}}`, 201, ""},
		{`{"event_type": "x", "id": "2b1c1f0e-8f3e-4d0b-9a43-5d2c1e6f8b90", "payload": {"a": 1}}`, 200, ""},
	} {
		r := b.do(t, "POST", "/v1/events", c.body, bearer...)
		if r.status != c.status || (c.want != "" && !strings.Contains(r.errorMessage(t), c.want)) {
			t.Errorf("%s: %d %s", c.body, r.status, r.body)
		}
	}
	if r := b.do(t, "POST", "/v1/events", `{"event_type": "x"}`); r.status != http.StatusUnauthorized {
		t.Errorf("without the token: %d", r.status)
	}
	var n int
	b.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox WHERE event_type = 'x'`).Scan(&n)
	if n != 1 {
		t.Errorf("%d rows written, want 1", n)
	}
}
