// Package webhook delivers outbox events to an HTTP endpoint: one POST per
// event, its body the JSON envelope of the row (sink.Event) or a CloudEvent
// (binary or structured content mode of the HTTP binding), signed per the
// Standard Webhooks specification (webhook-id = the outbox row's id,
// webhook-timestamp, webhook-signature "v1,<base64 HMAC-SHA256>" over
// "id.timestamp.body" with the whsec_ secret).
//
// Answers: 2xx delivered; a 3xx is never followed and parks the event with
// the reason "redirected to <host>"; 410 disables the sink (sink.Gone); 429 and any
// answer with Retry-After slow it down (sink.RetryAfter); 413 and other 4xx
// refuse this event (sink.EventError); 5xx and transport errors mean the
// endpoint is down.
package webhook

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"hash"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/compensa/compensa/sink"
)

// SecretPrefix starts every Standard Webhooks secret.
const SecretPrefix = "whsec_"

// Config configures a webhook sink.
type Config struct {
	URL string
	// Secret is the whsec_… secret; empty sends unsigned requests.
	Secret      string
	Timeout     time.Duration
	Concurrency int
	// Client is the HTTP client (default: one of its own).
	Client *http.Client
	// LegacyUnderscoreHeaders sends the event's metadata headers under
	// their former names, Event_type, Tenant_id, ... (which nginx and other
	// proxies drop by default), instead of Event-Type, Tenant-Id, ...;
	// deprecated, removed in the next release.
	LegacyUnderscoreHeaders bool
	// Format is sink.FormatEnvelope (or empty: the JSON envelope),
	// sink.FormatCloudEvents (binary content mode: the data as the body,
	// attributes as ce- headers, percent-encoded, per the HTTP protocol
	// binding) or sink.FormatCloudEventsStructured (an
	// application/cloudevents+json body). Every format is signed over the
	// body sent.
	Format string
	// Source is the CloudEvents source.
	Source string
}

// Sink is a webhook destination; safe for concurrent use.
type Sink struct {
	cfg Config
	key []byte
	now func() time.Time
	// conns drives a plain-HTTP endpoint when no Client was given (nil:
	// every request goes through cfg.Client); req is the method and URL
	// its answers are read for.
	conns *conns
	req   *http.Request
	macs  sync.Pool // of *signer
}

var _ sink.Sink = (*Sink)(nil)

// New validates cfg. A secret that is not whsec_<base64> is an error that
// never shows the secret.
func New(cfg Config) (*Sink, error) {
	s := &Sink{cfg: cfg, now: time.Now}
	if cfg.Secret != "" {
		key, err := DecodeSecret(cfg.Secret)
		if err != nil {
			return nil, err
		}
		s.key = key
	}
	if s.cfg.Timeout <= 0 {
		s.cfg.Timeout = 10 * time.Second
	}
	s.cfg.Concurrency = max(s.cfg.Concurrency, 1)
	s.macs.New = func() any { return &signer{mac: hmac.New(sha256.New, s.key), buf: make([]byte, 0, 128)} }
	// A URL that does not parse fails each request, as through http.Client.
	if u, err := url.Parse(cfg.URL); err == nil && s.cfg.Client == nil && u.Scheme == "http" && u.User == nil && plainHost(u.Host) {
		s.req = &http.Request{Method: http.MethodPost, URL: u, Host: u.Host}
		port := u.Port()
		if port == "" {
			port = "80"
		}
		s.conns = newConns(net.JoinHostPort(u.Hostname(), port), s.cfg.Concurrency)
	}
	if s.cfg.Client == nil {
		s.cfg.Client = &http.Client{Transport: &http.Transport{
			MaxIdleConnsPerHost: s.cfg.Concurrency, IdleConnTimeout: 90 * time.Second,
		}}
	} else {
		c := *s.cfg.Client
		s.cfg.Client = &c
	}
	// A redirect is never followed: the signed body and its headers go only
	// to the configured URL, and only its 2xx counts as delivered.
	s.cfg.Client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return s, nil
}

// DecodeSecret returns the HMAC key of a whsec_ secret.
func DecodeSecret(secret string) ([]byte, error) {
	b64, ok := strings.CutPrefix(secret, SecretPrefix)
	if !ok {
		return nil, errors.New("webhook secret does not start with whsec_; generate one with e.g. `echo whsec_$(head -c 32 /dev/urandom | base64)`")
	}
	key, err := base64.StdEncoding.DecodeString(b64)
	if err != nil || len(key) < 16 {
		return nil, errors.New("webhook secret is not whsec_ followed by the base64 of at least 16 random bytes")
	}
	return key, nil
}

