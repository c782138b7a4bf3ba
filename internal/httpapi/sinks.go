package httpapi

import (
	"errors"
	"net/http"

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

// allTenants refuses a tenant-scoped token: a sink carries every tenant's
// events, so its counts and its retry belong to operators of all tenants.
func (s *Server) allTenants(w http.ResponseWriter, r *http.Request) bool {
	if c := callerOf(r); c.Tenant.Valid {
		writeError(w, http.StatusForbidden, "token "+c.Name+" is scoped to one tenant; sinks carry every tenant's events: use a token with tenant \"*\"")
		return false
	}
	return true
}
