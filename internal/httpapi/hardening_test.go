package httpapi_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/compensa/compensa/internal/httpapi"
	"github.com/compensa/compensa/saga"
)

// Each test here reproduces a finding of a security probe against the
// monitor: it fails on the code before the fix.

// syncBuffer collects a logger's output from concurrent handlers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func withLog(buf *syncBuffer) func(*httpapi.Config) {
	return func(c *httpapi.Config) {
		c.Logger = slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
}

// Item 1: a scrape is served from memory and a burst of probes costs one
// check: before, every scrape ran two counting queries and every probe a
// ping and a slot query, on the pool the step workers use.
func TestScrapesAndProbesDoNotQuery(t *testing.T) {
	t.Parallel()
	b := setup(t, options{configure: func(c *httpapi.Config) { c.ReadinessMaxAge, c.ScrapesPerSecond = time.Second, 10000 }})
	b.insert(t, tenantA, saga.StatusFailed, 1, 0)
	b.do(t, "GET", "/metrics", "") // the first scrape counts once
	before := b.db.Pool.Stat().AcquireCount()
	for range 50 {
		if r := b.do(t, "GET", "/metrics", ""); r.status != 200 || !strings.Contains(string(r.body), `compensa_sagas_stuck{reason="failed",saga="order"} 1`) {
			t.Fatalf("/metrics: %d, stuck gauge missing", r.status)
		}
	}
	if n := b.db.Pool.Stat().AcquireCount() - before; n > 1 {
		t.Errorf("50 scrapes acquired %d database connections, want at most 1 (a background refresh)", n)
	}
	before = b.db.Pool.Stat().AcquireCount()
	for range 50 {
		if r := b.do(t, "GET", "/readyz", ""); r.status != 200 {
			t.Fatalf("/readyz: %d %s", r.status, r.body)
		}
	}
	// 50 probes within a second or two: one or two checks, not 50.
	if n := b.db.Pool.Stat().AcquireCount() - before; n > 3 {
		t.Errorf("50 probes acquired %d database connections, want at most 3", n)
	}

	// Concurrent scrapes beyond the limit are refused rather than queued.
	rec := make(chan int, 40)
	var wg sync.WaitGroup
	for range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := http.Get(b.ts.URL + "/metrics")
			if err == nil {
				io.Copy(io.Discard, res.Body)
				res.Body.Close()
				rec <- res.StatusCode
			}
		}()
	}
	wg.Wait()
	close(rec)
	for code := range rec {
		if code != 200 && code != 503 {
			t.Errorf("concurrent scrape: %d", code)
		}
	}
}