// Sign returns the webhook-signature value for one request.
func Sign(key []byte, id, timestamp string, body []byte) string {
	sig, _ := signWith(hmac.New(sha256.New, key), nil, id, timestamp, body)
	return sig
}

// signWith computes Sign's signature with m, an HMAC of the key (reset
// first), using scratch as working space, which it returns for reuse.
func signWith(m hash.Hash, scratch []byte, id, timestamp string, body []byte) (string, []byte) {
	m.Reset()
	scratch = append(append(append(append(scratch[:0], id...), '.'), timestamp...), '.')
	m.Write(scratch)
	m.Write(body)
	sum := m.Sum(scratch[:0])
	var out [3 + 44]byte // "v1," and the base64 of 32 bytes
	copy(out[:], "v1,")
	base64.StdEncoding.Encode(out[3:], sum)
	return string(out[:]), sum[:0]
}

// appendHead appends the head of a POST of n bytes with the headers hs
// (canonical names, one value each) as http.Request.Write writes it: hs's
// values hold no control characters, and its names no reserved one.
func (s *Sink) appendHead(b []byte, hs []sink.Header, n int) []byte {
	b = append(b, "POST "...)
	b = append(b, s.req.URL.RequestURI()...)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, s.req.Host...)
	ua := "Go-http-client/1.1"
	for _, h := range hs {
		if h.Key == "User-Agent" {
			ua = h.Value
		}
	}
	if ua = strings.Trim(ua, " \t"); ua != "" {
		b = append(b, "\r\nUser-Agent: "...)
		b = append(b, ua...)
	}
	b = append(b, "\r\nContent-Length: "...)
	b = strconv.AppendInt(b, int64(n), 10)
	for _, h := range hs {
		if h.Key == "User-Agent" {
			continue
		}
		b = append(b, "\r\n"...)
		b = append(b, h.Key...)
		b = append(b, ": "...)
		b = append(b, strings.Trim(h.Value, " \t")...)
	}
	return append(b, "\r\n\r\n"...)
}

// metadataHeaders are the header names of every event's metadata
// (sink.Event.MessageHeaders) as a webhook request carries them: hyphens,
// as proxies pass them (nginx drops a name with an underscore by default).
var metadataHeaders = map[string]string{
	"event_type": "Event-Type", "aggregate_type": "Aggregate-Type", "aggregate_id": "Aggregate-Id",
	"tenant_id": "Tenant-Id", "correlation_id": "Correlation-Id", "causation_id": "Causation-Id", "poison": "Poison",
}

// legacyMetadataHeaders are the former names (LegacyUnderscoreHeaders).
var legacyMetadataHeaders = func() map[string]string {
	m := map[string]string{}
	for k := range metadataHeaders {
		m[k] = http.CanonicalHeaderKey(k)
	}
	return m
}()

// canonicalKey is the name a header of MessageHeaders is sent under: a
// metadata header's as metadataHeaders says (a row's own headers cannot
// take those names: sink.ReservedHeader), any other in canonical form.
func (s *Sink) canonicalKey(k string) string {
	names := metadataHeaders
	if s.cfg.LegacyUnderscoreHeaders {
		names = legacyMetadataHeaders
	}
	if c, ok := names[k]; ok {
		return c
	}
	return http.CanonicalHeaderKey(k)
}

// plainHost reports whether host is written in the Host header as it is:
// printable ASCII without a zone (an international name or an IPv6 zone
// goes through http.Client, which converts them).
func plainHost(host string) bool {
	if host == "" || strings.Contains(host, "%") {
		return false
	}
	for i := 0; i < len(host); i++ {
		if host[i] <= ' ' || host[i] >= 0x7f {
			return false
		}
	}
	return true
}

// signer is a reusable HMAC of the sink's key and its scratch buffer.
type signer struct {
	mac hash.Hash
	buf []byte
}

// sign is Sign with a pooled HMAC of the sink's key.
func (s *Sink) sign(id, timestamp string, body []byte) string {
	g := s.macs.Get().(*signer)
	defer s.macs.Put(g)
	var sig string
	sig, g.buf = signWith(g.mac, g.buf, id, timestamp, body)
	return sig
}

