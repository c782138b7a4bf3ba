package httpapi

import (
	"net/http"
	"net/url"
	"strings"
)

// The page's sign-in: the login form, the session cookie it sets and the
// checks against cross-site posts and open redirects.

type loginData struct {
	layoutData
	Next  string
	Error string
}

func (s *Server) loginPage(w http.ResponseWriter, r *http.Request) {
	if !s.authRequired() {
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return
	}
	s.render(w, r, loginView(loginData{layoutData: s.layout(r, "Sign in"), Next: safeNext(r.URL.Query().Get("next"))}), http.StatusOK)
}

func (s *Server) login(w http.ResponseWriter, r *http.Request) {
	if crossSite(r) {
		// Login CSRF: another site must not sign the browser in with a
		// token of its choosing.
		http.Error(w, "cross-site sign-in refused: sign in from the relay's own page", http.StatusForbidden)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxBody)
	if err := r.ParseForm(); err != nil {
		http.Error(w, "bad form", http.StatusBadRequest)
		return
	}
	for k, vs := range r.PostForm {
		for _, v := range vs {
			if !cleanText(k) || !cleanText(v) {
				http.Error(w, "the form holds invalid UTF-8 or a NUL byte", http.StatusBadRequest)
				return
			}
		}
	}
	next := safeNext(r.PostForm.Get("next"))
	if !s.authRequired() {
		http.Redirect(w, r, next, http.StatusSeeOther)
		return
	}
	if s.authThrottled(w, r) {
		return
	}
	tok, ok := s.tokens.Match(r.PostForm.Get("token"))
	if !ok {
		s.authFailed(r, "login form")
		s.render(w, r, loginView(loginData{layoutData: s.layout(r, "Sign in"), Next: next, Error: "That token is not one of the relay's API tokens."}), http.StatusUnauthorized)
		return
	}
	s.startSession(w, r, tok)
	http.Redirect(w, r, next, http.StatusSeeOther)
}

// logout deletes the session on the server, so that a copy of the cookie
// is worthless from now on, not only the browser's.
// Whatever the request's origin, the session whose cookie it carries ends
// on the server, so that the browser never holds a cleared cookie while its
// session lives on; a cross-site logout is then answered 403.
func (s *Server) logout(w http.ResponseWriter, r *http.Request) {
	s.endSession(w, r)
	if crossSite(r) {
		http.Error(w, "cross-site sign-out refused: sign out from the relay's own page", http.StatusForbidden)
		return
	}
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}

// crossSite reports a browser request sent by another site. A browser that
// sends Sec-Fetch-Site is believed: only same-origin and none (typed by the
// user) pass. Otherwise an Origin that is not this request's own host
// ("null" included) is cross-site. Clients that send neither (curl,
// scripts) are not browsers and pass.
func crossSite(r *http.Request) bool {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "same-origin", "none":
		return false
	case "":
	default:
		return true
	}
	origin := r.Header.Get("Origin")
	if origin == "" {
		return false
	}
	u, err := url.Parse(origin)
	return err != nil || u.Host == "" || !strings.EqualFold(u.Host, r.Host)
}

// safeNext keeps a redirect target on this site. Control characters are
// refused too: browsers strip tabs and newlines from a URL before reading it,
// so "/\t/evil.example" would be "//evil.example", another site.
func safeNext(next string) string {
	if !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") || strings.Contains(next, "\\") ||
		strings.ContainsFunc(next, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return "/"
	}
	return next
}
