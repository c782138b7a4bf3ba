package declare

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"time"

	"cel.dev/cel-go/common/ast"
	"cel.dev/cel-go/common/operators"
	"cel.dev/cel-go/common/types"
)

// The egress policy of http steps.
//
// A URL whose host is written literally in the saga file (the text before
// the first expression, or the leading string constants of a single
// expression, holds the whole scheme://host[:port]/) is called as written:
// the file's author chose that host. A URL whose host comes from an
// expression (event data, a step's output) may reach only what the file's
// egress.allow or the relay's --http-egress-allow lists: a host name, an IP
// address, or a CIDR network. Every address such a call connects to is
// checked when it is dialled, after DNS resolution (a name cannot resolve
// to one address at a check and another at the connection): loopback,
// private, link-local, cloud metadata and other special addresses are
// refused unless a listed IP or network holds them, and any other address
// is refused unless its host is listed by name or a listed network holds it.
// Only http and https URLs are called, and no call follows a redirect
// unless the action says follow_redirects: same_origin.

// FollowSameOrigin is the follow_redirects value that follows a redirect to
// the same scheme, host and port.
const FollowSameOrigin = "same_origin"

// maxRedirects bounds the redirects followed with follow_redirects:
// same_origin.
const maxRedirects = 10

// egressPolicy is what a call whose host comes from an expression may
// reach.
type egressPolicy struct {
	names map[string]bool
	nets  []netip.Prefix
}

// parseAllowEntry reads one allow-list entry: a host name, an IP address or
// a CIDR network.
func parseAllowEntry(s string) (name string, pfx netip.Prefix, err error) {
	v := strings.TrimSuffix(strings.ToLower(strings.TrimSpace(s)), ".")
	if strings.Contains(v, "/") {
		p, perr := netip.ParsePrefix(v)
		if perr == nil {
			return "", netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-unmapBits(p.Addr())).Masked(), nil
		}
	} else if a, aerr := netip.ParseAddr(strings.Trim(v, "[]")); aerr == nil {
		a = a.Unmap()
		return "", netip.PrefixFrom(a, a.BitLen()), nil
	} else if validHostName(v) {
		return v, netip.Prefix{}, nil
	}
	return "", netip.Prefix{}, fmt.Errorf("%q is neither a host name, an IP address nor a CIDR network; write e.g. payments.internal, 10.2.0.5 or 10.2.0.0/16", s)
}

// unmapBits is how many prefix bits an IPv4-mapped IPv6 prefix loses when
// it is written as IPv4.
func unmapBits(a netip.Addr) int {
	if a.Is4In6() {
		return 96
	}
	return 0
}

func validHostName(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
				return false
			}
		}
	}
	return true
}

