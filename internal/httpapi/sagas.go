package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/admin"
)

// maxBody bounds a request body: a reason fits many times over.
const maxBody = 64 << 10

var listParams = map[string]bool{"status": true, "saga": true, "tenant": true, "stuck": true, "limit": true, "cursor": true,
	"version": true, "step": true, "error_contains": true, "created_after": true, "created_before": true}

// parseFilter reads the list parameters; anything unknown or malformed is
// ErrInvalid, so that a typo (stuk=true) is not silently a full listing.
func parseFilter(q url.Values) (admin.Filter, error) {
	var f admin.Filter
	for k, v := range q {
		if !listParams[k] {
			return f, saga.Errorf(saga.ErrInvalid, "unknown parameter %q; the parameters are status, saga, version, step, error_contains, created_after, created_before, tenant, stuck, limit and cursor", k)
		}
		if len(v) > 1 {
			return f, saga.Errorf(saga.ErrInvalid, "parameter %q is given %d times", k, len(v))
		}
	}
	f.Status = saga.Status(q.Get("status"))
	f.Saga = q.Get("saga")
	f.Cursor = q.Get("cursor")
	if t := q.Get("tenant"); t != "" {
		id, err := uuid.Parse(t)
		if err != nil {
			return f, saga.Errorf(saga.ErrInvalid, "tenant %q is not a UUID", t)
		}
		f.Tenant = uuid.NullUUID{UUID: id, Valid: true}
	}
	if v := q.Get("stuck"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return f, saga.Errorf(saga.ErrInvalid, "stuck must be true or false, got %q", v)
		}
		f.Stuck = b
	}
	if v := q.Get("version"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return f, saga.Errorf(saga.ErrInvalid, "version must be a positive integer, got %q", v)
		}
		f.Version = n
	}
	f.Step = q.Get("step")
	f.ErrorContains = q.Get("error_contains")
	for _, b := range []struct {
		key string
		to  *time.Time
	}{{"created_after", &f.CreatedAfter}, {"created_before", &f.CreatedBefore}} {
		if v := q.Get(b.key); v != "" {
			t, err := time.Parse(time.RFC3339Nano, v)
			if err != nil {
				return f, saga.Errorf(saga.ErrInvalid, "%s must be an RFC 3339 time like 2026-01-02T15:04:05Z, got %q", b.key, v)
			}
			*b.to = t
		}
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return f, saga.Errorf(saga.ErrInvalid, "limit must be an integer between 1 and %d, got %q", admin.MaxLimit, v)
		}
		f.Limit = n
	}
	return f, nil
}

func (s *Server) listSagas(w http.ResponseWriter, r *http.Request, a *admin.Admin) {
	f, err := parseFilter(r.URL.Query())
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	page, err := a.List(r.Context(), f)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	// next_cursor is null on the last page, never absent.
	var next *string
	if page.NextCursor != "" {
		next = &page.NextCursor
	}
	items := page.Items
	if items == nil {
		items = []admin.Item{}
	}
	writeJSON(w, http.StatusOK, struct {
		Items      []admin.Item `json:"items"`
		NextCursor *string      `json:"next_cursor"`
	}{items, next})
}

// pathID reads {id}: malformed → 400.
func pathID(r *http.Request) (uuid.UUID, error) {
	raw := r.PathValue("id")
	id, err := uuid.Parse(raw)
	if err != nil || len(raw) != 36 {
		return uuid.Nil, saga.Errorf(saga.ErrInvalid, "%q is not a saga instance id (a UUID like 0b7e6c2a-1f0e-4a57-9a43-5d2c1e6f8b90)", raw)
	}
	return id, nil
}

func (s *Server) showSaga(w http.ResponseWriter, r *http.Request, a *admin.Admin) {
	id, err := pathID(r)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	d, err := a.Show(r.Context(), id)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, d)
}

