package httpapi

import (
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// authLimiter counts failed authentications per remote address: after
// maxFailures in one window, every request from that address gets 429 with
// Retry-After until the window ends, whatever it sends — a right guess
// while blocked must not be told apart from a wrong one. The address is
// the TCP peer's: behind a proxy that is the proxy, so the limit then
// applies to all clients together (see docs/security.md).
type authLimiter struct {
	mu          sync.Mutex
	window      time.Duration
	maxFailures int
	by          map[string]*failures
	now         func() time.Time
}

type failures struct {
	count int
	since time.Time
}

// maxTracked bounds the memory the limiter uses under a flood from many
// addresses; past it, windows that ended are swept.
const maxTracked = 10000

func newAuthLimiter(maxFailures int, window time.Duration) *authLimiter {
	return &authLimiter{window: window, maxFailures: maxFailures, by: map[string]*failures{}, now: time.Now}
}

// retryAfter returns how long addr must wait, 0 when it may try.
func (l *authLimiter) retryAfter(addr string) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	f := l.by[addr]
	if f == nil {
		return 0
	}
	left := f.since.Add(l.window).Sub(l.now())
	if left <= 0 {
		delete(l.by, addr)
		return 0
	}
	if f.count < l.maxFailures {
		return 0
	}
	return left
}

// fail records a failed attempt from addr; it returns the attempt's number
// in the current window.
func (l *authLimiter) fail(addr string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	f := l.by[addr]
	if f == nil || now.Sub(f.since) >= l.window {
		if len(l.by) >= maxTracked {
			for k, v := range l.by {
				if now.Sub(v.since) >= l.window {
					delete(l.by, k)
				}
			}
		}
		f = &failures{since: now}
		l.by[addr] = f
	}
	f.count++
	return f.count
}

func remoteHost(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// authThrottled answers 429 when the caller's address has failed too
// often; it has answered when it returns true. Call it before checking a
// credential.
func (s *Server) authThrottled(w http.ResponseWriter, r *http.Request) bool {
	wait := s.authFailures.retryAfter(remoteHost(r))
	if wait <= 0 {
		return false
	}
	secs := int(wait.Round(time.Second) / time.Second)
	w.Header().Set("Retry-After", strconv.Itoa(max(secs, 1)))
	writeError(w, http.StatusTooManyRequests, "too many failed authentications from this address; try again in "+strconv.Itoa(max(secs, 1))+" s")
	return true
}

// authFailed records and logs a failed authentication: the address and the
// route, never what was sent.
func (s *Server) authFailed(r *http.Request, how string) {
	addr := remoteHost(r)
	n := s.authFailures.fail(addr)
	s.log.Warn("monitor: failed authentication", "remote", addr, "method", r.Method, "route", r.URL.Path, "credential", how,
		"failures_in_window", n, "limit", s.authFailures.maxFailures)
}
