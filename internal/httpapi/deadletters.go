package httpapi

import (
	"net/http"
	"strconv"
	"time"

	"github.com/compensa/compensa/correlator"
	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/admin"
)

// deadLetterParams are the query parameters of GET /v1/deadletters.
var deadLetterParams = map[string]bool{"limit": true, "all": true}

// deadLetter is one item of GET /v1/deadletters: the correlator's dead
// letter with its age.
type deadLetter struct {
	correlator.DeadLetter
	AgeSeconds float64 `json:"age_seconds"`
}

// listDeadLetters is GET /v1/deadletters: the events the correlator parked
// because it could not use them, newest first, those not yet re-driven
// unless all=true (the same as `relay deadletters list --json`). A
// tenant-scoped token (or X-Tenant-ID) sees the dead letters whose stored
// event belongs to its tenant only.
func (s *Server) listDeadLetters(w http.ResponseWriter, r *http.Request, _ *admin.Admin) {
	q := r.URL.Query()
	for k, v := range q {
		if !deadLetterParams[k] {
			s.writeErr(w, r, saga.Errorf(saga.ErrInvalid, "unknown parameter %q; the parameters are limit and all", k))
			return
		}
		if len(v) > 1 {
			s.writeErr(w, r, saga.Errorf(saga.ErrInvalid, "parameter %q is given %d times", k, len(v)))
			return
		}
	}
	f := correlator.DeadLetterFilter{Pending: true, Tenant: requestTenant(r)}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > correlator.MaxDeadLetterLimit {
			s.writeErr(w, r, saga.Errorf(saga.ErrInvalid, "limit must be an integer between 1 and %d, got %q", correlator.MaxDeadLetterLimit, v))
			return
		}
		f.Limit = n
	}
	if v := q.Get("all"); v != "" {
		all, err := strconv.ParseBool(v)
		if err != nil {
			s.writeErr(w, r, saga.Errorf(saga.ErrInvalid, "all must be true or false, got %q", v))
			return
		}
		f.Pending = !all
	}
	items, err := s.deadLetters(r, f)
	if err != nil {
		s.log.Warn("list dead letters", "err", err)
		writeError(w, http.StatusInternalServerError, "cannot read the dead letters")
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"items": items})
}

// deadLetters reads the dead letters f selects, each with its age.
func (s *Server) deadLetters(r *http.Request, f correlator.DeadLetterFilter) ([]deadLetter, error) {
	ds, err := correlator.QueryDeadLetters(r.Context(), s.cfg.Pool, f)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	out := make([]deadLetter, 0, len(ds))
	for _, d := range ds {
		out = append(out, deadLetter{DeadLetter: d, AgeSeconds: now.Sub(d.ParkedAt).Seconds()})
	}
	return out, nil
}
