package httpapi

import (
	"context"
	"net/http"
	"strings"

	"github.com/compensa/compensa/internal/apitoken"
	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/admin"
)

// Who may do what (the token model is internal/apitoken's):
//
//   - Tokens configured (--api-token, --api-tokens): every /v1 request needs
//     "Authorization: Bearer <token>" or the page's session cookie; without
//     either, 401. The caller is the token: its Name is what the journal
//     records, its Role says whether it may retry and cancel (read → 403),
//     its Tenant scopes every read and write to that tenant, whatever the
//     request's headers or parameters say (X-Tenant-ID can only narrow).
//   - No token configured: reads are open, mutations answer 403, so that a
//     deployment that forgot the token cannot be pushed around.
//
// A mutation authenticated by the cookie must also carry the X-Compensa-Page
// header, which a cross-site form cannot send (CSRF).

// caller is the authenticated principal of a request.
type caller struct {
	apitoken.Token
	// anonymous: no token is configured at all.
	anonymous bool
}

type callerKey struct{}

func callerOf(r *http.Request) caller {
	c, _ := r.Context().Value(callerKey{}).(caller)
	return c
}

// setTokens joins APIToken and Tokens.
func (s *Server) setTokens() error {
	var single *apitoken.Set
	if s.cfg.APIToken != "" {
		single = apitoken.Single(s.cfg.APIToken)
	}
	all, err := apitoken.Join(single, s.cfg.Tokens)
	if err != nil {
		return saga.Errorf(saga.ErrInvalid, "httpapi: %v", err)
	}
	s.tokens = all
	return nil
}

// authRequired reports whether any token is configured.
func (s *Server) authRequired() bool { return s.tokens.Len() > 0 }

// api wraps a /v1 handler with the method check, authentication, the
// mutation rule and the tenant scope. method "" accepts any.
func (s *Server) api(h apiHandler, method string) http.Handler {
	mutation := method == http.MethodPost
	return s.limited(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		c, ok := s.authenticate(w, r, mutation)
		if !ok {
			return
		}
		if method != "" && r.Method != method {
			w.Header().Set("Allow", method)
			writeError(w, http.StatusMethodNotAllowed, "method "+r.Method+" not allowed here; use "+method)
			return
		}
		a, err := s.scoped(r, c)
		if err != nil {
			s.writeErr(w, r, err)
			return
		}
		h(w, r.WithContext(context.WithValue(r.Context(), callerKey{}, c)), a)
	})
}

// scoped returns the Admin the caller may use: the token's tenant first,
// then X-Tenant-ID, which can only narrow.
func (s *Server) scoped(r *http.Request, c caller) (*admin.Admin, error) {
	a := s.admin
	if c.Tenant.Valid {
		a = a.ForTenant(c.Tenant.UUID)
	}
	id, set, msg := tenantHeader(r)
	if msg != "" {
		return nil, saga.Errorf(saga.ErrInvalid, "%s", msg)
	}
	if set {
		if c.Tenant.Valid && id != c.Tenant.UUID {
			return nil, errForbidden("token " + c.Name + " is scoped to one tenant: X-Tenant-ID can only narrow to that tenant, not widen or switch")
		}
		a = a.ForTenant(id)
	}
	return a, nil
}

// authenticate applies the rules above; it has answered when ok is false.
func (s *Server) authenticate(w http.ResponseWriter, r *http.Request, mutation bool) (caller, bool) {
	if !s.authRequired() {
		if mutation {
			writeError(w, http.StatusForbidden, "operator actions (retry, cancel, pause, resume, upgrade) are disabled: this relay has no API token; start it with --api-token (RELAY_API_TOKEN) or --api-tokens FILE")
			return caller{}, false
		}
		return caller{anonymous: true, Token: apitoken.Token{Name: "anonymous", Role: apitoken.RoleRead}}, true
	}
	if s.authThrottled(w, r) {
		return caller{}, false
	}
	var c caller
	if auth := r.Header.Get("Authorization"); auth != "" {
		scheme, token, ok := strings.Cut(auth, " ")
		t, match := s.tokens.Match(strings.TrimSpace(token))
		if !ok || !strings.EqualFold(scheme, "Bearer") || !match {
			s.authFailed(r, "bearer token")
			w.Header().Set("WWW-Authenticate", `Bearer realm="compensa"`)
			writeError(w, http.StatusUnauthorized, "the bearer token is not valid")
			return caller{}, false
		}
		c.Token = t
	} else if t, ok := s.session(r); ok {
		if mutation && r.Header.Get(pageHeader) == "" {
			writeError(w, http.StatusForbidden, "a request authenticated by the page's cookie must carry the "+pageHeader+" header")
			return caller{}, false
		}
		c.Token = t
	} else {
		w.Header().Set("WWW-Authenticate", `Bearer realm="compensa"`)
		writeError(w, http.StatusUnauthorized, "authentication required: send Authorization: Bearer <token>")
		return caller{}, false
	}
	if mutation && !c.Role.CanMutate() {
		writeError(w, http.StatusForbidden, "token "+c.Name+" has role read: it cannot act on sagas (retry, cancel, pause, resume, upgrade)")
		return caller{}, false
	}
	return c, true
}

// pageHeader marks the page's own fetch requests.
const pageHeader = "X-Compensa-Page"

// session finds the token a page session was started with.
func (s *Server) session(r *http.Request) (apitoken.Token, bool) {
	if !s.authRequired() {
		return apitoken.Token{}, false
	}
	return s.sessions.lookup(sessionID(r))
}

// pageCaller is the caller of a page request (pageAuth has let it in).
func (s *Server) pageCaller(r *http.Request) caller {
	if !s.authRequired() {
		return caller{anonymous: true, Token: apitoken.Token{Name: "anonymous", Role: apitoken.RoleRead}}
	}
	t, _ := s.session(r)
	return caller{Token: t}
}

// pageAdmin is the Admin a page request may use.
func (s *Server) pageAdmin(r *http.Request) *admin.Admin {
	c := s.pageCaller(r)
	if c.Tenant.Valid {
		return s.admin.ForTenant(c.Tenant.UUID)
	}
	return s.admin
}

// actor names the caller in the journal: the token's name.
func actor(r *http.Request) string { return callerOf(r).Name }

// errForbidden is answered 403.
type errForbidden string

func (e errForbidden) Error() string { return string(e) }
