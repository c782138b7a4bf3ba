package httpapi_test

import (
	"context"
	"fmt"
	"net/http"
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
