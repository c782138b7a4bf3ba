package httpapi

import (
	"encoding/json"
	"net/http"

	"github.com/google/uuid"

	"github.com/compensa/compensa/internal/tracing"
	"github.com/compensa/compensa/saga/admin"
)

// startBody is POST /v1/sagas.
type startBody struct {
	Saga           string          `json:"saga"`
	Payload        json.RawMessage `json:"payload"`
	AggregateID    string          `json:"aggregate_id"`
	IdempotencyKey string          `json:"idempotency_key"`
	TenantID       *uuid.UUID      `json:"tenant_id"`
}

// startSaga is POST /v1/sagas: it writes the saga's trigger event to the
// outbox (admin.Start), so the start takes the same path as any other and
// happens once per trigger event; the same idempotency key names the same
// event. A new event answers 202 (the relay starts the instance when it
// streams the event), a key seen before 200 with the instance once started.
func (s *Server) startSaga(w http.ResponseWriter, r *http.Request, a *admin.Admin) {
	if s.cfg.OutboxTable == "" {
		writeError(w, http.StatusNotImplemented, "this relay writes no events: its outbox table has custom columns (--outbox-columns); start the saga by writing its trigger event from your service")
		return
	}
	var b startBody
	if !decodeOne(w, r, &b, "a start request", `{"saga": "…", "payload": {…}} with optional aggregate_id, idempotency_key, tenant_id`) {
		return
	}
	if msg := unstorable(b.Payload, namedText{"saga", b.Saga}, namedText{"aggregate_id", b.AggregateID},
		namedText{"idempotency_key", b.IdempotencyKey}); msg != "" {
		writeError(w, http.StatusBadRequest, msg)
		return
	}
	req := admin.StartRequest{Saga: b.Saga, Payload: b.Payload, AggregateID: b.AggregateID, IdempotencyKey: b.IdempotencyKey}
	if b.TenantID != nil {
		req.TenantID = *b.TenantID
	}
	if c := callerOf(r); c.Tenant.Valid && req.TenantID != uuid.Nil && req.TenantID != c.Tenant.UUID {
		writeError(w, http.StatusForbidden, "token "+c.Name+" is scoped to tenant "+c.Tenant.UUID.String()+": it cannot start a saga for another tenant")
		return
	}
	// The trigger row carries the request's traceparent/tracestate.
	res, err := a.Start(tracing.FromRequest(r), s.cfg.OutboxTable, req)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	status := http.StatusAccepted
	if !res.Created {
		status = http.StatusOK
	}
	writeJSON(w, status, res)
}