// actionBody is the body of retry and cancel.
type actionBody struct {
	Reason string `json:"reason"`
	// FromStep and RerunEarlier: a retry's restart from a step.
	FromStep     string `json:"from_step"`
	RerunEarlier bool   `json:"rerun_earlier"`
}

func readAction(r *http.Request) (actionBody, error) {
	var b actionBody
	body, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, maxBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return b, saga.Errorf(saga.ErrInvalid, "body is larger than %d bytes", maxBody)
		}
		return b, saga.Errorf(saga.ErrInvalid, "cannot read the body: %v", err)
	}
	if len(strings.TrimSpace(string(body))) == 0 {
		return b, nil
	}
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil {
		return b, saga.Errorf(saga.ErrInvalid, `body must be a JSON object like {"reason": "…"}: %v`, err)
	}
	if dec.More() {
		return b, saga.Errorf(saga.ErrInvalid, "body holds more than one JSON value")
	}
	return b, checkReason(b.Reason)
}

// checkReason refuses a reason that a terminal would obey: it is journaled
// and printed by `relay sagas show` in an operator's terminal, where escape
// sequences take effect.
func checkReason(reason string) error {
	if hasControl(reason) {
		return saga.Errorf(saga.ErrInvalid, "reason holds control characters (escape sequences, NUL, newlines); send plain text on one line")
	}
	if !utf8.ValidString(reason) {
		return saga.Errorf(saga.ErrInvalid, "reason is not valid UTF-8")
	}
	return nil
}

func (s *Server) retrySaga(w http.ResponseWriter, r *http.Request, a *admin.Admin) {
	s.act(w, r, a, "retry", a.Retry)
}

// restart is a retry with from_step: a new attempt from that step.
func (s *Server) restart(a *admin.Admin, body actionBody) func(ctx context.Context, id uuid.UUID, reason, actor string) (admin.Result, error) {
	return func(ctx context.Context, id uuid.UUID, reason, actor string) (admin.Result, error) {
		return a.RetryFromStep(ctx, admin.RestartRequest{ID: id, FromStep: body.FromStep, RerunEarlier: body.RerunEarlier, Reason: reason, Actor: actor})
	}
}

func (s *Server) cancelSaga(w http.ResponseWriter, r *http.Request, a *admin.Admin) {
	s.act(w, r, a, "cancel", a.Cancel)
}

func (s *Server) pauseSaga(w http.ResponseWriter, r *http.Request, a *admin.Admin) {
	s.act(w, r, a, "pause", a.Pause)
}

func (s *Server) resumeSaga(w http.ResponseWriter, r *http.Request, a *admin.Admin) {
	s.act(w, r, a, "resume", a.Resume)
}

func (s *Server) act(w http.ResponseWriter, r *http.Request, a *admin.Admin, action string,
	do func(ctx context.Context, id uuid.UUID, reason, actor string) (admin.Result, error)) {
	id, err := pathID(r)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	body, err := readAction(r)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	if body.FromStep != "" || body.RerunEarlier {
		if action != "retry" || body.FromStep == "" {
			s.writeErr(w, r, saga.Errorf(saga.ErrInvalid, "from_step and rerun_earlier are for a retry, and rerun_earlier goes with from_step"))
			return
		}
		do = s.restart(a, body)
	}
	who := actor(r)
	res, err := do(r.Context(), id, body.Reason, who)
	if err != nil {
		s.metrics.manual(action, "refused")
		s.writeErr(w, r, err)
		return
	}
	result := "requested"
	if res.AlreadyRequested {
		result = "already_requested"
	}
	s.metrics.manual(action, result)
	if !res.AlreadyRequested && s.cfg.Wake != nil {
		s.cfg.Wake()
	}
	s.log.Info(fmt.Sprintf("saga %s %s by operator", action, result), "saga_id", id, "saga", res.Instance.SagaName,
		"step", res.Instance.CurrentStep, "status", string(res.Instance.Status), "actor", who, "reason", body.Reason)
	writeJSON(w, http.StatusOK, res)
}