// Item 1: the /v1 concurrency limit: with one slot held, a second request
// waits QueueWait and gets 503 with Retry-After.
func TestAPIConcurrencyLimit(t *testing.T) {
	t.Parallel()
	b := setup(t, options{configure: func(c *httpapi.Config) { c.MaxConcurrent, c.QueueWait = 1, 200*time.Millisecond }})
	ctx := context.Background()
	tx, err := b.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	// Hold the only slot: a list blocked on a lock on saga_instances.
	if _, err := tx.Exec(ctx, `LOCK TABLE saga_instances IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	done := make(chan int)
	go func() {
		res, err := http.Get(b.ts.URL + "/v1/sagas")
		if err != nil {
			done <- 0
			return
		}
		res.Body.Close()
		done <- res.StatusCode
	}()
	time.Sleep(300 * time.Millisecond)
	r := b.do(t, "GET", "/v1/sagas", "")
	if r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") == "" {
		t.Errorf("second request with the slot held: %d (Retry-After %q), want 503", r.status, r.header.Get("Retry-After"))
	}
	tx.Rollback(ctx)
	if code := <-done; code != 200 {
		t.Errorf("the first request: %d", code)
	}
}

// rawServer serves the monitor through NewHTTPServer and Listen with short
// bounds, as the assembly does with its defaults.
func rawServer(t *testing.T, b *testBundle, cfg httpapi.ServerConfig) string {
	t.Helper()
	ln, err := httpapi.Listen("127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httpapi.NewHTTPServer(b.srv, cfg)
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// closedWithin reports whether the server closes c within d (it may send a
// response first).
func closedWithin(c net.Conn, d time.Duration) (bool, string) {
	c.SetReadDeadline(time.Now().Add(d))
	got, err := io.ReadAll(c)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return false, string(got)
	}
	return true, string(got)
}

// Item 2: connections that never end. Each case with a raw socket.
func TestConnectionBounds(t *testing.T) {
	t.Parallel()
	b := setup(t, options{token: token})
	cfg := httpapi.ServerConfig{ReadHeaderTimeout: 300 * time.Millisecond, ReadTimeout: 600 * time.Millisecond,
		WriteTimeout: time.Second, IdleTimeout: 500 * time.Millisecond, MaxConns: 4}
	addr := rawServer(t, b, cfg)
	dial := func() net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}

	t.Run("slow body on POST /login", func(t *testing.T) {
		c := dial()
		start := time.Now()
		io.WriteString(c, "POST /login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 1000\r\n\r\n")
		stop := make(chan struct{})
		defer close(stop)
		go func() { // one byte every 100 ms, forever
			for {
				select {
				case <-stop:
					return
				case <-time.After(100 * time.Millisecond):
					if _, err := c.Write([]byte("t")); err != nil {
						return
					}
				}
			}
		}()
		if closed, _ := closedWithin(c, 3*time.Second); !closed {
			t.Errorf("a body trickled one byte per 100 ms kept the connection for %s, want it closed after ReadTimeout (600 ms)", time.Since(start))
		}
	})
	t.Run("idle keep-alive", func(t *testing.T) {
		c := dial()
		io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
		br := bufio.NewReader(c)
		res, err := http.ReadResponse(br, nil)
		if err != nil || res.StatusCode != 200 {
			t.Fatalf("healthz: %v %v", res, err)
		}
		io.Copy(io.Discard, res.Body)
		c.SetReadDeadline(time.Now().Add(3 * time.Second))
		if _, err := br.ReadByte(); err == nil || isTimeout(err) {
			t.Errorf("an idle keep-alive connection stayed open 3 s (err %v), want it closed after IdleTimeout (500 ms)", err)
		}
	})
	t.Run("three bytes of a header", func(t *testing.T) {
		c := dial()
		io.WriteString(c, "GET")
		if closed, _ := closedWithin(c, 3*time.Second); !closed {
			t.Error("a connection that sent 3 bytes stayed open 3 s, want it closed after ReadHeaderTimeout (300 ms)")
		}
	})
	t.Run("many idle connections", func(t *testing.T) {
		// A server of its own, whose idle connections outlive the checks.
		capped := cfg
		capped.ReadHeaderTimeout = 1500 * time.Millisecond
		addr := rawServer(t, b, capped)
		dial := func() net.Conn {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			return c
		}
		// Four idle connections fill the cap; the fifth is told so at once.
		var idle []net.Conn
		for range 4 {
			idle = append(idle, dial())
		}
		time.Sleep(300 * time.Millisecond) // all four accepted
		extra := dial()
		closed, got := closedWithin(extra, time.Second)
		if !closed || !strings.Contains(got, "503") {
			t.Errorf("a connection over the cap of 4: closed %v, got %q; want a 503 and close", closed, got)
		}
		// The idle ones are closed by ReadHeaderTimeout, which frees the
		// cap for real clients.
		for _, c := range idle {
			if closed, _ := closedWithin(c, 4*time.Second); !closed {
				t.Error("an idle connection that never sent a byte stayed open 4 s")
			}
		}
		time.Sleep(100 * time.Millisecond)
		res, err := http.Get("http://" + addr + "/healthz")
		if err != nil || res.StatusCode != 200 {
			t.Fatalf("after the idle connections were closed: %v %v", res, err)
		}
		res.Body.Close()
	})
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// Item 3: DNS rebinding. Without a token, a request whose Host is a name
// nobody allowed gets 403 and the flag to set.
func TestRebindingHostRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, options{configure: func(c *httpapi.Config) { c.AllowedHosts = []string{"Relay.Internal."} }})
	id := b.insert(t, tenantA, saga.StatusFailed, 1, 0)
	get := func(host, path string, headers ...string) response {
		req, _ := http.NewRequest("GET", b.ts.URL+path, nil)
		req.Host = host
		for i := 0; i+1 < len(headers); i += 2 {
			req.Header.Set(headers[i], headers[i+1])
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		return response{status: res.StatusCode, header: res.Header, body: body}
	}
	for _, path := range []string{"/v1/sagas/" + id.String(), "/v1/sagas", "/", "/sagas/" + id.String()} {
		r := get("attacker.example", path)
		if r.status != http.StatusForbidden || !strings.Contains(string(r.body), "--http-allowed-hosts") {
			t.Errorf("GET %s with Host attacker.example and no token: %d %s, want 403 naming --http-allowed-hosts", path, r.status, r.body)
		}
		if strings.Contains(string(r.body), id.String()) {
			t.Errorf("GET %s with a rebinding Host leaked the instance", path)
		}
	}
	for _, host := range []string{"127.0.0.1:8080", "localhost:8080", "LOCALHOST", "[::1]:8080", "10.1.2.3", "relay.internal:8080", "relay.internal."} {
		if r := get(host, "/v1/sagas/"+id.String()); r.status != http.StatusOK {
			t.Errorf("Host %s: %d, want 200", host, r.status)
		}
	}
	for _, path := range []string{"/metrics", "/healthz", "/readyz"} {
		if r := get("prometheus-target.svc", path); r.status != http.StatusOK {
			t.Errorf("%s by name: %d, want 200 (probes and scrapers use names)", path, r.status)
		}
	}
	// With a token the Host does not matter: the token is the check.
	tb := setup(t, options{token: token})
	tid := tb.insert(t, tenantA, saga.StatusFailed, 1, 0)
	req, _ := http.NewRequest("GET", tb.ts.URL+"/v1/sagas/"+tid.String(), nil)
	req.Host = "relay.example.com"
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Errorf("with a token and a named Host: %d", res.StatusCode)
	}
}

func login(t *testing.T, b *testBundle) string {
	t.Helper()
	r := b.do(t, "POST", "/login", url.Values{"token": {token}, "next": {"/"}}.Encode(), "Content-Type", "application/x-www-form-urlencoded")
	if r.status != http.StatusSeeOther {
		t.Fatalf("login: %d %s", r.status, r.body)
	}
	return strings.SplitN(r.header.Get("Set-Cookie"), ";", 2)[0]
}

// Item 4: sessions that can be revoked. The cookie is a random id: a new
// one at every login, worthless after logout or its TTL.
func TestSessionsRevocable(t *testing.T) {
	t.Parallel()
	b := setup(t, options{token: token, configure: func(c *httpapi.Config) { c.SessionTTL = 2 * time.Second }})
	first, second := login(t, b), login(t, b)
	if first == second {
		t.Fatalf("two logins gave the same cookie %q", first)
	}
	if strings.Contains(first, token) {
		t.Fatal("the cookie holds the token")
	}
	for _, c := range []string{first, second} {
		if r := b.do(t, "GET", "/v1/sagas", "", "Cookie", c); r.status != 200 {
			t.Fatalf("API read with a fresh session: %d", r.status)
		}
	}
	r := b.do(t, "POST", "/logout", "", "Cookie", first)
	if r.status != http.StatusSeeOther || !strings.Contains(r.header.Get("Set-Cookie"), "Max-Age=0") {
		t.Errorf("logout: %d %q", r.status, r.header.Get("Set-Cookie"))
	}
	// The old cookie, replayed after logout: refused everywhere.
	if r := b.do(t, "GET", "/v1/sagas", "", "Cookie", first); r.status != http.StatusUnauthorized {
		t.Errorf("API read with the cookie of a session logged out: %d, want 401", r.status)
	}
	if r := b.do(t, "GET", "/", "", "Cookie", first); r.status != http.StatusSeeOther {
		t.Errorf("page with the cookie of a session logged out: %d, want a redirect to /login", r.status)
	}
	if r := b.do(t, "GET", "/v1/sagas", "", "Cookie", second); r.status != 200 {
		t.Errorf("another session survives a logout: %d", r.status)
	}
	time.Sleep(2100 * time.Millisecond)
	if r := b.do(t, "GET", "/v1/sagas", "", "Cookie", second); r.status != http.StatusUnauthorized {
		t.Errorf("a session past its TTL: %d, want 401", r.status)
	}
}

// Item 4: with TLS at a proxy (--http-secure-cookies) or at the relay, the
// cookie is __Host-compensa_session, Secure, host-only, for the whole site.
func TestSecureSessionCookie(t *testing.T) {
	t.Parallel()
	b := setup(t, options{token: token, configure: func(c *httpapi.Config) { c.SecureCookies = true }})
	r := b.do(t, "POST", "/login", url.Values{"token": {token}}.Encode(), "Content-Type", "application/x-www-form-urlencoded")
	c := r.header.Get("Set-Cookie")
	if !strings.HasPrefix(c, "__Host-compensa_session=") || !strings.Contains(c, "Secure") || !strings.Contains(c, "Path=/") ||
		strings.Contains(c, "Domain") || !strings.Contains(c, "HttpOnly") || !strings.Contains(c, "SameSite=Strict") || !strings.Contains(c, "Max-Age=43200") {
		t.Fatalf("cookie %q", c)
	}
	cookie := strings.SplitN(c, ";", 2)[0]
	if r := b.do(t, "GET", "/v1/sagas", "", "Cookie", cookie); r.status != 200 {
		t.Errorf("with the secure cookie: %d", r.status)
	}
	// Over TLS at the relay, Secure without the flag.
	tb := setup(t, options{token: token})
	ts := httptest.NewTLSServer(tb.srv)
	defer ts.Close()
	client := ts.Client()
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	res, err := client.PostForm(ts.URL+"/login", url.Values{"token": {token}})
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if c := res.Header.Get("Set-Cookie"); !strings.HasPrefix(c, "__Host-compensa_session=") || !strings.Contains(c, "Secure") {
		t.Errorf("cookie over TLS: %q", c)
	}
}

// Item 5: tokens under 128 bits are refused with a hint to make one.
func TestTokenStrength(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		token string
		ok    bool
	}{
		{"a", false},
		{"hunter2", false},
		{strings.Repeat("a", 40), false},
		{"0123456789abcdef0123456789abcde", false},  // 31 hex: 124 bits
		{"9f86d081884c7d659a2feaa0c55ad015", true},  // 32 random hex
		{"0123456789abcdef0123456789abcdef", false}, // 32 hex: a run and its repetition
		{strings.Repeat("0123456789abcdef", 3), false},
		{strings.Repeat("k3Zq9xW", 8), false}, // a random-looking part, repeated
		{"abcdefghijklmnopqrstuvwxyz0123456789", false},
		{"tok-for-test-0123456789abcdef", true},
		{"Zm9vYmFyYmF6cXV4cXV1eA", true},             // 22 base64
		{"Zm9vYmFyYmF6cXV4cXV1e", false},             // 21 base64
		{"s3cret-token-for-tests", true},             // 22 base64url
		{"correct horse battery staple", false},      // a phrase: words carry few bits
		{" 0123456789abcdef0123456789abcdef", false}, // surrounding space
	} {
		err := httpapi.CheckTokenStrength("--api-token", c.token)
		if (err == nil) != c.ok {
			t.Errorf("CheckTokenStrength(%q) = %v, want ok %v", c.token, err, c.ok)
		}
		if err != nil && (!strings.Contains(err.Error(), "openssl rand -hex 32") || strings.Contains(err.Error(), c.token) && len(c.token) > 1) {
			t.Errorf("message %q: want the openssl hint and never the token", err)
		}
	}
}

// Random tokens of the least accepted length pass, whatever repeats or runs
// they hold by chance (a fixed seed: the same tokens every run).
func TestRandomTokensOfTheLeastLengthPass(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewChaCha8([32]byte{'c', 'o', 'm', 'p', 'e', 'n', 's', 'a'}))
	secret := make([]byte, 16)
	for i := range 100_000 {
		for j := range secret {
			secret[j] = byte(r.Uint32())
		}
		for _, tok := range []string{hex.EncodeToString(secret), base64.RawURLEncoding.EncodeToString(secret)} {
			if err := httpapi.CheckTokenStrength("token", tok); err != nil {
				t.Fatalf("random token %d (%s) refused: %v", i, tok, err)
			}
		}
	}
}

// Item 5: failed authentications are throttled per address, with
// Retry-After, and logged with the address and route, never the token.
func TestAuthFailuresThrottledAndLogged(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	b := setup(t, options{token: token, configure: func(c *httpapi.Config) {
		withLog(&logs)(c)
		c.AuthFailures, c.AuthWindow = 3, time.Minute
	}})
	guesses := []string{"guess-number-one-0001", "guess-number-two-0002", "guess-number-three-03"}
	for _, g := range guesses {
		if r := b.do(t, "GET", "/v1/sagas", "", "Authorization", "Bearer "+g); r.status != http.StatusUnauthorized {
			t.Fatalf("wrong token: %d", r.status)
		}
	}
	// Blocked now: even the right token gets 429, so that guessing on
	// learns nothing.
	for _, h := range [][]string{{"Authorization", "Bearer another-guess-0004"}, bearer} {
		r := b.do(t, "GET", "/v1/sagas", "", h...)
		if r.status != http.StatusTooManyRequests || r.header.Get("Retry-After") == "" {
			t.Errorf("after 3 failures: %d Retry-After %q, want 429 with Retry-After", r.status, r.header.Get("Retry-After"))
		}
	}
	form := url.Values{"token": {"login-guess-000000005"}}.Encode()
	if r := b.do(t, "POST", "/login", form, "Content-Type", "application/x-www-form-urlencoded"); r.status != http.StatusTooManyRequests {
		t.Errorf("login form from a blocked address: %d, want 429", r.status)
	}
	out := logs.String()
	if strings.Count(out, "failed authentication") != 3 || !strings.Contains(out, "remote=127.0.0.1") || !strings.Contains(out, "route=/v1/sagas") {
		t.Errorf("want 3 failures logged with address and route, got:\n%s", out)
	}
	for _, g := range append(guesses, token) {
		if strings.Contains(out, g) {
			t.Errorf("the log shows a token sent: %q", g)
		}
	}
	// Another address is not blocked.
	req := httptest.NewRequest("GET", "/v1/sagas", nil)
	req.RemoteAddr = "192.0.2.7:4000"
	req.Header.Set("Authorization", "Bearer "+token)
	rec := httptest.NewRecorder()
	b.srv.ServeHTTP(rec, req)
	if rec.Code != 200 {
		t.Errorf("another address: %d", rec.Code)
	}
}

// Item 7: a reason with terminal escapes is refused by the API.
func TestReasonControlCharsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, options{token: token, journal: true})
	id := b.insert(t, tenantA, saga.StatusFailed, 1, 0)
	for _, reason := range []string{`\u001b[31mred`, `\u001b]8;;https://evil.example\u0007click\u001b]8;;\u0007`, `a\u0000b`, `\u009b31m`, `two\nlines`} {
		r := b.do(t, "POST", "/v1/sagas/"+id.String()+"/retry", `{"reason":"`+reason+`"}`, bearer...)
		if r.status != http.StatusBadRequest || !strings.Contains(r.errorMessage(t), "control characters") {
			t.Errorf("reason %s: %d %s, want 400", reason, r.status, r.body)
		}
	}
	if n := b.journal.count(); n != 0 {
		t.Errorf("a reason with control characters reached the journal")
	}
	if r := b.do(t, "POST", "/v1/sagas/"+id.String()+"/retry", `{"reason":"warehouse back — ünïcode is fine"}`, bearer...); r.status != 200 {
		t.Errorf("plain reason: %d %s", r.status, r.body)
	}
}

