package httpapi

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"io/fs"
	"net/http"
	"net/url"
	"time"

	"github.com/a-h/templ"

	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/admin"
	"github.com/compensa/compensa/sink"
)

// The web page is rendered on the server by templ components (the
// page_*.templ files; `make docs` regenerates their *_templ.go files, and
// TestTemplGenerated fails when a committed one is stale). Its stylesheet and
// its one small script are embedded, so there is nothing to fetch from
// elsewhere. The page executes no html/template: a template's method
// lookups by name would make the linker keep every exported method of every
// type the relay links (TestRelayBinaryKeepsDeadCodeElimination in
// cmd/relay).
//
// Authentication: with a token configured, the page asks for it once
// (/login), checks it in constant time and sets an HttpOnly, SameSite=Strict
// cookie naming a random server-side session (session.go). The page's
// fetch calls to /v1 carry that cookie and the X-Compensa-Page header; the
// header is required for retry and cancel by cookie, which a cross-site form
// cannot send. Without a token the page is open and its retry and cancel
// buttons are disabled, as the API's mutations are.

//go:embed web/assets
var assetFS embed.FS

func (s *Server) pageRoutes(m *http.ServeMux) {
	assets, _ := fs.Sub(assetFS, "web/assets")
	m.Handle("GET /assets/", http.StripPrefix("/assets/", http.FileServer(http.FS(assets))))
	m.HandleFunc("GET /{$}", s.limited(s.pageAuth(s.indexPage)))
	m.HandleFunc("GET /sagas/{id}", s.limited(s.pageAuth(s.sagaPage)))
	m.HandleFunc("GET /search", s.limited(s.pageAuth(s.searchPage)))
	m.HandleFunc("GET /definitions", s.limited(s.pageAuth(s.definitionsPage)))
	m.HandleFunc("GET /deadletters", s.limited(s.pageAuth(s.deadLettersPage)))
	m.HandleFunc("GET /login", s.loginPage)
	m.HandleFunc("POST /login", s.login)
	m.HandleFunc("POST /logout", s.logout)
}

// pageAuth sends a visitor without a session to the login form when a
// token is configured.
func (s *Server) pageAuth(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.authRequired() && !s.hasSession(r) {
			http.Redirect(w, r, "/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
			return
		}
		h(w, r)
	}
}

// layoutData is what every page's frame needs.
type layoutData struct {
	Title     string
	TokenSet  bool
	LoggedIn  bool
	CanMutate bool
	// Insecure: no token on a non-loopback address (--http-insecure).
	Insecure bool
	// Caller names the signed-in token; Tenant is its scope ("" for all).
	Caller, Tenant string
}

func (s *Server) layout(r *http.Request, title string) layoutData {
	c := s.pageCaller(r)
	d := layoutData{Title: title, TokenSet: s.authRequired(), LoggedIn: s.hasSession(r),
		CanMutate: s.authRequired() && c.Role.CanMutate(), Insecure: s.cfg.Insecure && !s.authRequired()}
	if !c.anonymous {
		d.Caller = c.Name
		if c.Tenant.Valid {
			d.Tenant = c.Tenant.UUID.String()
		}
	}
	return d
}

