package httpapi

import (
	"bytes"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/admin"
)

// FuzzParseFilter: any query string of GET /v1/sagas is refused with
// ErrInvalid (a 400 that names the parameter) or read into a filter that
// holds only what was asked: known parameters, each once, a positive limit, a
// tenant that is a UUID.
func FuzzParseFilter(f *testing.F) {
	for _, s := range []string{"", "status=FAILED&stuck=true&limit=50", "stuk=true", "limit=0", "limit=-1",
		"limit=99999999999999999999", "tenant=not-a-uuid", "tenant=6f9619ff-8b86-d011-b42d-00cf4fc964ff",
		"status=RUNNING&status=FAILED", "cursor=%00%ff", "saga=%27%3B+DROP+TABLE+saga_instances%3B--",
		"stuck=maybe", "a=1;b=2", "%zz=1", "limit=1e3", "limit=+5", "cursor=" + strings.Repeat("A", 5000)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		q := (&url.URL{RawQuery: raw}).Query() // what r.URL.Query() gives the handler
		flt, err := parseFilter(q)
		if err != nil {
			if !errors.Is(err, saga.ErrInvalid) {
				t.Fatalf("%q: error without ErrInvalid: %v", raw, err)
			}
			if strings.ContainsAny(err.Error(), "\r\n") {
				t.Fatalf("%q: multi-line error %q", raw, err)
			}
			return
		}
		for k, v := range q {
			if !listParams[k] || len(v) != 1 {
				t.Fatalf("%q: accepted parameter %q given %d times", raw, k, len(v))
			}
		}
		if flt.Limit < 0 || (q.Has("limit") && q.Get("limit") != "" && flt.Limit < 1) {
			t.Fatalf("%q: limit %d", raw, flt.Limit)
		}
		if q.Get("tenant") != "" && !flt.Tenant.Valid {
			t.Fatalf("%q: tenant dropped", raw)
		}
		if flt.Saga != q.Get("saga") || flt.Cursor != q.Get("cursor") || string(flt.Status) != q.Get("status") {
			t.Fatalf("%q: filter %+v does not hold what was asked", raw, flt)
		}
		_ = admin.Filter(flt)
	})
}

// FuzzPathID: {id} of /v1/sagas/{id} is a saga instance id in its canonical
// 36-character form (any case), or refused with ErrInvalid.
func FuzzPathID(f *testing.F) {
	for _, s := range []string{"0b7e6c2a-1f0e-4a57-9a43-5d2c1e6f8b90", "0B7E6C2A-1F0E-4A57-9A43-5D2C1E6F8B90",
		"{0b7e6c2a-1f0e-4a57-9a43-5d2c1e6f8b90}", "urn:uuid:0b7e6c2a-1f0e-4a57-9a43-5d2c1e6f8b90",
		"0b7e6c2a1f0e4a579a435d2c1e6f8b90", "", "../../etc/passwd", "0b7e6c2a-1f0e-4a57-9a43-5d2c1e6f8b9\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		r := httptest.NewRequest(http.MethodGet, "/v1/sagas/x", nil)
		r.SetPathValue("id", raw)
		id, err := pathID(r)
		if err != nil {
			if !errors.Is(err, saga.ErrInvalid) {
				t.Fatalf("%q: error without ErrInvalid: %v", raw, err)
			}
			return
		}
		if id.String() != strings.ToLower(raw) {
			t.Fatalf("%q accepted as %s", raw, id)
		}
	})
}

// FuzzReadAction: the body of retry and cancel is empty, or one JSON object
// with at most a reason, or refused with ErrInvalid.
func FuzzReadAction(f *testing.F) {
	for _, s := range []string{"", "  ", `{"reason": "operator fixed the title"}`, `{"reason": 1}`, `{"why": "x"}`,
		`{"reason": "a"} {"reason": "b"}`, `[]`, `null`, `{"reason": "\u0000"}`, "{\"reason\": \"\xff\"}",
		`{"reason": "` + strings.Repeat("x", maxBody) + `"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		r := httptest.NewRequest(http.MethodPost, "/v1/sagas/x/retry", bytes.NewReader(body))
		b, err := readAction(r)
		if err != nil {
			if !errors.Is(err, saga.ErrInvalid) {
				t.Fatalf("%q: error without ErrInvalid: %v", body, err)
			}
			return
		}
		if len(body) > maxBody {
			t.Fatalf("accepted a body of %d bytes, the limit is %d", len(body), maxBody)
		}
		if len(bytes.TrimSpace(body)) == 0 && b.Reason != "" {
			t.Fatalf("empty body gave reason %q", b.Reason)
		}
	})
}

// FuzzLoginRedirect: the next parameter of the login page never sends the
// browser to another site. The check is on the Location header as a browser
// reads it: the URL standard strips tabs and newlines anywhere and C0
// controls and spaces at both ends before parsing, and treats a backslash
// like a slash, so "/\t/evil.example" is "//evil.example".
func FuzzLoginRedirect(f *testing.F) {
	for _, s := range []string{"/", "/sagas/0b7e6c2a-1f0e-4a57-9a43-5d2c1e6f8b90?x=1", "//evil.example", "/\\evil.example",
		"https://evil.example", "/\t/evil.example", "/\n/evil.example", " //evil.example", "/%2F/evil.example",
		"javascript:alert(1)", "\x00//evil.example", "/./\t/evil.example"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, next string) {
		w := httptest.NewRecorder()
		http.Redirect(w, httptest.NewRequest(http.MethodPost, "/login", nil), safeNext(next), http.StatusSeeOther)
		loc := w.Header().Get("Location")
		seen := browserURL(loc)
		if !strings.HasPrefix(seen, "/") || len(seen) > 1 && (seen[1] == '/' || seen[1] == '\\') {
			t.Fatalf("next=%q redirects to %q, which a browser reads as %q: off this site", next, loc, seen)
		}
	})
}

// browserURL applies the URL standard's input clean-up.
func browserURL(s string) string {
	s = strings.TrimFunc(s, func(r rune) bool { return r <= ' ' })
	return strings.Map(func(r rune) rune {
		if r == '\t' || r == '\n' || r == '\r' {
			return -1
		}
		return r
	}, s)
}

// FuzzReadBulk: a bulk body is refused with ErrInvalid or read into a
// request whose dry run defaults to true: a body that does not say
// "dry_run": false never acts.
func FuzzReadBulk(f *testing.F) {
	for _, s := range []string{`{"filter": {"saga": "order", "status": "FAILED"}, "reason": "x"}`,
		`{"filter": {}, "reason": "x", "dry_run": false, "limit": 5}`, `{"filter": {"tenant": "nope"}}`,
		`{"filter": {"created_after": "2026-01-02T15:04:05Z"}, "reason": "r", "dry_run": null}`, `{"limit": -1}`,
		`{"filter": {"colour": "red"}}`, `{} {}`, `null`, ""} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		r := httptest.NewRequest(http.MethodPost, "/v1/sagas/retry", bytes.NewReader(body))
		b, err := readBulk(r)
		if err != nil {
			if !errors.Is(err, saga.ErrInvalid) {
				t.Fatalf("%q: error without ErrInvalid: %v", body, err)
			}
			return
		}
		if b.Limit < 0 {
			t.Fatalf("accepted limit %d", b.Limit)
		}
		if !(b.DryRun == nil || *b.DryRun) && !bytes.Contains(body, []byte("false")) {
			t.Fatalf("%q: a real run without dry_run false", body)
		}
	})
}
