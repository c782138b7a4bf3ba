package httpapi_test

import (
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/compensa/compensa/internal/httpapi"
)

// signIn signs in to the page with token and returns the session cookie.
func (s *scoped) signIn(t *testing.T, token string) string {
	t.Helper()
	r := s.do(t, "POST", "/login", url.Values{"token": {token}, "next": {"/"}}.Encode(), "Content-Type", "application/x-www-form-urlencoded")
	if r.status != http.StatusSeeOther {
		t.Fatalf("sign in: %d %s", r.status, r.body)
	}
	return strings.SplitN(r.header.Get("Set-Cookie"), ";", 2)[0]
}

// TestDeadLettersPage: the page lists the dead letters and the parked
// events of the visitor's tenant, with reason and age, the outcome counts
// and the ready state; skip is offered to an operate token only.
func TestDeadLettersPage(t *testing.T) {
	t.Parallel()
	s := setupScoped(t)
	s.seedDeadLetters(t)
	s.seedParked(t)
	s.metrics.SetSources(httpapi.Sources{Outcomes: func() httpapi.EventOutcomes {
		return httpapi.EventOutcomes{Started: 11, Reply: 7, Ignored: 5, Filtered: 3, Parked: 2}
	}})

	r := s.do(t, "GET", "/deadletters", "", "Cookie", s.signIn(t, opsToken))
	if r.status != http.StatusOK {
		t.Fatalf("dead letters page: %d %s", r.status, r.body)
	}
	page := string(r.body)
	for _, want := range []string{`id="dead-letter-list"`, "dl-a1", "dl-b1", "dl-a-msg", "no saga accepts order.placed v9",
		"relay deadletters retry ", `data-sink="hook"`, "ev-b1", "POST answered 422", `id="ready-state" data-ready="true"`,
		`data-outcome="started"`, `<td class="num" data-field="count">11</td>`, `data-outcome="parked"`} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	if strings.Contains(page, "dl-a-retried") {
		t.Error("a re-driven dead letter is listed")
	}
	if !regexp.MustCompile(`data-field="age"[^>]*>\d+s<`).MatchString(page) {
		t.Error("no age like 3s on the page")
	}
	if regexp.MustCompile(`data-action="skip"[^>]*disabled`).MatchString(page) {
		t.Error("skip is disabled for an operate token")
	}

	r = s.do(t, "GET", "/deadletters", "", "Cookie", s.signIn(t, readerToken))
	page = string(r.body)
	if r.status != http.StatusOK || !strings.Contains(page, "dl-a1") || !strings.Contains(page, "ev-a1") {
		t.Fatalf("tenant A's reader: %d, its dead letters and parked events missing", r.status)
	}
	for _, other := range []string{"dl-b1", "dl-none", "ev-b1", "ev-none"} {
		if strings.Contains(page, other) {
			t.Errorf("tenant A's reader sees %s", other)
		}
	}
	if !regexp.MustCompile(`data-action="skip"[^>]*disabled`).MatchString(page) {
		t.Error("skip is offered to a read token")
	}
}

// TestPageShowsNotReady: the top of the page says the relay is not ready,
// with /readyz's reasons.
func TestPageShowsNotReady(t *testing.T) {
	t.Parallel()
	b := setup(t, options{configure: func(c *httpapi.Config) {
		c.Health = func() []string { return []string{"stream: stalled for 2m: the sink refuses the batch"} }
	}})
	for _, p := range []string{"/", "/deadletters"} {
		r := b.do(t, "GET", p, "")
		page := string(r.body)
		if r.status != http.StatusOK || !strings.Contains(page, `data-ready="false"`) || !strings.Contains(page, "stream: stalled for 2m: the sink refuses the batch") {
			t.Errorf("%s: %d; want the not-ready state with its reason at the top", p, r.status)
		}
		if p == "/deadletters" && !strings.Contains(page, `id="outcome-counts-none"`) {
			t.Errorf("%s without an Outcomes source does not say so", p)
		}
	}
}
