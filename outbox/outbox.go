package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// DefaultTable is the outbox table `relay migrate` creates.
const DefaultTable = "outbox"

// NilTenant is the tenant of an event whose outbox table has no tenant column
// (or whose row left it NULL). Such an event is never an error.
var NilTenant = uuid.Nil

// Message is one outbox row as a producer writes it.
type Message struct {
	// ID identifies the event; a zero ID is replaced by a new random UUID.
	ID            uuid.UUID
	TenantID      uuid.UUID // uuid.Nil writes NULL
	AggregateType string
	AggregateID   string
	EventType     string
	// Payload is the event body. A json.RawMessage or []byte is written as
	// is (it must be valid JSON); anything else is marshalled.
	Payload       any
	Headers       map[string]string
	CorrelationID uuid.UUID // uuid.Nil writes NULL
	CausationID   uuid.UUID // uuid.Nil writes NULL
}

// Write inserts msgs into the default outbox table inside tx, in one round
// trip however many messages there are. It fills in the IDs of messages that
// had none. When ctx carries a valid span (OpenTelemetry), each row's
// headers get its W3C trace context as "traceparent" (and "tracestate"),
// unless the message's Headers already set "traceparent"; the caller's map
// is not modified.
func Write(ctx context.Context, tx pgx.Tx, msgs ...Message) error {
	return WriteTable(ctx, tx, DefaultTable, msgs...)
}

// WriteTable is Write for an outbox table with our default columns under
// another name (schema-qualified allowed).
func WriteTable(ctx context.Context, tx pgx.Tx, table string, msgs ...Message) error {
	if len(msgs) == 0 {
		return nil
	}
	if tx == nil {
		return errors.New("outbox: Write needs the caller's transaction (got nil)")
	}
	ident, err := ParseTableName(table)
	if err != nil {
		return err
	}
	n := len(msgs)
	ids := make([]uuid.UUID, n)
	tenants := make([]*uuid.UUID, n)
	aggTypes := make([]*string, n)
	aggIDs := make([]*string, n)
	types := make([]string, n)
	payloads := make([]string, n)
	headers := make([]string, n)
	corrs := make([]*uuid.UUID, n)
	causes := make([]*uuid.UUID, n)
	for i := range msgs {
		m := &msgs[i]
		if m.EventType == "" {
			return fmt.Errorf("outbox: message %d has no EventType", i)
		}
		if m.ID == uuid.Nil {
			m.ID = uuid.New()
		}
		ids[i] = m.ID
		tenants[i] = nullUUID(m.TenantID)
		aggTypes[i] = nullString(m.AggregateType)
		aggIDs[i] = nullString(m.AggregateID)
		types[i] = m.EventType
		p, err := encodePayload(m.Payload)
		if err != nil {
			return fmt.Errorf("outbox: message %d (%s): %w", i, m.EventType, err)
		}
		payloads[i] = p
		h := []byte("{}")
		if hs := withTraceContext(ctx, m.Headers); len(hs) > 0 {
			if h, err = json.Marshal(hs); err != nil {
				return fmt.Errorf("outbox: message %d headers: %w", i, err)
			}
		}
		headers[i] = string(h)
		corrs[i] = nullUUID(m.CorrelationID)
		causes[i] = nullUUID(m.CausationID)
	}
	// One statement for any number of rows: arrays in, unnest out.
	_, err = tx.Exec(ctx, `INSERT INTO `+ident.Quoted()+` (id, tenant_id, aggregate_type, aggregate_id, event_type, payload, headers, correlation_id, causation_id)
		SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::text[], $5::text[], $6::jsonb[], $7::jsonb[], $8::uuid[], $9::uuid[])`,
		ids, tenants, aggTypes, aggIDs, types, payloads, headers, corrs, causes)
	if err != nil {
		return fmt.Errorf("outbox: insert into %s: %w", ident.Quoted(), err)
	}
	return nil
}

// withTraceContext is h with the trace context of ctx's span added, or h
// itself when ctx has none or h already carries a traceparent.
func withTraceContext(ctx context.Context, h map[string]string) map[string]string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return h
	}
	if _, set := h["traceparent"]; set {
		return h
	}
	tc := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, tc)
	if len(tc) == 0 {
		return h
	}
	out := make(map[string]string, len(h)+len(tc))
	for k, v := range h {
		out[k] = v
	}
	for k, v := range tc {
		if _, set := out[k]; !set {
			out[k] = v
		}
	}
	return out
}