// Item 8: invalid UTF-8 and NUL in parameters are 400 with a message, not
// 500 with an ERROR logged; the page never shows PostgreSQL's words.
func TestBadBytesInParameters(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	b := setup(t, options{token: token, configure: withLog(&logs)})
	cookie := login(t, b)
	for _, q := range []string{"saga=%00", "saga=%ff", "status=%ff", "cursor=%00", "saga=a%00b", "%ff=1"} {
		r := b.do(t, "GET", "/v1/sagas?"+q, "", bearer...)
		if r.status != http.StatusBadRequest || !strings.Contains(r.errorMessage(t), "UTF-8") {
			t.Errorf("/v1/sagas?%s: %d %s, want 400", q, r.status, r.body)
		}
		pr := b.do(t, "GET", "/?"+q, "", "Cookie", cookie)
		if pr.status != http.StatusBadRequest || strings.Contains(string(pr.body), "invalid byte sequence") || strings.Contains(string(pr.body), "SQLSTATE") {
			t.Errorf("page /?%s: %d, want 400 without PostgreSQL's text", q, pr.status)
		}
	}
	if r := b.do(t, "GET", "/v1/sagas/%ff", "", bearer...); r.status != http.StatusBadRequest {
		t.Errorf("path with %%ff: %d", r.status)
	}
	if strings.Contains(logs.String(), "level=ERROR") {
		t.Errorf("bad parameters logged an ERROR:\n%s", logs.String())
	}
}

