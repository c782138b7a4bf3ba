package webhook_test

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/compensa/compensa/sink"
	"github.com/compensa/compensa/sink/sinktest"
	"github.com/compensa/compensa/sink/webhook"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var secret = "whsec_" + base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef"))

// endpoint is a real HTTP server that verifies every signature, fails on
// demand and records deliveries.
type endpoint struct {
	srv    *httptest.Server
	mu     sync.Mutex
	got    []sinktest.Received
	status atomic.Int32 // 0: 204
	retry  string
	bad    atomic.Int32 // requests whose signature did not verify
}

func newEndpoint(t *testing.T) *endpoint {
	e := &endpoint{}
	key, err := webhook.DecodeSecret(secret)
	if err != nil {
		t.Fatal(err)
	}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		id, ts := r.Header.Get("webhook-id"), r.Header.Get("webhook-timestamp")
		if !webhook.Verify(key, id, ts, body, r.Header.Get("webhook-signature")) {
			e.bad.Add(1)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		if n, _ := strconv.ParseInt(ts, 10, 64); time.Since(time.Unix(n, 0)).Abs() > 5*time.Minute {
			e.bad.Add(1)
		}
		if s := e.status.Load(); s != 0 {
			if e.retry != "" {
				w.Header().Set("Retry-After", e.retry)
			}
			w.WriteHeader(int(s))
			return
		}
		var env sink.Event
		if err := json.Unmarshal(body, &env); err != nil || env.ID != id {
			e.bad.Add(1)
		}
		h := map[string]string{}
		for k := range r.Header {
			h[k] = r.Header.Get(k)
		}
		// The metadata arrives under hyphenated names (Event-Type), never
		// with underscores (Event_type), which proxies drop.
		for _, k := range []string{"event_type", "aggregate_type", "aggregate_id", "tenant_id", "correlation_id", "causation_id", "poison"} {
			if r.Header.Get(k) != "" && k != "poison" {
				e.bad.Add(1)
			}
			h[k] = r.Header.Get(strings.ReplaceAll(k, "_", "-"))
		}
		for _, k := range []string{"trace", "attempt"} {
			h[k] = r.Header.Get(k)
		}
		e.mu.Lock()
		e.got = append(e.got, sinktest.Received{ID: id, Headers: h, Payload: env.Payload, Raw: env.RawPayload})
		e.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(func() {
		e.srv.Close()
		if n := e.bad.Load(); n > 0 {
			t.Errorf("%d requests with a bad signature, timestamp or envelope", n)
		}
	})
	return e
}

func (e *endpoint) read() []sinktest.Received {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]sinktest.Received(nil), e.got...)
}

func TestConformance(t *testing.T) {
	var cur *endpoint
	sinktest.Run(t, sinktest.Harness{
		New: func(t *testing.T) (sink.Sink, func() []sinktest.Received) {
			cur = newEndpoint(t)
			s, err := webhook.New(webhook.Config{URL: cur.srv.URL, Secret: secret, Timeout: 2 * time.Second, Concurrency: 4})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s, cur.read
		},
		Break: func(*testing.T) { cur.status.Store(503) },
		Heal:  func(*testing.T) { cur.status.Store(0) },
	})
}