func encodePayload(p any) (string, error) {
	switch v := p.(type) {
	case nil:
		return "{}", nil
	case json.RawMessage:
		if !json.Valid(v) {
			return "", errors.New("payload is not valid JSON")
		}
		return string(v), nil
	case []byte:
		if !json.Valid(v) {
			return "", errors.New("payload is not valid JSON")
		}
		return string(v), nil
	default:
		b, err := json.Marshal(v)
		if err != nil {
			return "", fmt.Errorf("marshal payload: %w", err)
		}
		return string(b), nil
	}
}

func nullUUID(u uuid.UUID) *uuid.UUID {
	if u == uuid.Nil {
		return nil
	}
	return &u
}

func nullString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// Event is one committed outbox row as the relay decoded it from the WAL.
type Event struct {
	// ID is the row's id. A text id that is not a UUID is mapped to a
	// name-based UUID (SHA-1, namespace EventIDNamespace) so that it can key
	// saga_instances.trigger_event_id; RawID keeps the original.
	ID            uuid.UUID
	RawID         string
	TenantID      uuid.UUID // NilTenant when absent
	AggregateType string
	AggregateID   string
	EventType     string
	Payload       json.RawMessage
	// PayloadJSONB reports that Payload is a jsonb value's text as
	// PostgreSQL sent it (and CheckEncodable accepted it): jsonb takes it
	// back as it is, so a writer need not run CheckJSONB on it again.
	PayloadJSONB  bool
	Headers       json.RawMessage
	CorrelationID uuid.NullUUID
	CausationID   uuid.NullUUID
	CreatedAt     time.Time
	// LSN is the commit LSN of the source transaction.
	LSN uint64
	// Xid is the source transaction's id as logical decoding gives it (32
	// bits, no epoch); 0 when unknown (rows read from the initial snapshot,
	// which are long visible).
	Xid uint32
	// Raw is the row as decoded, kept for dead letters: keyed by our field
	// names (see Fields), values as the text PostgreSQL sent (nil for NULL).
	Raw map[string]any
	// Poison, when not empty, says why this row cannot be used (a payload
	// that is not JSON, an id that is missing): the correlator parks it.
	Poison string
	// Unread lists the fields (as named in Fields) whose value the relay
	// could not read: a column gone since start, an unchanged TOAST value
	// the server did not send. A reader must not take them for NULL (a sink
	// cannot tell whether its match selects an event whose event_type is
	// unread).
	Unread []string
	// RawPayload holds, for a row whose payload is not JSON, the payload's
	// bytes as read (a bytea decoded where it could be); Payload is nil
	// then. Sinks still deliver them (a protobuf in a bytea column).
	RawPayload []byte
	// Message says the event came from a logical decoding message
	// (pg_logical_emit_message, see Emit) rather than an outbox row. A
	// Message event that is Poison is refused: it becomes a dead letter and
	// never reaches a sink, since it may come from a transaction that
	// rolled back (a non-transactional message) or hold nothing a sink
	// could deliver.
	Message bool
}

// EventIDNamespace is the namespace of name-based UUIDs made from text ids.
var EventIDNamespace = uuid.MustParse("6f1d3a52-8c0e-4b7a-9a51-3e2f0c6b9d41")

// EventIDFromText maps an outbox id held as text to the event's UUID: the
// UUID itself when the text is one, else a name-based UUID.
func EventIDFromText(s string) uuid.UUID {
	if u, err := uuid.Parse(s); err == nil {
		return u
	}
	return uuid.NewSHA1(EventIDNamespace, []byte(s))
}

// WriteTableOnce writes msg (its ID set) into table unless a row with that
// id is there already, in which case it writes nothing and reports false: a
// caller that chose the id (from an idempotency key, a participant's own
// event id) can send it again safely. A concurrent writer of the same id
// that commits first makes this transaction fail with a unique violation,
// which IsDuplicate recognises.
func WriteTableOnce(ctx context.Context, tx pgx.Tx, table string, msg Message) (bool, error) {
	if msg.ID == uuid.Nil {
		return false, errors.New("outbox: WriteTableOnce needs the message's ID")
	}
	ident, err := ParseTableName(table)
	if err != nil {
		return false, err
	}
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+ident.Quoted()+` WHERE id = $1)`, msg.ID).Scan(&exists); err != nil {
		return false, err
	}
	if exists {
		return false, nil
	}
	return true, WriteTable(ctx, tx, table, msg)
}

// IsDuplicate reports whether err is a unique violation: another writer of
// the same id won.
func IsDuplicate(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505"
}