// bulkBody is the body of POST /v1/sagas/retry, /cancel, /pause and /resume.
type bulkBody struct {
	Filter bulkFilter `json:"filter"`
	Reason string     `json:"reason"`
	// DryRun defaults to true: acting on many instances is asked for
	// explicitly.
	DryRun *bool `json:"dry_run"`
	Limit  int   `json:"limit"`
}

// bulkFilter is the filter of a bulk action, with the keys of the list's
// query parameters.
type bulkFilter struct {
	Saga          string     `json:"saga"`
	Version       int        `json:"version"`
	Status        string     `json:"status"`
	Step          string     `json:"step"`
	Stuck         bool       `json:"stuck"`
	ErrorContains string     `json:"error_contains"`
	CreatedAfter  *time.Time `json:"created_after"`
	CreatedBefore *time.Time `json:"created_before"`
	Tenant        *uuid.UUID `json:"tenant"`
}

func (f bulkFilter) admin() admin.Filter {
	out := admin.Filter{Saga: f.Saga, Version: f.Version, Status: saga.Status(f.Status), Step: f.Step, Stuck: f.Stuck, ErrorContains: f.ErrorContains}
	if f.CreatedAfter != nil {
		out.CreatedAfter = *f.CreatedAfter
	}
	if f.CreatedBefore != nil {
		out.CreatedBefore = *f.CreatedBefore
	}
	if f.Tenant != nil {
		out.Tenant = uuid.NullUUID{UUID: *f.Tenant, Valid: true}
	}
	return out
}

func readBulk(r *http.Request) (bulkBody, error) {
	var b bulkBody
	body, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, maxBody))
	if err != nil {
		return b, saga.Errorf(saga.ErrInvalid, "cannot read the body (at most %d bytes): %v", maxBody, err)
	}
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil {
		return b, saga.Errorf(saga.ErrInvalid, `body must be a JSON object like {"filter": {"saga": "order", "status": "FAILED"}, "reason": "…", "dry_run": true, "limit": 1000}: %v`, err)
	}
	if dec.More() {
		return b, saga.Errorf(saga.ErrInvalid, "body holds more than one JSON value")
	}
	if b.Limit < 0 {
		return b, saga.Errorf(saga.ErrInvalid, "limit must be between 1 and %d, got %d", admin.MaxBulkLimit, b.Limit)
	}
	return b, checkReason(b.Reason)
}

func (s *Server) bulkRetry(w http.ResponseWriter, r *http.Request, a *admin.Admin) {
	s.bulk(w, r, "retry", a.RetryMatching)
}

func (s *Server) bulkCancel(w http.ResponseWriter, r *http.Request, a *admin.Admin) {
	s.bulk(w, r, "cancel", a.CancelMatching)
}

func (s *Server) bulkPause(w http.ResponseWriter, r *http.Request, a *admin.Admin) {
	s.bulk(w, r, "pause", a.PauseMatching)
}

func (s *Server) bulkResume(w http.ResponseWriter, r *http.Request, a *admin.Admin) {
	s.bulk(w, r, "resume", a.ResumeMatching)
}

func (s *Server) bulk(w http.ResponseWriter, r *http.Request, action string, do func(context.Context, admin.BulkRequest) (admin.BulkResult, error)) {
	b, err := readBulk(r)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	req := admin.BulkRequest{Filter: b.Filter.admin(), Reason: b.Reason, Actor: actor(r), DryRun: b.DryRun == nil || *b.DryRun, Limit: b.Limit}
	res, err := do(r.Context(), req)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	if !res.DryRun {
		for outcome, n := range res.Outcomes {
			s.metrics.manualN(action, bulkMetricResult(outcome), n)
		}
		s.log.Info("bulk saga "+action+" by operator", "matched", res.Matched, "skipped", res.Skipped, "outcomes", res.Outcomes, "actor", req.Actor, "reason", req.Reason)
	}
	writeJSON(w, http.StatusOK, res)
}