func TestAnswersClassify(t *testing.T) {
	e := newEndpoint(t)
	s, err := webhook.New(webhook.Config{URL: e.srv.URL, Secret: secret, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, c := range []struct {
		status int
		retry  string
		want   string
	}{
		{410, "", "gone"}, {429, "7", "throttled"}, {503, "3", "throttled"}, {413, "", "event"}, {500, "", "down"},
	} {
		e.status.Store(int32(c.status))
		e.retry = c.retry
		errs := s.Deliver(t.Context(), sinktest.Events(2, 1))
		if errs[0] == nil || !errors.Is(errs[1], sink.ErrHeldBack) {
			t.Fatalf("%d: errors %v, want the first to fail and the second held back", c.status, errs)
		}
		if got := sink.Classify(errs[0]); got != c.want {
			t.Errorf("%d: classified %q, want %q (%v)", c.status, got, c.want, errs[0])
		}
	}
}

func TestBadSecret(t *testing.T) {
	for _, s := range []string{"nope", "whsec_!!", "whsec_" + base64.StdEncoding.EncodeToString([]byte("short"))} {
		_, err := webhook.New(webhook.Config{URL: "http://127.0.0.1:1", Secret: s})
		if err == nil {
			t.Fatalf("secret %q accepted", s)
		}
		if len(s) > 8 && contains(err.Error(), s[6:]) {
			t.Fatalf("error shows the secret: %v", err)
		}
	}
}

func contains(s, sub string) bool {
	return len(sub) > 0 && len(s) >= len(sub) && (func() bool {
		for i := 0; i+len(sub) <= len(s); i++ {
			if s[i:i+len(sub)] == sub {
				return true
			}
		}
		return false
	})()
}

// TestRowHeadersCannotForgeFraming: a row's headers object cannot set the
// signature headers or Content-Type.
func TestRowHeadersCannotForgeFraming(t *testing.T) {
	e := newEndpoint(t)
	s, err := webhook.New(webhook.Config{URL: e.srv.URL, Secret: secret, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	evs := sinktest.Events(1, 1)
	evs[0].Headers = []byte(`{"webhook-id":"forged","Content-Type":"text/plain","webhook-signature":"v1,AAAA","x-ok":"yes"}`)
	for _, err := range s.Deliver(t.Context(), evs) {
		if err != nil {
			t.Fatal(err)
		}
	}
	got := e.read()
	if len(got) != 1 || got[0].ID != evs[0].ID || got[0].Headers["Content-Type"] != "application/json" || got[0].Headers["X-Ok"] != "yes" {
		t.Fatalf("received %+v", got)
	}
}

// TestRedirectsAreNeverFollowed: an endpoint answering 3xx gets the event
// parked with "redirected to <host>"; nothing, and no signature, reaches
// the host the redirect names.
func TestRedirectsAreNeverFollowed(t *testing.T) {
	var second atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		second.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer other.Close()
	for _, code := range []int{301, 302, 303, 307, 308} {
		var first atomic.Int32
		redirecting := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			first.Add(1)
			http.Redirect(w, r, other.URL+"/elsewhere", code)
		}))
		s, err := webhook.New(webhook.Config{URL: redirecting.URL + "/hook", Secret: secret, Timeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		errs := s.Deliver(t.Context(), sinktest.Events(1, 1))
		s.Close()
		redirecting.Close()
		host := other.Listener.Addr().String()
		if errs[0] == nil || sink.Classify(errs[0]) != "event" || !contains(errs[0].Error(), "redirected to "+host) {
			t.Errorf("%d: %v (%s), want the event parked with \"redirected to %s\"", code, errs[0], sink.Classify(errs[0]), host)
		}
		if first.Load() != 1 {
			t.Errorf("%d: the configured endpoint got %d requests", code, first.Load())
		}
	}
	if n := second.Load(); n != 0 {
		t.Errorf("the host a redirect named got %d requests, want none", n)
	}
}

// An id a header value cannot hold (a text id with a line break) is sent
// quoted in webhook-id and signed so; the request is made, the sink stays up.
func TestIDWithControlCharactersIsDelivered(t *testing.T) {
	key, _ := webhook.DecodeSecret(secret)
	var got atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		id := r.Header.Get("webhook-id")
		if !webhook.Verify(key, id, r.Header.Get("webhook-timestamp"), body, r.Header.Get("webhook-signature")) {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		var env sink.Event
		json.Unmarshal(body, &env)
		got.Store([2]string{id, env.ID})
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	s, err := webhook.New(webhook.Config{URL: srv.URL, Secret: secret, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	evs := sinktest.Events(1, 1)
	evs[0].ID = "line\nbreak\x00"
	if err := s.Deliver(t.Context(), evs)[0]; err != nil {
		t.Fatalf("delivery failed (%s): %v", sink.Classify(err), err)
	}
	if ids, _ := got.Load().([2]string); ids[0] != `"line\nbreak\x00"` || ids[1] != evs[0].ID {
		t.Fatalf("webhook-id %q, body id %q", ids[0], ids[1])
	}
}

// The metadata headers are sent as Event-Type, Tenant-Id, ...: names a
// proxy passes. legacy_underscore_headers sends the former Event_type,
// Tenant_id, ... for one release.
func TestMetadataHeaderNames(t *testing.T) {
	for _, legacy := range []bool{false, true} {
		var mu sync.Mutex
		var got http.Header
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			got = r.Header.Clone()
			mu.Unlock()
			w.WriteHeader(http.StatusNoContent)
		}))
		for _, viaClient := range []bool{false, true} {
			cfg := webhook.Config{URL: srv.URL, Secret: secret, Timeout: 2 * time.Second, LegacyUnderscoreHeaders: legacy}
			if viaClient {
				cfg.Client = srv.Client()
			}
			s, err := webhook.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			ev := &sink.Event{ID: "1", EventType: "order.placed", AggregateType: "order", AggregateID: "o-1",
				TenantID: "t-1", CorrelationID: "c-1", CausationID: "k-1", Headers: []byte(`{"x_custom": "v"}`)}
			if errs := s.Deliver(t.Context(), []*sink.Event{ev}); errs[0] != nil {
				t.Fatal(errs[0])
			}
			s.Close()
			want := map[string]string{"Event-Type": "order.placed", "Aggregate-Type": "order", "Aggregate-Id": "o-1",
				"Tenant-Id": "t-1", "Correlation-Id": "c-1", "Causation-Id": "k-1", "X_custom": "v"}
			if legacy {
				want = map[string]string{"Event_type": "order.placed", "Aggregate_type": "order", "Aggregate_id": "o-1",
					"Tenant_id": "t-1", "Correlation_id": "c-1", "Causation_id": "k-1", "X_custom": "v"}
			}
			mu.Lock()
			for k, v := range want {
				if vs := got[k]; len(vs) != 1 || vs[0] != v {
					t.Errorf("legacy=%t client=%t: header %s = %q, want %q (got %v)", legacy, viaClient, k, vs, v, got)
				}
			}
			for k := range got {
				if strings.Contains(k, "_") && !legacy && k != "X_custom" {
					t.Errorf("legacy=%t client=%t: header %s has an underscore", legacy, viaClient, k)
				}
			}
			mu.Unlock()
		}
		srv.Close()
	}
}