// Verify checks a request's signature header (any of its space-separated
// v1 signatures) against key: what a receiver does.
func Verify(key []byte, id, timestamp string, body []byte, header string) bool {
	want := Sign(key, id, timestamp, body)
	for _, sig := range strings.Fields(header) {
		if hmac.Equal([]byte(sig), []byte(want)) {
			return true
		}
	}
	return false
}

// Deliver posts evs, in order per aggregate, up to Concurrency aggregates
// at once.
func (s *Sink) Deliver(ctx context.Context, evs []*sink.Event) []error {
	errs := make([]error, len(evs))
	// The aggregates in the order of their first event (heads), and each
	// event's successor within its aggregate (0: none; events are numbered
	// from 1 in next).
	type aggregate struct{ typ, id string }
	index := make(map[aggregate]int, len(evs))
	var heads, tails []int
	next := make([]int, len(evs))
	for i, ev := range evs {
		k := aggregate{ev.AggregateType, ev.AggregateID}
		g, ok := index[k]
		if !ok {
			index[k] = len(heads)
			heads, tails = append(heads, i), append(tails, i)
			continue
		}
		next[tails[g]] = i + 1
		tails[g] = i
	}
	// Concurrency workers take the aggregates in the order of their first
	// event, each delivering one aggregate's events in order.
	var taken atomic.Int64
	var wg sync.WaitGroup
	for range min(s.cfg.Concurrency, len(heads)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			in := &interrupter{}
			defer context.AfterFunc(ctx, in.interrupt)()
			for {
				g := int(taken.Add(1) - 1)
				if g >= len(heads) {
					return
				}
				failed := false
				for i := heads[g]; ; i = next[i] - 1 {
					if failed {
						errs[i] = sink.ErrHeldBack
					} else if errs[i] = s.post(ctx, in, evs[i]); errs[i] != nil {
						failed = true
					}
					if next[i] == 0 {
						break
					}
				}
			}
		}()
	}
	wg.Wait()
	return errs
}

// bufs holds the buffers of requests to a plain-HTTP endpoint, which are
// done with once the answer is read.
var bufs = sync.Pool{New: func() any { b := make([]byte, 0, 2048); return &b }}

// Request is what Deliver posts for ev: the headers (canonical names,
// signature included) and the body, appended to buf.
func (s *Sink) Request(ev *sink.Event, buf []byte) ([]sink.Header, []byte) {
	var body []byte
	var msg []sink.Header
	switch s.cfg.Format {
	case sink.FormatCloudEvents, sink.FormatCloudEventsStructured:
		enc := ev.Encode(s.cfg.Format, s.cfg.Source, "ce-", "Content-Type", sink.PercentEncode)
		body, msg = append(buf, enc.Body...), enc.Headers
	default:
		body, msg = ev.AppendEnvelope(buf), ev.MessageHeaders()
	}
	ts := strconv.FormatInt(s.now().Unix(), 10)
	id := HeaderID(ev.ID)
	hs := make([]sink.Header, 3, 4+len(msg))
	hs[0], hs[1], hs[2] = sink.Header{Key: "Content-Type", Value: "application/json"},
		sink.Header{Key: "Webhook-Id", Value: id}, sink.Header{Key: "Webhook-Timestamp", Value: ts}
	if s.key != nil {
		hs = append(hs, sink.Header{Key: "Webhook-Signature", Value: s.sign(id, ts, body)})
	}
	// MessageHeaders leaves out every reserved name of the row's headers
	// (sink.ReservedHeader), the signature's and the framing's included.
	// Names are sent in canonical form; of two that are one name so, the
	// later one's value is sent (as http.Header.Set does): a CloudEvent's
	// datacontenttype replaces application/json.
next:
	for _, kv := range msg {
		if !validHeaderName(kv.Key) {
			continue
		}
		h := sink.Header{Key: s.canonicalKey(kv.Key), Value: withoutControl(kv.Value)}
		for i := range hs {
			if hs[i].Key == h.Key {
				hs[i] = h
				continue next
			}
		}
		hs = append(hs, h)
	}
	return hs, body
}