// bulkMetricResult maps a bulk outcome onto the result label the single
// actions use, so that one counter tells both.
func bulkMetricResult(outcome string) string {
	switch outcome {
	case admin.OutcomeAlreadyRequested:
		return "already_requested"
	case admin.OutcomeConflict:
		return "refused"
	}
	return "requested"
}

func (s *Server) overview(w http.ResponseWriter, r *http.Request, a *admin.Admin) {
	if len(r.URL.Query()) > 0 {
		s.writeErr(w, r, saga.Errorf(saga.ErrInvalid, "/v1/overview takes no parameters (X-Tenant-ID narrows it to one tenant)"))
		return
	}
	o, err := a.Overview(r.Context())
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, o)
}

func (s *Server) search(w http.ResponseWriter, r *http.Request, a *admin.Admin) {
	q := r.URL.Query()
	for k, v := range q {
		if k != "q" || len(v) > 1 {
			s.writeErr(w, r, saga.Errorf(saga.ErrInvalid, "/v1/search takes one parameter, q: an instance, trigger event, correlation, aggregate or command id"))
			return
		}
	}
	hits, err := a.Search(r.Context(), q.Get("q"))
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, struct {
		Query string            `json:"query"`
		Items []admin.SearchHit `json:"items"`
	}{q.Get("q"), hits})
}

func (s *Server) replication(w http.ResponseWriter, r *http.Request, _ *admin.Admin) {
	if s.cfg.Replication == nil {
		writeError(w, http.StatusServiceUnavailable, "this relay process does not stream (started with --no-stream?): ask a streaming replica, or run relay lag")
		return
	}
	st, err := s.sampleLag(r.Context())
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

// upgradeBody is the body of POST /v1/sagas/upgrade.
type upgradeBody struct {
	Saga        string `json:"saga"`
	FromVersion int    `json:"from_version"`
	ToVersion   int    `json:"to_version"`
	Reason      string `json:"reason"`
	// DryRun defaults to true, as for the bulk actions.
	DryRun *bool `json:"dry_run"`
	Limit  int   `json:"limit"`
}

// upgradeSagas moves RUNNING and PAUSED instances of a saga to another
// version where it can continue them (admin.Upgrade).
func (s *Server) upgradeSagas(w http.ResponseWriter, r *http.Request, a *admin.Admin) {
	var b upgradeBody
	body, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, maxBody))
	if err != nil {
		s.writeErr(w, r, saga.Errorf(saga.ErrInvalid, "cannot read the body (at most %d bytes): %v", maxBody, err))
		return
	}
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil || dec.More() {
		s.writeErr(w, r, saga.Errorf(saga.ErrInvalid, `body must be one JSON object like {"saga": "order", "from_version": 1, "to_version": 2, "reason": "…", "dry_run": true}: %v`, err))
		return
	}
	if err := checkReason(b.Reason); err != nil {
		s.writeErr(w, r, err)
		return
	}
	req := admin.UpgradeRequest{Saga: b.Saga, From: b.FromVersion, To: b.ToVersion, Reason: b.Reason, Actor: actor(r),
		DryRun: b.DryRun == nil || *b.DryRun, Limit: b.Limit}
	res, err := a.Upgrade(r.Context(), req)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	if !res.DryRun {
		s.metrics.manualN("upgrade", "requested", int64(len(res.Moved)))
		s.metrics.manualN("upgrade", "refused", int64(len(res.Refused)))
		if len(res.Moved) > 0 && s.cfg.Wake != nil {
			s.cfg.Wake()
		}
		s.log.Info("sagas upgraded by operator", "saga", res.Saga, "from_version", res.From, "to_version", res.To,
			"moved", len(res.Moved), "refused", len(res.Refused), "actor", req.Actor, "reason", b.Reason)
	}
	writeJSON(w, http.StatusOK, res)
}
