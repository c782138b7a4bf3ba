package declare

import (
	"net/netip"
	"strings"
	"testing"
)

// TestLiteralURLHost: a host is literal only when the text before the
// first expression (or the leading constants of a single expression) holds
// the whole scheme://host[:port]/.
func TestLiteralURLHost(t *testing.T) {
	t.Parallel()
	for url, want := range map[string]string{
		`"http://payments.internal/charges"`:                                     "payments.internal",
		`"http://Payments.Internal:8443/charges/${ trigger.payload.id }"`:        "payments.internal:8443",
		`"${ 'http://p.internal/charges/' + trigger.payload.id + '/refund' }"`:   "p.internal",
		`"${ raw('http://p.internal/charges/' + trigger.payload.id) }"`:          "p.internal",
		`"${ trigger.payload.callback }"`:                                        "",
		`"http://${ trigger.payload.host }/x"`:                                   "",
		`"http://p.internal${ trigger.payload.path }"`:                           "",
		`"http://p.internal:${ trigger.payload.port }/x"`:                        "",
		`"http://p.internal@${ trigger.payload.host }/x"`:                        "",
		`"${ 'http://p.internal' + trigger.payload.rest }"`:                      "",
		`"${ trigger.payload.scheme + '://p.internal/' }"`:                       "",
		`"${ 'http://p.internal/' + trigger.payload.a + 'http://x.internal/' }"`: "p.internal",
	} {
		body := head + "steps:\n  - name: charge\n    http: {method: POST, url: " + url + "}\n    output: {id: 1}\n"
		s, ps := LoadFile("f.yaml", []byte(body), Options{})
		if ps != nil {
			t.Fatalf("%s: %v", url, ps)
		}
		if got := s.Steps[0].Action.HTTP.LiteralHost; got != want {
			t.Errorf("url %s: literal host %q, want %q", url, got, want)
		}
	}
}

// TestEgressKeysValidated: egress.allow and follow_redirects are checked
// with the place of each bad value; an expression-built host in a file
// without egress.allow is a warning at the URL.
func TestEgressKeysValidated(t *testing.T) {
	t.Parallel()
	bad := head + "egress: {allow: [\"payments.internal\", \"10.2.0.0/33\", \"exa mple\"]}\nsteps:\n  - name: a\n    http: {method: GET, url: \"${ raw(trigger.payload.u) }\", follow_redirects: always}\n"
	_, ps := LoadFile("f.yaml", []byte(bad), Options{})
	got := ps.Error()
	for _, want := range []string{
		`f.yaml:4:39: egress.allow: "10.2.0.0/33" is neither a host name, an IP address nor a CIDR network`,
		`f.yaml:4:54: egress.allow: "exa mple" is neither`,
		`f.yaml:7:`,
		`follow_redirects`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("problems lack %q:\n%s", want, got)
		}
	}
	fileURL := head + "steps:\n  - name: a\n    http: {method: GET, url: \"file:///etc/passwd\"}\n"
	if _, ps := LoadFile("f.yaml", []byte(fileURL), Options{}); ps == nil || !strings.Contains(ps.Error(), "f.yaml:6:30: step a.http.url \"file:///etc/passwd\" is not an http:// or https:// URL") {
		t.Errorf("a literal file:// URL: %v", ps)
	}

	open := head + "steps:\n  - name: a\n    http: {method: GET, url: \"${ raw(trigger.payload.u) }\"}\n"
	s, ps := LoadFile("f.yaml", []byte(open), Options{})
	if ps != nil {
		t.Fatal(ps)
	}
	if w := s.Warnings(); len(w) != 1 || !strings.HasPrefix(w[0].String(), "f.yaml:6:30: warning: step a builds the host of its http.url from an expression and the file has no egress.allow") {
		t.Errorf("warnings %v", w)
	}
	listed := head + "egress: {allow: [payments.internal]}\nsteps:\n  - name: a\n    http: {method: GET, url: \"${ raw(trigger.payload.u) }\", follow_redirects: same_origin}\n"
	s, ps = LoadFile("f.yaml", []byte(listed), Options{})
	if ps != nil {
		t.Fatal(ps)
	}
	if w := s.Warnings(); len(w) != 0 || s.Steps[0].Action.HTTP.FollowRedirects != FollowSameOrigin {
		t.Errorf("warnings %v, follow %q", w, s.Steps[0].Action.HTTP.FollowRedirects)
	}
}

// TestEgressPolicy: special addresses need a listed address or network;
// a name alone allows only public addresses; the operator's list adds to
// the file's.
func TestEgressPolicy(t *testing.T) {
	t.Parallel()
	p := newEgressPolicy([]string{"payments.internal", "10.2.0.0/16"}, []string{"metadata.ops", "169.254.169.254", "::ffff:192.168.7.0/120"})
	for _, c := range []struct {
		host, addr string
		ok         bool
	}{
		{"payments.internal", "10.2.3.4", true},    // listed network
		{"payments.internal", "10.3.0.1", false},   // a private address outside it
		{"payments.internal", "203.0.113.9", true}, // public, listed name
		{"other.example", "203.0.113.9", false},    // public, name not listed
		{"anything", "10.2.0.1", true},             // listed network, whatever the name
		{"payments.internal", "127.0.0.1", false},  // loopback
		{"payments.internal", "::1", false},        // loopback
		{"payments.internal", "::ffff:127.0.0.1", false},
		{"metadata.ops", "169.254.169.254", true}, // listed by the operator
		{"metadata.ops", "fd00:ec2::254", false},  // metadata over IPv6
		{"payments.internal", "100.100.100.200", false},
		{"payments.internal", "169.254.1.1", false}, // link-local
		{"payments.internal", "0.0.0.0", false},
		{"payments.internal", "fc00::1", false},
		{"x", "192.168.7.20", true}, // mapped prefix written in IPv6
	} {
		err := p.checkAddr(c.host, netip.MustParseAddr(c.addr))
		if (err == nil) != c.ok {
			t.Errorf("%s at %s: %v, want allowed=%v", c.host, c.addr, err, c.ok)
		}
	}
	if err := p.precheck("unlisted.example"); err != nil {
		t.Errorf("with networks listed, a name waits for its address: %v", err)
	}
	if err := newEgressPolicy([]string{"a.internal"}).precheck("b.internal"); err == nil || !strings.Contains(err.Error(), "host b.internal is not allowed") {
		t.Errorf("a name nobody listed: %v", err)
	}
	if err := ValidateEgressAllow([]string{"ok.internal", "10.0.0.0/8", "fe80::/10", "bad/99", ""}); err == nil ||
		!strings.Contains(err.Error(), `"bad/99"`) || !strings.Contains(err.Error(), `""`) {
		t.Errorf("ValidateEgressAllow: %v", err)
	}
}
