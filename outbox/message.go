package outbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// DefaultMessagePrefix is the prefix of the logical decoding messages the
// relay takes for outbox events unless told another (`relay run
// --message-prefix`).
const DefaultMessagePrefix = "outbox"

// Emit writes msgs as transactional logical decoding messages
// (pg_logical_emit_message(true, "outbox", content)) inside tx, in one round
// trip. Nothing is stored in a table: the message lives in the WAL only, is
// decoded by the relay at the transaction's commit, in order with the
// transaction's outbox rows, and vanishes if the transaction rolls back. The
// relay handles it exactly like an outbox row with the same fields.
//
// Like Write, Emit fills in the IDs of messages that had none and adds the
// W3C trace context of ctx's span to each message's headers. A message
// cannot be read again once the relay's slot has passed it: `relay sinks
// replay` and a resync re-read outbox rows only.
//
// It needs PostgreSQL 14 or later and a relay whose --message-prefix is
// "outbox" (the default); EmitPrefix takes another prefix.
func Emit(ctx context.Context, tx pgx.Tx, msgs ...Message) error {
	return EmitPrefix(ctx, tx, DefaultMessagePrefix, msgs...)
}

// EmitPrefix is Emit with the message prefix given.
func EmitPrefix(ctx context.Context, tx pgx.Tx, prefix string, msgs ...Message) error {
	if len(msgs) == 0 {
		return nil
	}
	if tx == nil {
		return errors.New("outbox: Emit needs the caller's transaction (got nil)")
	}
	if prefix == "" {
		return errors.New("outbox: Emit needs a message prefix (the relay's --message-prefix)")
	}
	contents := make([]string, len(msgs))
	for i := range msgs {
		m := &msgs[i]
		if m.EventType == "" {
			return fmt.Errorf("outbox: message %d has no EventType", i)
		}
		if m.ID == uuid.Nil {
			m.ID = uuid.New()
		}
		c, err := encodeContent(ctx, m)
		if err != nil {
			return fmt.Errorf("outbox: message %d (%s): %w", i, m.EventType, err)
		}
		contents[i] = c
	}
	// unnest yields the contents in array order, and each row's message
	// is emitted as the row is produced: the WAL holds them in msgs' order.
	_, err := tx.Exec(ctx, `SELECT pg_logical_emit_message(true, $1::text, c) FROM unnest($2::text[]) AS c`, prefix, contents)
	if err != nil {
		return fmt.Errorf("outbox: pg_logical_emit_message: %w", err)
	}
	return nil
}

// MessageContent is the JSON object a logical decoding message carries:
// the outbox row's fields under their column names. Every field but
// event_type may be left out; payload and headers default to {}.
type MessageContent struct {
	ID            json.RawMessage `json:"id,omitempty"`
	TenantID      *string         `json:"tenant_id,omitempty"`
	AggregateType *string         `json:"aggregate_type,omitempty"`
	AggregateID   json.RawMessage `json:"aggregate_id,omitempty"`
	EventType     *string         `json:"event_type,omitempty"`
	Payload       json.RawMessage `json:"payload,omitempty"`
	Headers       json.RawMessage `json:"headers,omitempty"`
	CorrelationID *string         `json:"correlation_id,omitempty"`
	CausationID   *string         `json:"causation_id,omitempty"`
}

// encodeContent is m's message content.
func encodeContent(ctx context.Context, m *Message) (string, error) {
	p, err := encodePayload(m.Payload)
	if err != nil {
		return "", err
	}
	c := MessageContent{
		ID:        json.RawMessage(strconv.Quote(m.ID.String())),
		EventType: &m.EventType,
		Payload:   json.RawMessage(p),
	}
	if hs := withTraceContext(ctx, m.Headers); len(hs) > 0 {
		if c.Headers, err = json.Marshal(hs); err != nil {
			return "", fmt.Errorf("headers: %w", err)
		}
	}
	str := func(s string) *string {
		if s == "" {
			return nil
		}
		return &s
	}
	id := func(u uuid.UUID) *string {
		if u == uuid.Nil {
			return nil
		}
		s := u.String()
		return &s
	}
	c.TenantID, c.CorrelationID, c.CausationID = id(m.TenantID), id(m.CorrelationID), id(m.CausationID)
	c.AggregateType = str(m.AggregateType)
	if m.AggregateID != "" {
		c.AggregateID, _ = json.Marshal(m.AggregateID)
	}
	b, err := json.Marshal(c)
	return string(b), err
}