// ValidateEgressAllow checks the entries of --http-egress-allow (or
// relay.Config.HTTPEgressAllow): each a host name, an IP address or a CIDR
// network.
func ValidateEgressAllow(entries []string) error {
	var errs []error
	for _, e := range entries {
		if _, _, err := parseAllowEntry(e); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func newEgressPolicy(lists ...[]string) egressPolicy {
	p := egressPolicy{names: map[string]bool{}}
	for _, l := range lists {
		for _, e := range l {
			name, pfx, err := parseAllowEntry(e)
			switch {
			case err != nil: // refused when the list was loaded
			case name != "":
				p.names[name] = true
			default:
				p.nets = append(p.nets, pfx)
			}
		}
	}
	return p
}

func (p egressPolicy) allowsName(host string) bool {
	return p.names[strings.TrimSuffix(strings.ToLower(host), ".")]
}

func (p egressPolicy) allowsAddr(a netip.Addr) bool {
	for _, n := range p.nets {
		if n.Contains(a) {
			return true
		}
	}
	return false
}

// EgressError is a call the egress policy refused; nothing was sent.
type EgressError struct{ msg string }

func (e *EgressError) Error() string { return e.msg }

const egressFix = "list it in the saga's egress.allow or the relay's --http-egress-allow if the call is meant to go there"

// precheck refuses, before any connection, a host that no entry can allow.
func (p egressPolicy) precheck(host string) error {
	if a, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		return p.checkAddr(host, a.Unmap())
	}
	if p.allowsName(host) || len(p.nets) > 0 {
		return nil // the dial check decides on the resolved address
	}
	return &EgressError{fmt.Sprintf("host %s is not allowed: the URL's host comes from an expression and is not in the egress allow list; %s", host, egressFix)}
}

// checkAddr decides on one resolved address of host.
func (p egressPolicy) checkAddr(host string, a netip.Addr) error {
	a = a.Unmap()
	if p.allowsAddr(a) {
		return nil
	}
	via := ""
	if h := strings.Trim(host, "[]"); h != a.String() {
		via = " (resolved from " + host + ")"
	}
	if kind := specialAddr(a); kind != "" {
		return &EgressError{fmt.Sprintf("address %s%s is refused: a %s address; %s", a, via, kind, egressFix)}
	}
	if p.allowsName(host) {
		return nil
	}
	return &EgressError{fmt.Sprintf("address %s%s is not allowed: the URL's host comes from an expression and neither the host nor a network holding the address is in the egress allow list; %s", a, via, egressFix)}
}

var (
	metadataAddrs = []netip.Addr{
		netip.MustParseAddr("169.254.169.254"), // AWS, GCP, Azure, OpenStack
		netip.MustParseAddr("fd00:ec2::254"),   // AWS over IPv6
		netip.MustParseAddr("100.100.100.200"), // Alibaba Cloud
		netip.MustParseAddr("169.254.170.2"),   // AWS ECS task metadata
	}
	specialNets = []struct {
		p    netip.Prefix
		kind string
	}{
		{netip.MustParsePrefix("0.0.0.0/8"), "\"this network\""},
		{netip.MustParsePrefix("100.64.0.0/10"), "shared (carrier-grade NAT)"},
		{netip.MustParsePrefix("192.0.0.0/24"), "IETF protocol"},
		{netip.MustParsePrefix("198.18.0.0/15"), "benchmarking"},
		{netip.MustParsePrefix("240.0.0.0/4"), "reserved"},
		{netip.MustParsePrefix("64:ff9b::/96"), "NAT64"},
		{netip.MustParsePrefix("64:ff9b:1::/48"), "NAT64"},
		{netip.MustParsePrefix("fec0::/10"), "site-local"},
		{netip.MustParsePrefix("2002::/16"), "6to4"},
	}
)

// specialAddr names the kind of an address an expression-built URL may not
// reach unless it is listed; "" for an ordinary public address.
func specialAddr(a netip.Addr) string {
	for _, m := range metadataAddrs {
		if a == m {
			return "cloud metadata"
		}
	}
	switch {
	case a.IsLoopback():
		return "loopback"
	case a.IsUnspecified():
		return "unspecified"
	case a.IsPrivate():
		return "private"
	case a.IsLinkLocalUnicast(), a.IsLinkLocalMulticast():
		return "link-local"
	case a.IsMulticast(), a.IsInterfaceLocalMulticast():
		return "multicast"
	case a == netip.MustParseAddr("255.255.255.255"):
		return "broadcast"
	}
	for _, s := range specialNets {
		if s.p.Contains(a) {
			return s.kind
		}
	}
	return ""
}

// checkedTransport connects only where p allows, checking each address at
// the moment it is dialled. It uses no proxy: a proxy would make the
// address checked the proxy's, not the destination's.
func checkedTransport(p egressPolicy) *http.Transport {
	t := &http.Transport{
		ForceAttemptHTTP2: true, MaxIdleConns: 100, IdleConnTimeout: 90 * time.Second,
		TLSHandshakeTimeout: 10 * time.Second, ExpectContinueTimeout: time.Second,
	}
	t.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		d := net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second,
			Control: func(_, address string, _ syscall.RawConn) error {
				ip, _, err := net.SplitHostPort(address)
				if err != nil {
					return err
				}
				a, err := netip.ParseAddr(ip)
				if err != nil {
					return &EgressError{fmt.Sprintf("address %q cannot be checked", ip)}
				}
				return p.checkAddr(host, a)
			}}
		return d.DialContext(ctx, network, addr)
	}
	return t
}

