package httpapi

import (
	"encoding/json"
	"errors"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/admin"
	"github.com/compensa/compensa/sink"
)

// listSinks is GET /v1/sinks: each sink's state, delivered and parked
// counts and the age of its oldest parked event (the same as `relay sinks list`).
func (s *Server) listSinks(w http.ResponseWriter, r *http.Request, _ *admin.Admin) {
	if !s.allTenants(w, r) {
		return
	}
	st, err := sink.List(r.Context(), s.cfg.Pool)
	if err != nil {
		s.log.Warn("list sinks", "err", err)
		writeError(w, http.StatusInternalServerError, "cannot read the sinks' state")
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"sinks": st})
}

// retrySink is POST /v1/sinks/{name}/retry: re-drive the parked events now
// (the same as `relay sinks retry NAME`).
func (s *Server) retrySink(w http.ResponseWriter, r *http.Request, _ *admin.Admin) {
	if !s.allTenants(w, r) {
		return
	}
	name := r.PathValue("name")
	n, err := sink.RequestRetry(r.Context(), s.cfg.Pool, name)
	switch {
	case errors.Is(err, sink.ErrUnknownSink):
		writeError(w, http.StatusNotFound, "no sink named "+name+" (see GET /v1/sinks)")
	case err != nil:
		s.log.Warn("retry sink", "sink", name, "err", err)
		writeError(w, http.StatusInternalServerError, "cannot request the retry")
	default:
		writeJSON(w, http.StatusOK, map[string]any{"sink": name, "parked": n})
	}
}

// replayBody is the body of POST /v1/sinks/{name}/replay.
type replayBody struct {
	Since         time.Time  `json:"since"`
	Until         *time.Time `json:"until"`
	AggregateType string     `json:"aggregate_type"`
	EventType     string     `json:"event_type"`
	DryRun        bool       `json:"dry_run"`
	// IncludeSkipped delivers the events an operator skipped too.
	IncludeSkipped bool `json:"include_skipped"`
}

// replaySink is POST /v1/sinks/{name}/replay: re-deliver the outbox rows
// still in the table to one sink (the same as `relay sinks replay NAME`).
// It answers when the replay is done, with what it found and delivered.
func (s *Server) replaySink(w http.ResponseWriter, r *http.Request, _ *admin.Admin) {
	if !s.allTenants(w, r) {
		return
	}
	if s.cfg.ReplaySink == nil {
		writeError(w, http.StatusServiceUnavailable, "this relay runs no sinks (start it with --sinks FILE)")
		return
	}
	name := r.PathValue("name")
	var b replayBody
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil {
		writeError(w, http.StatusBadRequest, `body must be a JSON object like {"since": "2026-01-02T15:04:05Z", "until": "…", "aggregate_type": "…", "event_type": "order.*", "dry_run": true}: `+err.Error())
		return
	}
	if b.Since.IsZero() {
		writeError(w, http.StatusBadRequest, `"since" is required: the start of the window on created_at, RFC 3339`)
		return
	}
	req := sink.ReplayRequest{Since: b.Since, AggregateType: b.AggregateType, EventType: b.EventType, DryRun: b.DryRun, IncludeSkipped: b.IncludeSkipped}
	if b.Until != nil {
		req.Until = *b.Until
	}
	if !req.Until.IsZero() && !req.Until.After(req.Since) {
		writeError(w, http.StatusBadRequest, `"until" must be after "since"`)
		return
	}
	if req.EventType != "" {
		if _, err := path.Match(req.EventType, ""); err != nil {
			writeError(w, http.StatusBadRequest, `"event_type" is not a valid glob: `+err.Error())
			return
		}
	}
	res, err := s.cfg.ReplaySink(r.Context(), name, req)
	switch {
	case errors.Is(err, sink.ErrUnknownSink):
		writeError(w, http.StatusNotFound, "no sink named "+name+" (see GET /v1/sinks)")
	case errors.Is(err, sink.ErrReplayRunning):
		writeError(w, http.StatusConflict, "a replay of sink "+name+" is already running; one runs at a time: wait for it to end")
	case err != nil:
		s.log.Warn("replay sink", "sink", name, "found", res.Found, "delivered", res.Delivered, "err", err)
		writeJSON(w, http.StatusBadGateway, map[string]any{"error": "the replay stopped: " + err.Error(), "sink": name,
			"found": res.Found, "delivered": res.Delivered, "dry_run": res.DryRun})
	default:
		writeJSON(w, http.StatusOK, res)
	}
}