// EventFromMessage decodes a message's content into an Event. Content that
// cannot be used (not a JSON object, no event_type, a tenant_id that is not
// a UUID, ...) gives an Event with Poison set, never an error; Raw is left
// to the caller, which knows where the message came from. ID is zero when
// the content has no id: the caller derives one from the message's
// position. id and aggregate_id may be JSON strings or numbers.
func EventFromMessage(content []byte) Event {
	ev := Event{TenantID: NilTenant}
	var bad []string
	if !utf8.Valid(content) {
		ev.Poison = "the message's content is not valid UTF-8"
		return ev
	}
	trimmed := bytes.TrimSpace(content)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		ev.Poison = "the message's content is not a JSON object"
		if !json.Valid(trimmed) {
			ev.Poison = "the message's content is not JSON"
		}
		return ev
	}
	var c MessageContent
	if err := json.Unmarshal(trimmed, &c); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			// JSON, with a field of the wrong kind: say which.
			ev.Poison = fmt.Sprintf("the message's %s is a JSON %s, want a string", te.Field, te.Value)
		} else {
			ev.Poison = "the message's content is not JSON: " + err.Error()
		}
		if json.Valid(trimmed) {
			// What could be read still names the event for its dead letter.
			var loose map[string]any
			if json.Unmarshal(trimmed, &loose) == nil {
				if s, ok := loose["event_type"].(string); ok {
					ev.EventType = s
				}
			}
		}
		return ev
	}
	scalar := func(name string, raw json.RawMessage) (string, bool) {
		if len(raw) == 0 || string(raw) == "null" {
			return "", false
		}
		var s string
		if json.Unmarshal(raw, &s) == nil {
			return s, true
		}
		var n json.Number
		if json.Unmarshal(raw, &n) == nil {
			return n.String(), true
		}
		bad = append(bad, name+" is neither a string nor a number")
		return "", false
	}
	if s, ok := scalar("id", c.ID); ok && s != "" {
		ev.RawID = s
		ev.ID = EventIDFromText(s)
	}
	ev.AggregateID, _ = scalar("aggregate_id", c.AggregateID)
	if c.AggregateType != nil {
		ev.AggregateType = *c.AggregateType
	}
	if c.EventType != nil {
		ev.EventType = *c.EventType
	}
	if ev.EventType == "" {
		bad = append(bad, "the message has no event_type")
	}
	for _, x := range []struct {
		name string
		src  *string
		set  func(uuid.UUID)
	}{
		{"tenant_id", c.TenantID, func(u uuid.UUID) { ev.TenantID = u }},
		{"correlation_id", c.CorrelationID, func(u uuid.UUID) { ev.CorrelationID = uuid.NullUUID{UUID: u, Valid: true} }},
		{"causation_id", c.CausationID, func(u uuid.UUID) { ev.CausationID = uuid.NullUUID{UUID: u, Valid: true} }},
	} {
		if x.src == nil || *x.src == "" {
			continue
		}
		u, err := uuid.Parse(*x.src)
		if err != nil {
			bad = append(bad, x.name+" "+strconv.Quote(clipText(*x.src))+" is not a UUID")
			continue
		}
		x.set(u)
	}
	ev.Payload = json.RawMessage("{}")
	if len(c.Payload) > 0 && string(c.Payload) != "null" {
		ev.Payload = c.Payload
	}
	if err := CheckEncodable(ev.Payload); err != nil {
		bad = append(bad, "payload "+err.Error())
	}
	if len(c.Headers) > 0 && string(c.Headers) != "null" {
		if c.Headers[0] != '{' {
			bad = append(bad, "headers is not a JSON object")
		} else {
			ev.Headers = c.Headers
		}
	}
	if len(bad) > 0 {
		ev.Poison = strings.Join(bad, "; ")
	}
	return ev
}

func clipText(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