// literalTransport makes the calls to hosts written in the file: those go
// where the file says, through the environment's proxy as before.
var literalTransport = sync.OnceValue(func() http.RoundTripper {
	return http.DefaultTransport.(*http.Transport).Clone()
})

// egress holds a saga's two ways out: as written, and checked.
type egress struct {
	literal http.RoundTripper
	checked *http.Transport
	policy  egressPolicy
}

func newEgress(s *Saga, rt *Runtime) *egress {
	e := &egress{literal: literalTransport()}
	var operator []string
	if rt != nil {
		operator = rt.EgressAllow
		if rt.HTTP != nil && rt.HTTP.Transport != nil {
			e.literal = rt.HTTP.Transport
		}
	}
	e.policy = newEgressPolicy(s.Egress, operator)
	e.checked = checkedTransport(e.policy)
	return e
}

// client is the client of one call: it follows no redirect, or with
// follow_redirects: same_origin only those to the original origin.
func (e *egress) client(literal bool, follow string) *http.Client {
	c := &http.Client{Transport: e.checked}
	if literal {
		c.Transport = e.literal
	}
	c.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		if follow == FollowSameOrigin && len(via) < maxRedirects && sameOrigin(req.URL, via[0].URL) {
			return nil
		}
		return http.ErrUseLastResponse
	}
	return c
}

func sameOrigin(a, b *url.URL) bool {
	return strings.EqualFold(a.Scheme, b.Scheme) && strings.EqualFold(a.Hostname(), b.Hostname()) && portOf(a) == portOf(b)
}

func portOf(u *url.URL) string {
	if p := u.Port(); p != "" {
		return p
	}
	if strings.EqualFold(u.Scheme, "https") {
		return "443"
	}
	return "80"
}

// redirectHost names where a 3xx answer points.
func redirectHost(resp *http.Response) string {
	loc, err := resp.Location()
	if err != nil || loc.Host == "" {
		return "an unnamed location"
	}
	return loc.Host
}

// literalURLHost is the host[:port] (lower case) of a URL template whose
// scheme and host are written literally, or "" when an expression can
// change them.
func literalURLHost(t *template) string {
	if t == nil {
		return ""
	}
	var prefix string
	switch {
	case t.single == nil && !t.isText:
		s, ok := t.literal.(string)
		if !ok {
			return ""
		}
		return hostOfPrefix(s + "/")
	case t.single != nil:
		prefix = exprLiteralPrefix(t.single)
	default:
		var b strings.Builder
		for _, p := range t.parts {
			if p.e != nil {
				b.WriteString(exprLiteralPrefix(p.e))
				break
			}
			b.WriteString(p.text)
		}
		prefix = b.String()
	}
	return hostOfPrefix(prefix)
}

// hostOfPrefix reads the host of the start of a URL: only when the
// authority ends (at '/', '?' or '#') inside the prefix.
func hostOfPrefix(prefix string) string {
	i := strings.Index(prefix, "://")
	if i < 0 {
		return ""
	}
	rest := prefix[i+3:]
	end := strings.IndexAny(rest, "/?#")
	if end < 0 {
		return ""
	}
	u, err := url.Parse(prefix[:i+3+end])
	if err != nil || u.Host == "" || u.User != nil {
		return ""
	}
	return strings.ToLower(u.Host)
}

// exprLiteralPrefix is the text an expression's result surely starts with:
// its leading string constants joined by +.
func exprLiteralPrefix(x *expr) string {
	if x == nil || x.ast == nil {
		return ""
	}
	var b strings.Builder
	var walk func(e ast.Expr) bool // reports whether e was wholly literal
	walk = func(e ast.Expr) bool {
		switch e.Kind() {
		case ast.LiteralKind:
			if s, ok := e.AsLiteral().(types.String); ok {
				b.WriteString(string(s))
				return true
			}
			return false
		case ast.CallKind:
			c := e.AsCall()
			if c.FunctionName() == funcRaw && len(c.Args()) == 1 {
				return walk(c.Args()[0])
			}
			if c.FunctionName() != operators.Add || len(c.Args()) != 2 {
				return false
			}
			return walk(c.Args()[0]) && walk(c.Args()[1])
		}
		return false
	}
	walk(x.ast.Expr())
	return b.String()
}