func (s *Sink) post(ctx context.Context, in *interrupter, ev *sink.Event) error {
	var buf *[]byte
	var body []byte
	var hs []sink.Header
	if s.conns != nil {
		buf = bufs.Get().(*[]byte)
		defer func() {
			if cap(*buf) <= 64<<10 {
				bufs.Put(buf)
			}
		}()
		// One buffer: the body, then the head, written once the body's
		// length is known.
		hs, *buf = s.Request(ev, (*buf)[:0])
		body = *buf
	} else {
		hs, body = s.Request(ev, nil)
	}
	var resp *http.Response
	var err error
	if s.conns != nil {
		*buf = s.appendHead(body, hs, len(body))
		body, head := (*buf)[:len(body)], (*buf)[len(body):]
		resp, err = s.conns.roundTrip(ctx, in, s.req, head, body, s.cfg.Timeout)
	} else {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.cfg.Timeout)
		defer cancel()
		var req *http.Request
		if req, err = http.NewRequestWithContext(ctx, http.MethodPost, s.cfg.URL, bytes.NewReader(body)); err != nil {
			return err
		}
		for _, h := range hs {
			req.Header[h.Key] = []string{h.Value}
		}
		resp, err = s.cfg.Client.Do(req)
	}
	if err != nil {
		// A *url.Error repeats the whole URL, query string included: keep
		// only its cause beside the redacted URL.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return fmt.Errorf("POST %s: %w", redactURL(s.cfg.URL), err)
	}
	if s.conns == nil { // conns has read the body already
		io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
	}
	code := resp.StatusCode
	if code >= 200 && code < 300 {
		return nil
	}
	if code >= 300 && code < 400 {
		// Parked with the reason: following it would send the signature to
		// a host nobody configured, and an http→https redirect would turn
		// the POST into a GET that delivers nothing.
		return sink.EventError(fmt.Errorf("POST %s answered %s: redirected to %s; configure the URL the endpoint redirects to",
			redactURL(s.cfg.URL), resp.Status, RedirectHost(resp)))
	}
	err = sink.WithStatus(code, fmt.Errorf("POST %s answered %s", redactURL(s.cfg.URL), resp.Status))
	if ra := retryAfter(resp.Header.Get("Retry-After"), s.now()); code == http.StatusTooManyRequests || ra > 0 {
		return sink.RetryAfter(max(ra, time.Second), err)
	}
	switch {
	case code == http.StatusGone:
		return sink.Gone(err)
	case code >= 400 && code < 500 && code != http.StatusRequestTimeout:
		return sink.EventError(err)
	}
	return err
}

// RedirectHost names where a 3xx answer points: the host of its Location
// (resolved against the request's URL), or "an unnamed location" without one.
func RedirectHost(resp *http.Response) string {
	loc, err := resp.Location()
	if err != nil || loc.Host == "" {
		return "an unnamed location"
	}
	return loc.Host
}

// HeaderID is an event's id as the webhook-id header carries it (and the
// signature covers it): a header value cannot hold control characters, so
// an id with any (a text id with a line break) is sent quoted in Go syntax,
// the same on every attempt; the body carries the id as it is.
func HeaderID(id string) string {
	if strings.IndexFunc(id, func(r rune) bool { return r < ' ' || r == 0x7f }) < 0 {
		return id
	}
	return strconv.Quote(id)
}

// retryAfter reads Retry-After as seconds or an HTTP date.
func retryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && n >= 0 {
		return min(time.Duration(n)*time.Second, time.Hour)
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return min(t.Sub(now), time.Hour)
	}
	return 0
}

func validHeaderName(k string) bool {
	if k == "" {
		return false
	}
	for _, r := range k {
		if r <= ' ' || r >= 0x7f || strings.ContainsRune("()<>@,;:\\\"/[]?={}", r) {
			return false
		}
	}
	return true
}

// withoutControl is strings.Map(dropControl, v), without a copy when v is
// printable ASCII.
func withoutControl(v string) string {
	for i := 0; i < len(v); i++ {
		if v[i] < ' ' || v[i] >= 0x7f {
			return strings.Map(dropControl, v)
		}
	}
	return v
}

func dropControl(r rune) rune {
	if r < ' ' || r == 0x7f {
		return -1
	}
	return r
}

// redactURL keeps the query string (which may carry a token) out of errors.
func redactURL(u string) string {
	if i := strings.IndexAny(u, "?#"); i >= 0 {
		return u[:i] + "?…"
	}
	return u
}

// Close closes idle connections.
func (s *Sink) Close() error {
	if s.conns != nil {
		s.conns.close()
	}
	s.cfg.Client.CloseIdleConnections()
	return nil
}
