package httpapi

import (
	"context"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
)

// This file holds the checks every request passes before a handler sees it:
// the Host check against DNS rebinding, bad bytes in parameters, the tenant
// header, and the cap on concurrent API and page requests.

// openPaths are answered whatever the Host: probes and scrapers address
// the relay by whatever name their platform gives it, and these paths hold
// no saga data.
var openPaths = map[string]bool{"/metrics": true, "/healthz": true, "/readyz": true}

// hostAllowed reports whether a request without a token may be answered.
// Without a token anyone who can make a browser send a request can read;
// a page on attacker.example that re-points its DNS name at 127.0.0.1
// (DNS rebinding) would read saga state through the operator's browser. The
// browser still sends "Host: attacker.example", so only names the operator
// chose are answered: IP literals, localhost, and --http-allowed-hosts.
func (s *Server) hostAllowed(r *http.Request) bool {
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(strings.Trim(host, "[]")), ".")
	if host == "localhost" || net.ParseIP(host) != nil {
		return true
	}
	return s.allowedHosts[host]
}

func normalizeHosts(hosts []string) map[string]bool {
	m := map[string]bool{}
	for _, h := range hosts {
		h = strings.TrimSuffix(strings.ToLower(strings.TrimSpace(h)), ".")
		if h != "" {
			m[h] = true
		}
	}
	return m
}

// badParam returns a message when a path or query parameter holds invalid
// UTF-8 or a NUL byte: PostgreSQL refuses both with an error that used to
// surface as a 500 (and its raw text on the page).
func badParam(r *http.Request) string {
	if !cleanText(r.URL.Path) {
		return "the path holds invalid UTF-8 or a NUL byte"
	}
	for k, vs := range r.URL.Query() {
		if !cleanText(k) {
			return "a parameter name holds invalid UTF-8 or a NUL byte"
		}
		for _, v := range vs {
			if !cleanText(v) {
				return "parameter " + quoteClean(k) + " holds invalid UTF-8 or a NUL byte"
			}
		}
	}
	return ""
}

func cleanText(s string) bool { return utf8.ValidString(s) && !strings.ContainsRune(s, 0) }

// quoteClean quotes a name that is already known to be clean.
func quoteClean(s string) string { return `"` + s + `"` }

// hasControl reports a C0 or C1 control character or DEL: text that a
// terminal would obey rather than print.
func hasControl(s string) bool {
	return strings.ContainsFunc(s, isControl)
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f || (r >= 0x80 && r <= 0x9f) }

// tenantHeader reads X-Tenant-ID. An empty or repeated header is an error:
// it used to mean "all tenants" or "the first one", silently.
func tenantHeader(r *http.Request) (id uuid.UUID, set bool, msg string) {
	vs := r.Header.Values("X-Tenant-ID")
	switch {
	case len(vs) == 0:
		return uuid.Nil, false, ""
	case len(vs) > 1:
		return uuid.Nil, false, "X-Tenant-ID is given more than once; send it once"
	}
	v := strings.TrimSpace(vs[0])
	if v == "" {
		return uuid.Nil, false, "X-Tenant-ID is empty; send a tenant UUID, or leave the header out for every tenant"
	}
	id, err := uuid.Parse(v)
	if err != nil || len(v) != 36 {
		return uuid.Nil, false, "X-Tenant-ID is not a UUID"
	}
	return id, true, ""
}

// requestSlots bounds the /v1 and page requests served at once: each holds
// a connection of the monitor's pool, and a flood of reads must queue here
// rather than in the database.
type requestSlots chan struct{}

// acquire waits for a slot until wait passes or the request ends.
func (c requestSlots) acquire(ctx context.Context, wait time.Duration) bool {
	select {
	case c <- struct{}{}:
		return true
	default:
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case c <- struct{}{}:
		return true
	case <-t.C:
		return false
	case <-ctx.Done():
		return false
	}
}

func (c requestSlots) release() { <-c }

// limited serves h within the request slots; a request that cannot get one
// within a few seconds gets 503 with Retry-After.
func (s *Server) limited(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !s.slots.acquire(r.Context(), s.cfg.QueueWait) {
			w.Header().Set("Retry-After", "1")
			writeError(w, http.StatusServiceUnavailable, "the monitor is serving too many requests at once; try again in a second")
			return
		}
		defer s.slots.release()
		h(w, r)
	}
}

// guard runs the checks that apply to every route.
func (s *Server) guard(w http.ResponseWriter, r *http.Request) bool {
	if !s.authRequired() && !openPaths[r.URL.Path] && !s.hostAllowed(r) {
		writeError(w, http.StatusForbidden, "this relay has no API token, so it answers only requests addressed to an IP address or localhost; "+
			"to reach it by the name in this request's Host header, start it with --http-allowed-hosts NAME (or set --api-token)")
		return false
	}
	if msg := badParam(r); msg != "" {
		writeError(w, http.StatusBadRequest, msg)
		return false
	}
	return true
}

// readinessCache holds the last readiness check; one check runs at a time
// and everyone waiting shares its result.
type readinessCache struct {
	mu      sync.Mutex
	last    readyResult
	at      time.Time
	running chan struct{}
}

type readyResult struct {
	status int
	body   map[string]any
	// databaseDown: the check could not query the database (or found no
	// primary); the page then shows its outage form.
	databaseDown bool
}

func (c *readinessCache) get(ctx context.Context, maxAge time.Duration, check func() readyResult) (readyResult, bool) {
	c.mu.Lock()
	if !c.at.IsZero() && time.Since(c.at) <= maxAge {
		r := c.last
		c.mu.Unlock()
		return r, true
	}
	if wait := c.running; wait != nil {
		c.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return readyResult{}, false
		}
		c.mu.Lock()
		r := c.last
		c.mu.Unlock()
		return r, true
	}
	done := make(chan struct{})
	c.running = done
	c.mu.Unlock()
	r := check()
	c.mu.Lock()
	c.last, c.at, c.running = r, time.Now(), nil
	c.mu.Unlock()
	close(done)
	return r, true
}

// scrapePacer admits scrapes at a steady rate. Scrapes are served from
// memory, so what they cost is the relay's CPU: 100 clients scraping in a
// loop, each refused at once with 503 and asking again, kept both cores of
// a small machine busy and made the sagas ten times slower. A scrape waits
// for its turn instead; one whose turn is further away than maxWait is
// refused, after waiting maxWait too, so that a client in a loop is
// paced either way.
type scrapePacer struct {
	mu      sync.Mutex
	every   time.Duration
	maxWait time.Duration
	next    time.Time
}

func newScrapePacer(perSecond int, maxWait time.Duration) *scrapePacer {
	return &scrapePacer{every: time.Second / time.Duration(max(perSecond, 1)), maxWait: maxWait}
}

func (p *scrapePacer) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		now := time.Now()
		turn := p.next
		if turn.Before(now) {
			turn = now
		}
		admitted := turn.Sub(now) <= p.maxWait
		if admitted {
			p.next = turn.Add(p.every)
		} else {
			turn = now.Add(p.maxWait)
		}
		p.mu.Unlock()
		if d := time.Until(turn); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-r.Context().Done():
				t.Stop()
				return
			}
		}
		if !admitted {
			w.Header().Set("Retry-After", "5")
			http.Error(w, "too many scrapes at once; the relay's metrics change every few seconds, scrape less often", http.StatusServiceUnavailable)
			return
		}
		h.ServeHTTP(w, r)
	})
}
