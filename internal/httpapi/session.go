package httpapi

import (
	"crypto/rand"
	"encoding/base64"
	"net/http"
	"sync"
	"time"

	"github.com/compensa/compensa/internal/apitoken"
)

// The page's sessions live on the server: the cookie carries a random id
// (256 bits) that means nothing without this process's table, expires
// after Config.SessionTTL and is deleted by logout. The earlier cookie, an
// HMAC of the token, was the same at every login, never expired, outlived
// logout, and let whoever stole it guess the token offline.
//
// Sessions are kept in memory: a restart or another replica asks for the
// token again, which for a monitor is a small price for no new table.

const (
	// secureSessionCookie is the cookie's name when it can be Secure: the
	// __Host- prefix makes the browser refuse it unless it is Secure,
	// host-only and for the whole site, so no subdomain can plant one.
	secureSessionCookie = "__Host-compensa_session"
	// plainSessionCookie is its name over plain HTTP (a relay on localhost
	// without TLS), where a browser will not keep a __Host- cookie.
	plainSessionCookie = "compensa_session"
)

type sessionStore struct {
	mu   sync.Mutex
	ttl  time.Duration
	byID map[string]session // id → expiry and the token signed in with
	now  func() time.Time
}

// session is one page login: the token it was started with (its name is
// the caller the journal records, its scope and role apply) and its expiry.
type session struct {
	exp   time.Time
	token apitoken.Token
}

func newSessionStore(ttl time.Duration) *sessionStore {
	return &sessionStore{ttl: ttl, byID: map[string]session{}, now: time.Now}
}

// create returns a new session id for a login with t.
func (s *sessionStore) create(t apitoken.Token) string {
	var b [32]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	id := base64.RawURLEncoding.EncodeToString(b[:])
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	for k, v := range s.byID {
		if !now.Before(v.exp) {
			delete(s.byID, k)
		}
	}
	s.byID[id] = session{exp: now.Add(s.ttl), token: t}
	return id
}

// valid reports whether id names a live session. The map lookup is not
// constant time, but the id is 256 random bits: timing tells nothing that
// helps guess one.
func (s *sessionStore) valid(id string) bool {
	_, ok := s.lookup(id)
	return ok
}

// lookup returns the token of a live session.
func (s *sessionStore) lookup(id string) (apitoken.Token, bool) {
	if id == "" {
		return apitoken.Token{}, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.byID[id]
	if ok && !s.now().Before(v.exp) {
		delete(s.byID, id)
		return apitoken.Token{}, false
	}
	return v.token, ok
}

func (s *sessionStore) delete(id string) {
	s.mu.Lock()
	delete(s.byID, id)
	s.mu.Unlock()
}

// secureCookies reports whether the session cookie may be Secure for r:
// TLS ends here, or the operator said a proxy in front terminates it.
func (s *Server) secureCookies(r *http.Request) bool {
	return r.TLS != nil || s.cfg.SecureCookies
}

// sessionID returns the request's session cookie value, either name.
func sessionID(r *http.Request) string {
	for _, name := range []string{secureSessionCookie, plainSessionCookie} {
		if c, err := r.Cookie(name); err == nil && c.Value != "" {
			return c.Value
		}
	}
	return ""
}

func (s *Server) hasSession(r *http.Request) bool {
	return s.authRequired() && s.sessions.valid(sessionID(r))
}

// startSession sets a new session's cookie on w, for a login with t.
func (s *Server) startSession(w http.ResponseWriter, r *http.Request, t apitoken.Token) {
	name, secure := plainSessionCookie, false
	if s.secureCookies(r) {
		name, secure = secureSessionCookie, true
	}
	http.SetCookie(w, &http.Cookie{Name: name, Value: s.sessions.create(t), Path: "/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: secure, MaxAge: int(s.cfg.SessionTTL / time.Second)})
}

// endSession deletes the request's session on the server and clears both
// cookies in the browser.
func (s *Server) endSession(w http.ResponseWriter, r *http.Request) {
	s.sessions.delete(sessionID(r))
	http.SetCookie(w, &http.Cookie{Name: plainSessionCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode})
	if s.secureCookies(r) {
		http.SetCookie(w, &http.Cookie{Name: secureSessionCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, Secure: true, SameSite: http.SameSiteStrictMode})
	}
}
