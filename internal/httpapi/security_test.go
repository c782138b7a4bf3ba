package httpapi_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/compensa/compensa/internal/httpapi"
)

// A tenant-scoped token cannot answer another tenant's waiting command: the
// reply is refused with 403 and nothing is written; its own tenant's
// command it may answer.
func TestReplyToAnotherTenantsCommandRefused(t *testing.T) {
	t.Parallel()
	s := setupScoped(t)
	ctx := context.Background()
	for _, f := range []fixture{s.a, s.b} {
		if _, err := s.db.Pool.Exec(ctx, `UPDATE saga_instances SET awaiting_correlation_id = $2, awaiting_until = now() + interval '1 hour' WHERE id = $1`,
			f.running, f.commandID); err != nil {
			t.Fatal(err)
		}
	}
	reply := func(corr string) string {
		return fmt.Sprintf(`{"event_type": "payment.charged", "correlation_id": %q, "payload": {"charge": "forged"}}`, corr)
	}
	r := s.call(t, acmeToken, "POST", "/v1/events", reply(s.b.commandID))
	if r.status != http.StatusForbidden || !strings.Contains(r.errorMessage(t), "another tenant's command") {
		t.Fatalf("tenant A's reply to tenant B's command: %d %s, want 403", r.status, r.body)
	}
	var n int
	if err := s.db.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE correlation_id = $1`, s.b.commandID).Scan(&n); err != nil || n != 0 {
		t.Fatalf("the refused reply wrote %d rows (%v)", n, err)
	}
	if r := s.call(t, acmeToken, "POST", "/v1/events", reply(s.a.commandID)); r.status != http.StatusCreated {
		t.Fatalf("tenant A's reply to its own command: %d %s", r.status, r.body)
	}
}

// /v1/events answers in words of its own: a NUL byte is a 400 that names
// the field (never PostgreSQL's text), and a body over the limit is 413.
func TestPostEventErrorsAreOurOwn(t *testing.T) {
	t.Parallel()
	b := setup(t, options{token: token, configure: func(c *httpapi.Config) { c.OutboxTable = "outbox" }})
	for _, c := range []struct{ body, want string }{
		{`{"event_type": "x", "payload": {"note": "a\u0000b"}}`, "payload cannot be stored as jsonb"},
		{`{"event_type": "x\u0000y", "payload": {}}`, "event_type holds a NUL character"},
		{`{"event_type": "x", "aggregate_id": "\u0000", "payload": {}}`, "aggregate_id holds a NUL character"},
		{`{"event_type": "x", "headers": {"k": "v\u0000"}, "payload": {}}`, "a header holds a NUL character"},
	} {
		r := b.do(t, "POST", "/v1/events", c.body, bearer...)
		msg := r.errorMessage(t)
		if r.status != http.StatusBadRequest || !strings.Contains(msg, c.want) {
			t.Errorf("%s: %d %s, want 400 %q", c.body, r.status, r.body, c.want)
		}
		for _, pg := range []string{"SQLSTATE", "unsupported Unicode", "invalid byte sequence", "0x00"} {
			if strings.Contains(msg, pg) {
				t.Errorf("%s: the answer carries the database's text: %s", c.body, msg)
			}
		}
	}
	big := `{"event_type": "x", "payload": {"blob": "` + strings.Repeat("a", 2<<20) + `"}}`
	r := b.do(t, "POST", "/v1/events", big, bearer...)
	if r.status != http.StatusRequestEntityTooLarge || !strings.Contains(r.errorMessage(t), "larger than") {
		t.Errorf("a 2 MiB event: %d %.200s, want 413", r.status, r.body)
	}
}

// POST /v1/sagas refuses what PostgreSQL would refuse, as /v1/events does:
// a 400 that names the field, never a 500 or the database's text.
func TestStartSagaErrorsAreOurOwn(t *testing.T) {
	t.Parallel()
	b := setup(t, options{token: token, configure: func(c *httpapi.Config) { c.OutboxTable = "outbox" }})
	for _, c := range []struct{ body, want string }{
		{`{"saga": "order", "payload": {"note": "a\u0000b"}}`, "payload cannot be stored as jsonb"},
		{`{"saga": "order", "payload": {"note": "\ud800"}}`, "payload cannot be stored as jsonb"},
		{"{\"saga\": \"order\", \"payload\": {\"note\": \"a\xffb\"}}", "payload cannot be stored as jsonb"},
		{`{"saga": "order", "aggregate_id": "a\u0000", "payload": {}}`, "aggregate_id holds a NUL character"},
		{`{"saga": "order", "idempotency_key": "k\u0000", "payload": {}}`, "idempotency_key holds a NUL character"},
	} {
		r := b.do(t, "POST", "/v1/sagas", c.body, bearer...)
		msg := r.errorMessage(t)
		if r.status != http.StatusBadRequest || !strings.Contains(msg, c.want) {
			t.Errorf("%q: %d %s, want 400 %q", c.body, r.status, r.body, c.want)
		}
		if strings.Contains(msg, "SQLSTATE") {
			t.Errorf("%q: the answer carries the database's text: %s", c.body, msg)
		}
	}
}

// The page shows the sinks (every tenant's counts and reasons) only to a
// session of a token of every tenant, as GET /v1/sinks does.
func TestPageShowsSinksOnlyToEveryTenantTokens(t *testing.T) {
	t.Parallel()
	s := setupScoped(t)
	if _, err := s.db.Pool.Exec(context.Background(), `INSERT INTO relay_sinks (name, kind, state, reason, delivered)
		VALUES ('payments', 'webhook', 'disabled', 'POST http://h/x answered 410 Gone', 7)`); err != nil {
		t.Fatal(err)
	}
	page := func(tok string) string {
		r := s.do(t, "POST", "/login", url.Values{"token": {tok}}.Encode(), "Content-Type", "application/x-www-form-urlencoded")
		if r.status != http.StatusSeeOther {
			t.Fatalf("login: %d %s", r.status, r.body)
		}
		cookie := strings.SplitN(r.header.Get("Set-Cookie"), ";", 2)[0]
		return string(s.do(t, "GET", "/", "", "Cookie", cookie).body)
	}
	if p := page(acmeToken); strings.Contains(p, `id="sink-payments"`) || strings.Contains(p, "410 Gone") {
		t.Error("a tenant-scoped session sees the sinks on the page")
	}
	if p := page(opsToken); !strings.Contains(p, `id="sink-payments"`) {
		t.Error("a session of every tenant does not see the sinks")
	}
}

// POST /login and POST /logout refuse cross-site browser requests; a
// logout ends the server's session whatever its origin.
func TestLoginAndLogoutRefuseCrossSite(t *testing.T) {
	t.Parallel()
	b := setup(t, options{token: token})
	form := url.Values{"token": {token}}.Encode()
	ct := []string{"Content-Type", "application/x-www-form-urlencoded"}
	for _, h := range [][]string{
		{"Origin", "http://evil.example"},
		{"Origin", "null"},
		{"Sec-Fetch-Site", "cross-site"},
		{"Sec-Fetch-Site", "same-site"},
	} {
		r := b.do(t, "POST", "/login", form, append(ct, h...)...)
		if r.status != http.StatusForbidden || r.header.Get("Set-Cookie") != "" {
			t.Errorf("login with %s: %s: %d, cookie %q; want 403 and no session", h[0], h[1], r.status, r.header.Get("Set-Cookie"))
		}
	}
	own := strings.TrimPrefix(b.ts.URL, "http://")
	for _, h := range [][]string{{"Origin", "http://" + own}, {"Sec-Fetch-Site", "same-origin"}, {"Sec-Fetch-Site", "none"}, {}} {
		if r := b.do(t, "POST", "/login", form, append(ct, h...)...); r.status != http.StatusSeeOther {
			t.Errorf("login with %v: %d, want 303", h, r.status)
		}
	}
	cookie := login(t, b)
	r := b.do(t, "POST", "/logout", "", "Cookie", cookie, "Sec-Fetch-Site", "cross-site", "Origin", "http://evil.example")
	if r.status != http.StatusForbidden {
		t.Errorf("cross-site logout: %d, want 403", r.status)
	}
	if r := b.do(t, "GET", "/v1/sagas", "", "Cookie", cookie); r.status != http.StatusUnauthorized {
		t.Errorf("the session after a cross-site logout: %d, want 401 (ended on the server)", r.status)
	}
}
