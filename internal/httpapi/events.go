package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"

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
	var b eventBody
	if !decodeOne(w, r, &b, "an event", `{"event_type": "…", "payload": {…}} with optional id, tenant_id, aggregate_type, aggregate_id, headers, correlation_id, causation_id`) {
		return
	}
	if strings.TrimSpace(b.EventType) == "" {
		writeError(w, http.StatusBadRequest, "event_type is missing; name the event, e.g. \"payment.charged\"")
		return
	}
	if msg := storable(&b); msg != "" {
		writeError(w, http.StatusBadRequest, msg)
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
	// The request's traceparent/tracestate go into the row's headers
	// (outbox.Write adds them), unless the body's headers set traceparent.
	ctx := tracing.FromRequest(r)
	// A scoped token answers only its own tenant's commands: a reply whose
	// correlation id is another tenant's waiting command is refused here
	// (the correlator would park it as a reply from another tenant).
	if c := callerOf(r); c.Tenant.Valid && msg.CorrelationID != uuid.Nil {
		var foreign bool
		err := s.cfg.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM saga_instances
			WHERE awaiting_correlation_id = $1 AND tenant_id <> $2)`, msg.CorrelationID, c.Tenant.UUID).Scan(&foreign)
		if err != nil {
			s.writeErr(w, r, err)
			return
		}
		if foreign {
			writeError(w, http.StatusForbidden, "token "+c.Name+" is scoped to tenant "+c.Tenant.UUID.String()+
				": correlation_id answers another tenant's command, which it cannot reply to")
			return
		}
	}
	if msg.ID == uuid.Nil {
		// Chosen here, not by outbox.Write, so that the answer can name it.
		msg.ID = uuid.New()
	}
	var created bool
	err := pgx.BeginFunc(ctx, s.cfg.Pool, func(tx pgx.Tx) (err error) {
		created, err = outbox.WriteTableOnce(ctx, tx, s.cfg.OutboxTable, msg)
		return err
	})
	if outbox.IsDuplicate(err) {
		created, err = false, nil // a concurrent post of the same id won
	}
	var pgErr *pgconn.PgError
	if err != nil {
		// The database's own text stays in the log: it may name tables,
		// columns and values a caller has no business seeing.
		s.log.Warn("write posted event", "event_type", b.EventType, "err", err)
		if errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "22") {
			writeError(w, http.StatusBadRequest, "the event was not written: the database refused one of its values (SQLSTATE "+pgErr.Code+"); check the payload, headers and ids")
			return
		}
		writeError(w, http.StatusInternalServerError, "the event was not written: the database failed; see the relay's log and retry")
		return
	}
	status := http.StatusCreated
	if !created {
		status = http.StatusOK
	}
	writeJSON(w, status, map[string]any{"id": msg.ID, "created": created})
}

// storable reports, in words of our own, a value PostgreSQL would refuse: a
// NUL character in a text column, or a payload its jsonb does not accept.
// The empty string means none.
func storable(b *eventBody) string {
	fields := []namedText{{"event_type", b.EventType}, {"aggregate_type", b.AggregateType}, {"aggregate_id", b.AggregateID}}
	for k, v := range b.Headers {
		fields = append(fields, namedText{"a header", k + v})
	}
	return unstorable(b.Payload, fields...)
}

// namedText is a request's text field, by the name its message gives it.
type namedText struct{ name, v string }

// unstorable is storable for any request: its payload and text fields.
func unstorable(payload json.RawMessage, fields ...namedText) string {
	for _, f := range fields {
		if strings.ContainsRune(f.v, 0) {
			return f.name + " holds a NUL character (\\u0000), which PostgreSQL text cannot store; remove it"
		}
		if !utf8.ValidString(f.v) {
			return f.name + " is not valid UTF-8; send text in UTF-8"
		}
	}
	if p := bytes.TrimSpace(payload); len(p) > 0 && !bytes.Equal(p, []byte("null")) {
		if err := outbox.CheckJSONB(p); err != nil {
			return "payload cannot be stored as jsonb: " + err.Error() + "; send JSON without \\u0000 escapes, unpaired surrogates or out-of-range numbers"
		}
	}
	return ""
}

// decodeOne reads a POST body of at most maxEventBody bytes holding exactly
// one JSON object into v, unknown fields refused. On a problem it answers
// (413 for a body too large, 400 otherwise, with what is expected: hint)
// and returns false.
func decodeOne(w http.ResponseWriter, r *http.Request, v any, what, hint string) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxEventBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if tooLarge := new(http.MaxBytesError); errors.As(err, &tooLarge) {
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the body is larger than %d bytes; send a smaller payload (put large data elsewhere and send a reference)", maxEventBody))
			return false
		}
		writeError(w, http.StatusBadRequest, "body is not "+what+": "+strings.TrimPrefix(err.Error(), "json: ")+"; send "+hint)
		return false
	}
	if dec.More() {
		writeError(w, http.StatusBadRequest, "body holds more than one JSON value; send one request at a time")
		return false
	}
	return true
}