// allTenants refuses a tenant-scoped token: a sink carries every tenant's
// events, so its counts and its retry belong to operators of all tenants.
func (s *Server) allTenants(w http.ResponseWriter, r *http.Request) bool {
	if c := callerOf(r); c.Tenant.Valid {
		writeError(w, http.StatusForbidden, "token "+c.Name+" is scoped to one tenant; sinks carry every tenant's events: use a token with tenant \"*\"")
		return false
	}
	return true
}

// parkedParams are the query parameters of GET /v1/sinks/{name}/parked.
var parkedParams = map[string]bool{"limit": true}

// listParked is GET /v1/sinks/{name}/parked: the events parked for the
// sink, in delivery order (the same as `relay sinks parked NAME --json`).
// A tenant-scoped token (or X-Tenant-ID) sees its tenant's events only.
func (s *Server) listParked(w http.ResponseWriter, r *http.Request, _ *admin.Admin) {
	name := r.PathValue("name")
	q := r.URL.Query()
	for k, v := range q {
		if !parkedParams[k] {
			s.writeErr(w, r, saga.Errorf(saga.ErrInvalid, "unknown parameter %q; the only parameter is limit", k))
			return
		}
		if len(v) > 1 {
			s.writeErr(w, r, saga.Errorf(saga.ErrInvalid, "parameter %q is given %d times", k, len(v)))
			return
		}
	}
	f := sink.ParkedFilter{Tenant: requestTenant(r)}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > sink.MaxParkedLimit {
			s.writeErr(w, r, saga.Errorf(saga.ErrInvalid, "limit must be an integer between 1 and %d, got %q", sink.MaxParkedLimit, v))
			return
		}
		f.Limit = n
	}
	evs, err := sink.ListParked(r.Context(), s.cfg.Pool, name, f)
	switch {
	case errors.Is(err, sink.ErrUnknownSink):
		writeError(w, http.StatusNotFound, "no sink named "+name+" (see GET /v1/sinks)")
	case err != nil:
		s.log.Warn("list parked events", "sink", name, "err", err)
		writeError(w, http.StatusInternalServerError, "cannot read the parked events")
	default:
		writeJSON(w, http.StatusOK, map[string]any{"sink": name, "items": evs})
	}
}

// skipParked is POST /v1/sinks/{name}/parked/{id}/skip: give up on one
// parked event (the same as `relay sinks skip NAME --id ID --reason TEXT`).
// The event is kept in relay_sink_skipped with the token's name, the time
// and the reason. A tenant-scoped token may skip its tenant's events only.
func (s *Server) skipParked(w http.ResponseWriter, r *http.Request, _ *admin.Admin) {
	name, id := r.PathValue("name"), r.PathValue("id")
	body, err := readAction(r)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	if strings.TrimSpace(body.Reason) == "" {
		s.writeErr(w, r, saga.Errorf(saga.ErrInvalid, `reason is required: send {"reason": "…"} saying why this event can never be delivered`))
		return
	}
	who := actor(r)
	res, err := sink.Skip(r.Context(), s.cfg.Pool, sink.SkipRequest{Sink: name, EventID: id, Reason: body.Reason, Actor: who, Tenant: requestTenant(r)})
	switch {
	case errors.Is(err, sink.ErrUnknownSink), errors.Is(err, sink.ErrNotParked):
		writeError(w, http.StatusNotFound, err.Error())
	case errors.Is(err, sink.ErrInvalid):
		writeError(w, http.StatusBadRequest, err.Error())
	case err != nil:
		s.log.Warn("skip parked event", "sink", name, "event_id", id, "err", err)
		writeError(w, http.StatusInternalServerError, "cannot skip the event; see the relay's log")
	default:
		s.log.Info("parked event skipped by operator", "sink", name, "event_id", id, "actor", who, "reason", body.Reason)
		writeJSON(w, http.StatusOK, res)
	}
}

// requestTenant is the one tenant a request may see: the token's, or the
// one X-Tenant-ID narrows to (api has checked that it may).
func requestTenant(r *http.Request) uuid.NullUUID {
	if c := callerOf(r); c.Tenant.Valid {
		return c.Tenant
	}
	if id, set, _ := tenantHeader(r); set {
		return uuid.NullUUID{UUID: id, Valid: true}
	}
	return uuid.NullUUID{}
}
