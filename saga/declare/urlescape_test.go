package declare

import (
	"encoding/json"
	"strings"
	"testing"
)

// urlSaga has one http step with url; compensate adds nothing.
func urlSaga(url string) string {
	return head + "steps:\n  - name: call\n    http: {method: POST, url: " + url + "}\n"
}

// TestURLEscapedWhereItStands renders URLs written as text: each ${ … }
// is escaped for its place, raw(…) is not, and a host that is not a host
// is refused with the reason.
func TestURLEscapedWhereItStands(t *testing.T) {
	t.Parallel()
	payload := map[string]any{"path": "../../admin/delete?all=true#x", "dots": "..", "q": "a&b=c#d e", "host": "pay.internal:8443",
		"bad_host": "evil.com/x?", "base": "http://pay.internal/v1", "n": int64(7)}
	vars := map[string]any{varTrigger: map[string]any{"payload": payload}}
	for _, c := range []struct{ url, want, err string }{
		{`"http://p.internal/step/${ trigger.payload.path }"`, "http://p.internal/step/..%2F..%2Fadmin%2Fdelete%3Fall=true%23x", ""},
		{`"http://p.internal/a/${ trigger.payload.dots }/b"`, "http://p.internal/a/%2E%2E/b", ""},
		{`"http://p.internal/a?x=${ trigger.payload.q }&${ trigger.payload.q }=1"`, "http://p.internal/a?x=a%26b%3Dc%23d+e&a%26b%3Dc%23d+e=1", ""},
		{`"http://p.internal/a#${ trigger.payload.path }"`, "http://p.internal/a#..%2F..%2Fadmin%2Fdelete%3Fall%3Dtrue%23x", ""},
		{`"https://${ trigger.payload.host }/c/${ trigger.payload.n }"`, "https://pay.internal:8443/c/7", ""},
		{`"https://${ trigger.payload.bad_host }/c"`, "", `gave "evil.com/x?" for the host, which holds '/'`},
		{`"http://p.internal/${ raw(trigger.payload.path) }"`, "http://p.internal/../../admin/delete?all=true#x", ""},
		{`"${ raw(trigger.payload.base) }/charges/${ trigger.payload.path }"`, "http://pay.internal/v1/charges/..%2F..%2Fadmin%2Fdelete%3Fall=true%23x", ""},
		{`"${ trigger.payload.base + '/x' }"`, "http://pay.internal/v1/x", ""},
	} {
		s, probs := LoadFile("f.yaml", []byte(urlSaga(c.url)), Options{})
		if probs != nil {
			t.Fatalf("%s: %v", c.url, probs)
		}
		got, err := s.Steps[0].Action.HTTP.URL.evalURL(vars)
		switch {
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%s: (%q, %v), want the error %q", c.url, got, err, c.err)
		case c.err == "" && (err != nil || got != c.want):
			t.Errorf("%s:\n got %q (%v)\nwant %q", c.url, got, err, c.want)
		}
	}
}

// TestURLRawAndWarnings: raw(…) is for a whole expression of http.url only;
// a URL whose start comes from an expression without raw(…) is accepted
// with a warning that says how to write it.
func TestURLRawAndWarnings(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ body, want string }{
		{urlSaga(`"http://p/${ 'a' + raw(trigger.id) }"`), `f.yaml:6:53: raw(…) in step call.http.url must be the whole expression, ${ raw(…) }; put what it wraps inside it`},
		{head + "steps:\n  - name: a\n    emit: [{event_type: x, aggregate_id: \"${ raw(trigger.id) }\"}]\n",
			`f.yaml:6:49: raw(…) in step a.emit[0].aggregate_id: raw only keeps a value of an http step's url from being escaped; remove it`},
	} {
		if s, probs := LoadFile("f.yaml", []byte(c.body), Options{}); s != nil || probs.Error() != c.want {
			t.Errorf("got %v\nwant %s", probs, c.want)
		}
	}
	for url, warned := range map[string]bool{
		`"${ trigger.payload.callback }"`:                     true,
		`"${ trigger.payload.base }/charges/${ trigger.id }"`: true,
		`"${ raw(trigger.payload.callback) }"`:                false,
		`"${ raw(trigger.payload.base) }/c/${ trigger.id }"`:  false,
		`"http://p.internal/c/${ trigger.id }"`:               false,
	} {
		s, probs := LoadFile("f.yaml", []byte(urlSaga(url)+"egress: {allow: [p.internal]}\n"), Options{})
		if probs != nil {
			t.Fatalf("%s: %v", url, probs)
		}
		ws := s.Warnings()
		if got := len(ws) == 1 && strings.Contains(ws[0].Msg, "write ${ raw(…) } to say the expression builds the URL"); got != warned || (!warned && len(ws) > 0) {
			t.Errorf("%s: warnings %v, want a warning: %v", url, ws, warned)
		}
	}
}

// TestWalkShowsEscapedURL: relay sagas test shows the URL as it is called.
func TestWalkShowsEscapedURL(t *testing.T) {
	t.Parallel()
	s, probs := LoadFile("f.yaml", []byte(urlSaga(`"http://p.internal/step/${ trigger.payload.path }"`)), Options{})
	if probs != nil {
		t.Fatal(probs)
	}
	var out strings.Builder
	if _, err := Walk(s, WalkInput{Trigger: json.RawMessage(`{"path": "../../admin/delete?all=true#x"}`)}, &out); err != nil {
		t.Fatal(err)
	}
	if want := "POST http://p.internal/step/..%2F..%2Fadmin%2Fdelete%3Fall=true%23x\n"; !strings.Contains(out.String(), want) {
		t.Errorf("walk output lacks %q:\n%s", want, out.String())
	}
}
