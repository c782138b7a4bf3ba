package httpapi

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/compensa/compensa/internal/tracing"
	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/saga/admin"
)

// eventBody is POST /v1/events: an outbox row's fields.
type eventBody struct {
	ID            *uuid.UUID        `json:"id"`
	TenantID      *uuid.UUID        `json:"tenant_id"`
	AggregateType string            `json:"aggregate_type"`
	AggregateID   string            `json:"aggregate_id"`
	EventType     string            `json:"event_type"`
	Payload       json.RawMessage   `json:"payload"`
	Headers       map[string]string `json:"headers"`
	CorrelationID *uuid.UUID        `json:"correlation_id"`
	CausationID   *uuid.UUID        `json:"causation_id"`
}

// maxEventBody bounds a posted event.
const maxEventBody = 1 << 20

// postEvent is POST /v1/events: it writes the event into the outbox, so a
// participant without database access (one that received a command through
// a webhook) can answer, and the reply reaches the waiting step through the
// stream like any other event. An id already in the outbox is not written
// again (200); a new event answers 201.
func (s *Server) postEvent(w http.ResponseWriter, r *http.Request, _ *admin.Admin) {
	if s.cfg.OutboxTable == "" {
		writeError(w, http.StatusNotImplemented, "this relay writes no events: its outbox table has custom columns (--outbox-columns); write to it from your service")
		return
	}
	dec := json.NewDecoder(io.LimitReader(r.Body, maxEventBody+1))
	dec.DisallowUnknownFields()
	var b eventBody
	if err := dec.Decode(&b); err != nil {
		writeError(w, http.StatusBadRequest, "body is not an event: "+strings.TrimPrefix(err.Error(), "json: ")+
			"; send {\"event_type\": \"…\", \"payload\": {…}} with optional id, tenant_id, aggregate_type, aggregate_id, headers, correlation_id, causation_id")
		return
	}
	if dec.More() {
		writeError(w, http.StatusBadRequest, "body holds more than one JSON value; send one event per request")
		return
	}
	if strings.TrimSpace(b.EventType) == "" {
		writeError(w, http.StatusBadRequest, "event_type is missing; name the event, e.g. \"payment.charged\"")
		return
	}
	msg := outbox.Message{AggregateType: b.AggregateType, AggregateID: b.AggregateID, EventType: b.EventType, Headers: b.Headers}
	if len(b.Payload) > 0 {
		msg.Payload = b.Payload
	}
	for dst, src := range map[*uuid.UUID]*uuid.UUID{&msg.ID: b.ID, &msg.TenantID: b.TenantID, &msg.CorrelationID: b.CorrelationID, &msg.CausationID: b.CausationID} {
		if src != nil {
			*dst = *src
		}
	}
	// A tenant-scoped token writes events of its tenant only: the event's
	// tenant is the token's, and naming another is refused.
	if c := callerOf(r); c.Tenant.Valid {
		if msg.TenantID != uuid.Nil && msg.TenantID != c.Tenant.UUID {
			writeError(w, http.StatusForbidden, "token "+c.Name+" is scoped to tenant "+c.Tenant.UUID.String()+": it cannot write another tenant's events")
			return
		}
		msg.TenantID = c.Tenant.UUID
	}
	idGiven := msg.ID != uuid.Nil
	if !idGiven {
		// Chosen here, not by outbox.Write, so that the answer can name it.
		msg.ID = uuid.New()
	}
	table, err := outbox.ParseTableName(s.cfg.OutboxTable)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "the relay's outbox table name is invalid")
		return
	}
	// The request's traceparent/tracestate go into the row's headers
	// (outbox.Write adds them), unless the body's headers set traceparent.
	ctx := tracing.FromRequest(r)
	created := true
	err = pgx.BeginFunc(ctx, s.cfg.Pool, func(tx pgx.Tx) error {
		if idGiven {
			var exists bool
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+table.Quoted()+` WHERE id = $1)`, msg.ID).Scan(&exists); err != nil {
				return err
			}
			if exists {
				created = false
				return nil
			}
		}
		return outbox.WriteTable(ctx, tx, s.cfg.OutboxTable, msg)
	})
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" {
		created, err = false, nil // a concurrent post of the same id won
	}
	if err != nil {
		s.log.Warn("write posted event", "event_type", b.EventType, "err", err)
		writeError(w, http.StatusBadRequest, "the event was not written: "+strings.TrimPrefix(err.Error(), "outbox: "))
		return
	}
	status := http.StatusCreated
	if !created {
		status = http.StatusOK
	}
	writeJSON(w, status, map[string]any{"id": msg.ID, "created": created})
}
