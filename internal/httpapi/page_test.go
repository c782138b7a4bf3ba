package httpapi_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/compensa/compensa/saga"
)

func TestPageLoginAndSession(t *testing.T) {
	t.Parallel()
	b := setup(t, options{token: token, journal: true})
	id := b.insert(t, tenantA, saga.StatusFailed, 1, 0)

	r := b.do(t, "GET", "/", "")
	if r.status != http.StatusSeeOther || !strings.HasPrefix(r.header.Get("Location"), "/login") {
		t.Fatalf("page without a session: %d %s", r.status, r.header.Get("Location"))
	}
	if r := b.do(t, "GET", "/sagas/"+id.String(), ""); r.status != http.StatusSeeOther {
		t.Errorf("saga page without a session: %d", r.status)
	}
	form := func(tok, next string) string {
		return url.Values{"token": {tok}, "next": {next}}.Encode()
	}
	ct := []string{"Content-Type", "application/x-www-form-urlencoded"}
	r = b.do(t, "POST", "/login", form("wrong", "/"), ct...)
	if r.status != http.StatusUnauthorized || len(r.header.Values("Set-Cookie")) != 0 {
		t.Fatalf("wrong token: %d, cookies %v", r.status, r.header.Values("Set-Cookie"))
	}
	r = b.do(t, "POST", "/login", form(token, "https://evil.example/"), ct...)
	if r.status != http.StatusSeeOther || r.header.Get("Location") != "/" {
		t.Errorf("login must not redirect off-site: %d %s", r.status, r.header.Get("Location"))
	}
	cookie := r.header.Get("Set-Cookie")
	if !strings.Contains(cookie, "HttpOnly") || !strings.Contains(cookie, "SameSite=Strict") || strings.Contains(cookie, token) {
		t.Fatalf("session cookie %q: want HttpOnly, SameSite=Strict and not the token itself", cookie)
	}
	session := strings.SplitN(cookie, ";", 2)[0]

	r = b.do(t, "GET", "/", "", "Cookie", session)
	if r.status != http.StatusOK {
		t.Fatalf("page with a session: %d %s", r.status, r.body)
	}
	page := string(r.body)
	if !strings.Contains(page, id.String()) || !strings.Contains(page, "stuck-row") {
		t.Error("the stuck FAILED instance is not on the page")
	}
	// A saga's error text is data, never markup.
	if strings.Contains(page, "<script>alert(1)</script>") || !strings.Contains(page, "&lt;script&gt;alert(1)&lt;/script&gt;") {
		t.Error("last_error is not escaped on the page")
	}
	if csp := r.header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") {
		t.Errorf("Content-Security-Policy %q", csp)
	}
	if r := b.do(t, "GET", "/sagas/"+id.String(), "", "Cookie", session); r.status != http.StatusOK || !strings.Contains(string(r.body), `id="journal"`) {
		t.Errorf("saga page: %d", r.status)
	}
	if r := b.do(t, "GET", "/sagas/"+uuid.NewString(), "", "Cookie", session); r.status != http.StatusNotFound {
		t.Errorf("unknown saga page: %d, want 404", r.status)
	}
	if r := b.do(t, "GET", "/sagas/nope", "", "Cookie", session); r.status != http.StatusBadRequest {
		t.Errorf("malformed saga page id: %d, want 400", r.status)
	}
	if r := b.do(t, "GET", "/assets/app.js", ""); r.status != http.StatusOK || !strings.Contains(string(r.body), "X-Compensa-Page") {
		t.Errorf("embedded script: %d", r.status)
	}

	// The cookie authenticates the page's API calls; a mutation by cookie
	// needs the page's header, which a cross-site form cannot send.
	if r := b.do(t, "GET", "/v1/sagas", "", "Cookie", session); r.status != http.StatusOK {
		t.Errorf("API read with the session cookie: %d", r.status)
	}
	retry := "/v1/sagas/" + id.String() + "/retry"
	if r := b.do(t, "POST", retry, `{"reason":"x"}`, "Cookie", session); r.status != http.StatusForbidden {
		t.Errorf("mutation by cookie without the page header: %d, want 403", r.status)
	}
	if n := b.journal.count(); n != 0 {
		t.Fatalf("a cookie-only mutation reached the journal")
	}
	if r := b.do(t, "POST", retry, `{"reason":"from the page"}`, "Cookie", session, "X-Compensa-Page", "1"); r.status != http.StatusOK {
		t.Errorf("mutation from the page: %d %s", r.status, r.body)
	}
	if n := b.journal.count(); n != 1 || !strings.Contains(b.journal.calls[0], "api-token") {
		t.Errorf("journal calls %v, want one by api-token", b.journal.calls)
	}
	if r := b.do(t, "GET", "/v1/sagas", "", "Cookie", "compensa_session=forged"); r.status != http.StatusUnauthorized {
		t.Errorf("forged cookie: %d, want 401", r.status)
	}

	r = b.do(t, "POST", "/logout", "", "Cookie", session)
	if c := r.header.Get("Set-Cookie"); !strings.Contains(c, "Max-Age=0") {
		t.Errorf("logout cookie %q", c)
	}
}

func TestPageWithoutToken(t *testing.T) {
	t.Parallel()
	b := setup(t, options{journal: true})
	id := b.insert(t, tenantA, saga.StatusFailed, 1, 0)
	b.insert(t, tenantA, saga.StatusRunning, 0, 10*time.Minute)
	r := b.do(t, "GET", "/", "")
	if r.status != http.StatusOK {
		t.Fatalf("open page: %d", r.status)
	}
	page := string(r.body)
	if !strings.Contains(page, `id="no-token"`) || !strings.Contains(page, id.String()) {
		t.Error("the page does not say it is read-only, or lacks the stuck instance")
	}
	if !strings.Contains(page, "disabled") {
		t.Error("retry buttons are not disabled without a token")
	}
	if strings.Count(page, `class="stuck-row"`) != 2 {
		t.Errorf("want the FAILED and the overdue instance among the stuck ones")
	}
	if r := b.do(t, "GET", "/?status=DONE", ""); r.status != http.StatusOK || !strings.Contains(string(r.body), `id="page-error"`) {
		t.Errorf("bad filter on the page: %d", r.status)
	}
	if r := b.do(t, "GET", "/login", ""); r.status != http.StatusSeeOther {
		t.Errorf("login without a token: %d", r.status)
	}
}