// Item 8: an empty or repeated X-Tenant-ID is an error, not "all tenants"
// or "the first".
func TestTenantHeaderStrict(t *testing.T) {
	t.Parallel()
	b := setup(t, options{token: token})
	b.insert(t, tenantA, saga.StatusFailed, 1, 0)
	do := func(values ...string) int {
		req, _ := http.NewRequest("GET", b.ts.URL+"/v1/sagas", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		for _, v := range values {
			req.Header.Add("X-Tenant-ID", v)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	for _, c := range [][]string{{""}, {"  "}, {tenantA.String(), tenantB.String()}, {tenantA.String(), tenantA.String()}, {tenantA.String() + "," + tenantB.String()}} {
		if code := do(c...); code != http.StatusBadRequest {
			t.Errorf("X-Tenant-ID %q: %d, want 400", c, code)
		}
	}
	if code := do(tenantA.String()); code != 200 {
		t.Errorf("one tenant: %d", code)
	}
}

// With MetricsElsewhere, the monitor does not serve /metrics (404, for a
// token holder too), and MetricsHandler, for a listener of its own, does
// and serves nothing else.
func TestMetricsElsewhereLeavesTheMonitor(t *testing.T) {
	t.Parallel()
	b := setup(t, options{token: token, configure: func(c *httpapi.Config) { c.MetricsElsewhere = true }})
	for _, hdr := range [][]string{nil, bearer} {
		if r := b.do(t, "GET", "/metrics", "", hdr...); r.status != http.StatusNotFound || strings.Contains(string(r.body), "compensa_") {
			t.Errorf("/metrics on the monitor: %d %.200s, want 404", r.status, r.body)
		}
	}
	ms := httptest.NewServer(b.srv.MetricsHandler())
	t.Cleanup(ms.Close)
	for path, want := range map[string]int{"/metrics": http.StatusOK, "/v1/sagas": http.StatusNotFound, "/healthz": http.StatusNotFound, "/": http.StatusNotFound} {
		res, err := http.Get(ms.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != want {
			t.Errorf("%s on the metrics listener: %d, want %d", path, res.StatusCode, want)
		}
	}
}