func (s *Server) render(w http.ResponseWriter, r *http.Request, page templ.Component, status int) {
	var buf bytes.Buffer
	// The page is rendered whole before anything is sent, so that a failure
	// is a 500 rather than half a page. A visitor who leaves meanwhile must
	// not make it fail: the queries are done, and the rendering is quick.
	if err := page.Render(context.WithoutCancel(r.Context()), &buf); err != nil {
		s.log.Error("render page", "path", r.URL.Path, "err", err)
		http.Error(w, "cannot render the page; see the relay's log", http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	// Only our own script and stylesheet run: a saga's error text or output
	// cannot inject anything even if escaping were ever missed.
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	// No page URL (it may name an instance) goes to another site; our own
	// forms still carry their Origin, which the sign-in checks.
	h.Set("Referrer-Policy", "same-origin")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

var allStatuses = []saga.Status{saga.StatusRunning, saga.StatusPaused, saga.StatusCompensating, saga.StatusFailed, saga.StatusCompleted, saga.StatusCompensated, saga.StatusTimedOut}

type indexData struct {
	layoutData
	Stuck       []admin.Item
	StuckMore   bool
	Recent      []admin.Item
	NextCursor  string
	Filter      admin.Filter
	Statuses    []saga.Status
	StuckAfter  time.Duration
	HoldAfter   time.Duration
	Replication *ReplicationStatus
	ReplErr     string
	Sinks       []sink.Status
	SinksErr    string
	Chart       chart
	Error       string
	FilterQuery string
	HasFilter   bool
	ErrorOnly   bool
	// Overview is the page's top; OverviewChart its per-minute chart.
	Overview      *admin.Overview
	OverviewChart overviewChart
	OverviewErr   string
	// Outage: the database is unreachable; the page shows what the relay
	// knows without it (ErrorOnly is set too).
	Outage *outage
	// Ready is the relay's /readyz state, shown at the top.
	Ready readiness
	// Matched counts every instance the filter matches; Retryable and
	// Cancellable those a retry or a cancel can act on ("Retry all N",
	// "Cancel all N"); FilterJSON is the filter as the bulk API takes it.
	Matched, Retryable, Cancellable             int64
	MatchedMore, RetryableMore, CancellableMore bool
	FilterJSON                                  string
}

// pageCountCap bounds the page's count of a filtered list; the bulk
// buttons' dry run tells the exact number before anything is done.
const pageCountCap = 10000

func (s *Server) indexPage(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	adm := s.pageAdmin(r)
	d := indexData{layoutData: s.layout(r, "Compensa monitor"), StuckAfter: adm.StuckAfter(), HoldAfter: adm.HoldAfter(), Statuses: allStatuses}

	stuck, err := adm.List(ctx, admin.Filter{Stuck: true, Limit: 100})
	if err != nil {
		s.pageError(w, r, err)
		return
	}
	d.Stuck, d.StuckMore = stuck.Items, stuck.NextCursor != ""

	if o, err := adm.Overview(ctx); err != nil {
		s.log.Error("page: overview", "err", err)
		d.OverviewErr = "cannot compute the overview; see the relay's log"
	} else {
		d.Overview, d.OverviewChart = &o, newOverviewChart(o.PerMinute)
	}

	q := r.URL.Query()
	f, err := parseFilter(q)
	if f.Limit == 0 {
		f.Limit = 50
	}
	d.Filter = f
	d.HasFilter = f.Status != "" || f.Saga != "" || f.Version != 0 || f.Step != "" || f.ErrorContains != "" ||
		!f.CreatedAfter.IsZero() || !f.CreatedBefore.IsZero() || f.Tenant.Valid || f.Stuck
	var recent admin.Page
	if err == nil {
		recent, err = adm.List(ctx, f)
	}
	if err == nil && d.HasFilter {
		d.Matched, d.MatchedMore, err = adm.CountUpTo(ctx, f, pageCountCap)
		if err == nil {
			d.Retryable, d.RetryableMore, err = adm.CountApplicable(ctx, f, admin.ActionRetry, pageCountCap)
		}
		if err == nil {
			d.Cancellable, d.CancellableMore, err = adm.CountApplicable(ctx, f, admin.ActionCancel, pageCountCap)
		}
		d.FilterJSON = bulkFilterJSON(f)
	}
	switch {
	case errors.Is(err, saga.ErrInvalid):
		// A bad filter is the visitor's mistake: show it on the page.
		d.Error = err.Error()
	case err != nil:
		// Anything else may carry the database's own words, which are not
		// meant for visitors.
		s.log.Error("page: list instances", "path", r.URL.Path, "err", err)
		d.Error = "cannot list the instances; see the relay's log"
	default:
		d.Recent, d.NextCursor = recent.Items, recent.NextCursor
		next := url.Values{}
		for k, v := range q {
			if k != "cursor" {
				next[k] = v
			}
		}
		next.Set("cursor", recent.NextCursor)
		d.FilterQuery = next.Encode()
	}

	if s.cfg.Replication != nil {
		st, err := s.sampleLag(ctx)
		if err != nil {
			s.log.Warn("page: replication status", "err", err)
			d.ReplErr = "cannot read the replication slot's status; see the relay's log"
		} else {
			d.Replication = &st
		}
		d.Chart = newChart(s.lag.samples())
	}
	// A sink carries every tenant's events, so only a token of every
	// tenant sees the sinks, as with GET /v1/sinks.
	if !s.pageCaller(r).Tenant.Valid {
		if d.Sinks, err = sink.List(ctx, s.cfg.Pool); err != nil {
			s.log.Warn("page: sinks", "err", err)
			d.SinksErr = "cannot read the sinks' state; see the relay's log"
		}
	}
	d.Ready = s.pageReadiness(ctx)
	s.throttle.Recovered("page", "page: the database answers the page again")
	s.render(w, r, indexView(d), http.StatusOK)
}

type sagaData struct {
	layoutData
	D        admin.Detail
	Timeline timeline
}

func (s *Server) sagaPage(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		s.pageError(w, r, err)
		return
	}
	d, err := s.pageAdmin(r).Show(r.Context(), id)
	if err != nil {
		s.pageError(w, r, err)
		return
	}
	s.render(w, r, sagaView(sagaData{layoutData: s.layout(r, "Saga "+d.Instance.SagaName+" "+shortID(id)), D: d, Timeline: newTimeline(d)}), http.StatusOK)
}

// searchData is the page of a search.
type searchData struct {
	layoutData
	Query string
	Hits  []admin.SearchHit
	Error string
}

// searchPage finds instances by any id (the header's search box).
func (s *Server) searchPage(w http.ResponseWriter, r *http.Request) {
	d := searchData{layoutData: s.layout(r, "Search"), Query: r.URL.Query().Get("q")}
	hits, err := s.pageAdmin(r).Search(r.Context(), d.Query)
	switch {
	case errors.Is(err, saga.ErrInvalid):
		d.Error = err.Error()
	case err != nil:
		s.pageError(w, r, err)
		return
	}
	d.Hits = hits
	s.render(w, r, searchView(d), http.StatusOK)
}

// bulkFilterJSON writes a list filter as the bulk API's filter object.
func bulkFilterJSON(f admin.Filter) string {
	m := map[string]any{}
	if f.Saga != "" {
		m["saga"] = f.Saga
	}
	if f.Version != 0 {
		m["version"] = f.Version
	}
	if f.Status != "" {
		m["status"] = f.Status
	}
	if f.Step != "" {
		m["step"] = f.Step
	}
	if f.Stuck {
		m["stuck"] = true
	}
	if f.ErrorContains != "" {
		m["error_contains"] = f.ErrorContains
	}
	if !f.CreatedAfter.IsZero() {
		m["created_after"] = f.CreatedAfter
	}
	if !f.CreatedBefore.IsZero() {
		m["created_before"] = f.CreatedBefore
	}
	if f.Tenant.Valid {
		m["tenant"] = f.Tenant.UUID
	}
	b, _ := json.Marshal(m)
	return string(b)
}

func (s *Server) pageError(w http.ResponseWriter, r *http.Request, err error) {
	status := http.StatusInternalServerError
	msg := "internal error; see the relay's log"
	switch {
	case errors.Is(err, saga.ErrInvalid):
		status, msg = http.StatusBadRequest, err.Error()
	case errors.Is(err, saga.ErrNotFound):
		status, msg = http.StatusNotFound, err.Error()
	default:
		if s.outagePage(w, r, err) {
			return
		}
		s.log.Error("page request failed", "path", r.URL.Path, "err", err)
	}
	d := indexData{layoutData: s.layout(r, "Compensa monitor"), Error: msg, ErrorOnly: true}
	s.render(w, r, indexView(d), status)
}

// outage is what the page shows while the database is unreachable.
type outage struct {
	// Reasons are /readyz's reasons, which say nothing the relay's log
	// alone should hold (no query error; the stream's error without the
	// password).
	Reasons []string
}

// outagePage answers a page whose query failed while the readiness check
// finds the database unreachable: 503 with a banner, the reasons /readyz
// gives and the lag samples kept in memory, instead of a bare internal
// error. The query's error goes to the log, once per interval while the
// outage lasts. It reports false when the database is reachable: the
// failure is the page's own.
func (s *Server) outagePage(w http.ResponseWriter, r *http.Request, err error) bool {
	res, ok := s.ready.get(r.Context(), s.cfg.ReadinessMaxAge, s.checkReady)
	if !ok || !res.databaseDown {
		return false
	}
	s.throttle.Warn("page", "page: the database is unreachable; serving what the relay knows without it", "path", r.URL.Path, "err", err)
	reasons, _ := res.body["reasons"].([]string)
	d := indexData{layoutData: s.layout(r, "Compensa monitor: database unreachable"), ErrorOnly: true, Outage: &outage{Reasons: reasons}}
	if s.cfg.Replication != nil {
		d.Chart = newChart(s.lag.samples())
	}
	s.render(w, r, indexView(d), http.StatusServiceUnavailable)
	return true
}
