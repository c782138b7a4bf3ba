package sink

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/compensa/compensa/outbox"
)

// Sink delivers events to one destination.
type Sink interface {
	// Deliver hands evs, in commit order, to the destination and returns one
	// error per event (same length as evs): nil once the destination holds
	// that event durably. Events of one aggregate are sent in order; after
	// one of them fails, the later ones of that aggregate are not sent and
	// get ErrHeldBack. Classify errors with EventError, Gone and RetryAfter;
	// any other error means the destination is unreachable.
	Deliver(ctx context.Context, evs []*Event) []error
	// Close releases connections; in-flight Deliver calls fail.
	Close() error
}

// Event is what a sink sends: an outbox row, as the relay decoded it. It is
// also the webhook body (the JSON envelope) and what relay_sink_parked keeps.
type Event struct {
	// ID is the dedupe id: the outbox row's id as text.
	ID            string          `json:"id"`
	TenantID      string          `json:"tenant_id,omitempty"`
	AggregateType string          `json:"aggregate_type,omitempty"`
	AggregateID   string          `json:"aggregate_id,omitempty"`
	EventType     string          `json:"event_type"`
	Payload       json.RawMessage `json:"payload"`
	Headers       json.RawMessage `json:"headers,omitempty"`
	CorrelationID string          `json:"correlation_id,omitempty"`
	CausationID   string          `json:"causation_id,omitempty"`
	CreatedAt     time.Time       `json:"created_at,omitzero"`
	// Poison, when set, says why the relay could not decode the row (the
	// saga side has it as a dead letter). It is delivered all the same, with
	// what could be read: a field that was not a UUID as its text, a payload
	// or headers that are not JSON in RawPayload and RawHeaders.
	Poison string `json:"poison,omitempty"`
	// RawPayload is a payload that is not JSON, as read (Payload is null
	// then): NATS and Kafka send these bytes as the body; the webhook
	// envelope carries them in base64.
	RawPayload []byte `json:"payload_base64,omitempty"`
	// RawHeaders is a headers value that is not JSON, in the text form
	// PostgreSQL sent (a bytea column's in hex): no header is taken from it.
	RawHeaders []byte `json:"headers_base64,omitempty"`
}

// Body is what NATS and Kafka send as the message body: the payload, or the
// bytes of a payload that is not JSON.
func (e *Event) Body() []byte {
	if e.RawPayload != nil {
		return e.RawPayload
	}
	return e.Payload
}

// FromOutbox converts a decoded outbox row.
func FromOutbox(e *outbox.Event) *Event {
	ev := &Event{
		ID: e.RawID, AggregateType: e.AggregateType, AggregateID: e.AggregateID,
		EventType: e.EventType, Payload: e.Payload, Headers: e.Headers, CreatedAt: e.CreatedAt,
	}
	if ev.ID == "" {
		ev.ID = e.ID.String()
	}
	if e.TenantID != outbox.NilTenant {
		ev.TenantID = e.TenantID.String()
	}
	if e.CorrelationID.Valid {
		ev.CorrelationID = e.CorrelationID.UUID.String()
	}
	if e.CausationID.Valid {
		ev.CausationID = e.CausationID.UUID.String()
	}
	if len(ev.Payload) == 0 {
		ev.Payload = json.RawMessage("null")
	}
	if e.Poison != "" {
		ev.Poison = e.Poison
		ev.RawPayload = e.RawPayload
		// A field that did not decode is sent as the text that was read.
		for name, dst := range map[string]*string{"tenant_id": &ev.TenantID,
			"correlation_id": &ev.CorrelationID, "causation_id": &ev.CausationID} {
			if s, ok := e.Raw[name].(string); ok && *dst == "" && uuid.Validate(s) != nil {
				*dst = s
			}
		}
		if s, ok := e.Raw["headers"].(string); ok && len(e.Headers) == 0 {
			ev.RawHeaders = []byte(s)
		}
	}
	return ev
}

// AggregateKey names the event's aggregate: the unit of order. It is
// valid UTF-8 and at most maxStoredKey bytes (a longer one ends in a hash of
// the whole), so that relay_sink_parked can index it.
func (e *Event) AggregateKey() string {
	return storedKey(strconv.Quote(e.AggregateType) + "/" + strconv.Quote(e.AggregateID))
}

// Envelope is the event as JSON: the webhook body. It cannot fail: a
// payload or headers value that cannot be encoded as JSON as it is (too
// deep, not UTF-8) is sent in base64 (payload_base64, headers_base64) with
// the reason in poison.
func (e *Event) Envelope() []byte {
	return e.AppendEnvelope(nil)
}

// AppendEnvelope appends the Envelope to b.
func (e *Event) AppendEnvelope(b []byte) []byte {
	if b == nil {
		b = make([]byte, 0, 192+len(e.ID)+len(e.TenantID)+len(e.AggregateType)+len(e.AggregateID)+len(e.EventType)+
			len(e.Payload)+len(e.Headers)+len(e.CorrelationID)+len(e.CausationID))
	}
	n := len(b)
	out, ok := e.appendEnvelope(b)
	if !ok {
		m, err := json.Marshal(e)
		if err != nil {
			return append(b[:n], e.poisonEnvelope(err)...)
		}
		out = append(b[:n], m...)
	}
	if utf8.Valid(out[n:]) {
		return out
	}
	return append(out[:n], e.poisonEnvelope(nil)...)
}

// poisonEnvelope is the envelope of an event that cannot be encoded as
// JSON as it is (err nil: not valid UTF-8).
func (e *Event) poisonEnvelope(err error) []byte {
	if err == nil {
		err = errors.New("not valid UTF-8")
	}
	c := *e
	c.Poison = strings.TrimPrefix(c.Poison+"; the event cannot be encoded as JSON as it is ("+err.Error()+"): its payload and headers are sent in base64", "; ")
	if c.RawPayload == nil && string(c.Payload) != "null" {
		c.RawPayload = c.Payload
	}
	if c.RawHeaders == nil && len(c.Headers) > 0 {
		c.RawHeaders = c.Headers
	}
	c.Payload, c.Headers = json.RawMessage("null"), nil
	for _, f := range []*string{&c.ID, &c.TenantID, &c.AggregateType, &c.AggregateID, &c.EventType, &c.CorrelationID, &c.CausationID, &c.Poison} {
		*f = strings.ToValidUTF8(*f, "\uFFFD")
	}
	if b, err := json.Marshal(&c); err == nil {
		return b
	}
	c.CreatedAt = time.Time{}
	b, _ := json.Marshal(&c)
	return b
}

// appendEnvelope appends the envelope to b exactly as json.Marshal writes
// it, for the common event: text fields of plain printable ASCII, no
// poison, a payload and headers that compact to JSON without characters
// json.Marshal escapes. ok false: encode it with json.Marshal.
func (e *Event) appendEnvelope(b []byte) (_ []byte, ok bool) {
	if e.Poison != "" || e.RawPayload != nil || e.RawHeaders != nil {
		return b, false
	}
	field := func(name, v string, omitEmpty bool) {
		if !ok || (omitEmpty && v == "") {
			return
		}
		b = append(b, name...)
		b, ok = appendPlainString(b, v)
	}
	ok = true
	b = append(b, '{')
	field(`"id":`, e.ID, false)
	field(`,"tenant_id":`, e.TenantID, true)
	field(`,"aggregate_type":`, e.AggregateType, true)
	field(`,"aggregate_id":`, e.AggregateID, true)
	field(`,"event_type":`, e.EventType, false)
	if !ok {
		return b, false
	}
	b = append(b, `,"payload":`...)
	if e.Payload == nil {
		b = append(b, "null"...)
	} else if b, ok = appendCompactJSON(b, e.Payload); !ok {
		return b, false
	}
	if len(e.Headers) > 0 {
		b = append(b, `,"headers":`...)
		if b, ok = appendCompactJSON(b, e.Headers); !ok {
			return b, false
		}
	}
	field(`,"correlation_id":`, e.CorrelationID, true)
	field(`,"causation_id":`, e.CausationID, true)
	if !ok {
		return b, false
	}
	if !e.CreatedAt.IsZero() {
		b = append(b, `,"created_at":"`...)
		var err error
		if b, err = e.CreatedAt.AppendText(b); err != nil {
			return b, false
		}
		b = append(b, '"')
	}
	return append(b, '}'), true
}

// appendPlainString appends s as a JSON string if it is printable ASCII
// that json.Marshal writes as it is (no quote, backslash, <, > or &).
func appendPlainString(b []byte, s string) ([]byte, bool) {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return b, false
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"'), true
}

// appendCompactJSON appends raw compacted, as json.Marshal writes a
// json.RawMessage, unless raw is not JSON or holds a character json.Marshal
// would escape (<, >, &, U+2028, U+2029).
func appendCompactJSON(b []byte, raw []byte) ([]byte, bool) {
	for _, c := range raw {
		if c == '<' || c == '>' || c == '&' || c == 0xe2 {
			return b, false
		}
	}
	buf := bytes.NewBuffer(b)
	if json.Compact(buf, raw) != nil {
		return b, false
	}
	return buf.Bytes(), true
}

// Header is one message header.
type Header struct{ Key, Value string }

// MessageHeaders are the headers every sink sends: the row's fields (empty
// ones left out), "poison" with the reason for a row the relay could not
// decode, and each key of the row's headers object (a value that is
// not a string is sent as its JSON text). A key that names a reserved
// header (ReservedHeader: the row's fields, framing, hop-by-hop and
// forwarding headers, in any case and with '-' or '_') is never taken from
// the row, so a producer cannot forge event_type or tenant_id.
func (e *Event) MessageHeaders() []Header {
	out := make([]Header, 0, 8)
	add := func(k, v string) {
		if v != "" {
			out = append(out, Header{k, v})
		}
	}
	add("event_type", e.EventType)
	add("aggregate_type", e.AggregateType)
	add("aggregate_id", e.AggregateID)
	add("tenant_id", e.TenantID)
	add("correlation_id", e.CorrelationID)
	add("causation_id", e.CausationID)
	add("poison", e.Poison)
	return e.rowHeaders(out, false)
}

// rowHeaders appends each key of the row's headers object that is not
// reserved (see MessageHeaders) to out, in key order. With cloudEvents, a
// key that starts with ce- or ce_ is left out too: it would pose as a
// CloudEvents attribute to a consumer of the binary content mode.
func (e *Event) rowHeaders(out []Header, cloudEvents bool) []Header {
	var hs map[string]json.RawMessage
	if len(e.Headers) > 0 && !emptyObject(e.Headers) && json.Unmarshal(e.Headers, &hs) == nil {
		keys := make([]string, 0, len(hs))
		for k := range hs {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			if k == "" || ReservedHeader(k) || (cloudEvents && strings.HasPrefix(normalHeader(k), "ce-")) {
				continue
			}
			v := hs[k]
			var s string
			if json.Unmarshal(v, &s) != nil {
				s = string(v)
			}
			out = append(out, Header{k, s})
		}
	}
	return out
}

// emptyObject reports whether b is the JSON text {} (spaces allowed), a row's
// usual headers: it has no key to send.
func emptyObject(b []byte) bool {
	b = bytes.TrimSpace(b)
	return len(b) >= 2 && b[0] == '{' && len(bytes.TrimSpace(b[1:len(b)-1])) == 0 && b[len(b)-1] == '}'
}

// ErrHeldBack is the result of an event not sent because an earlier event
// of its aggregate failed.
var ErrHeldBack = errors.New("held back behind an earlier event of its aggregate that was not delivered")

// errorKind says what a delivery error means for the sink.
type errorKind int

const (
	kindDown      errorKind = iota // destination unreachable: park and probe
	kindEvent                      // this event refused (too large, 4xx): park it, sink stays up
	kindGone                       // 410: disable the sink
	kindThrottled                  // 429 / Retry-After: slow down
)

type classified struct {
	kind  errorKind
	after time.Duration
	err   error
}

func (c *classified) Error() string { return c.err.Error() }
func (c *classified) Unwrap() error { return c.err }

// EventError marks err as a refusal of this event only (too large, rejected
// by the destination): it is parked with the reason and the sink stays up.
func EventError(err error) error { return &classified{kind: kindEvent, err: err} }

// Gone marks err as the destination saying it wants no more deliveries
// (HTTP 410): the sink is disabled until `relay sinks retry`.
func Gone(err error) error { return &classified{kind: kindGone, err: err} }

// RetryAfter marks err as the destination asking to slow down for d.
func RetryAfter(d time.Duration, err error) error {
	return &classified{kind: kindThrottled, after: d, err: err}
}

func kindOf(err error) (errorKind, time.Duration) {
	if errors.Is(err, ErrHeldBack) {
		return kindEvent, 0
	}
	var c *classified
	if errors.As(err, &c) {
		return c.kind, c.after
	}
	return kindDown, 0
}

// HoldBack fills the results of evs: once an event of an aggregate failed,
// every later event of that aggregate that send was not called for gets
// ErrHeldBack. send is called in order for the others; it is the helper for
// sinks that deliver one event at a time.
func HoldBack(evs []*Event, send func(i int, ev *Event) error) []error {
	errs := make([]error, len(evs))
	failed := map[string]bool{}
	for i, ev := range evs {
		k := ev.AggregateKey()
		if failed[k] {
			errs[i] = ErrHeldBack
			continue
		}
		if errs[i] = send(i, ev); errs[i] != nil {
			failed[k] = true
		}
	}
	return errs
}

// Errorf is fmt.Errorf with the package's prefix.
func errorf(format string, args ...any) error { return fmt.Errorf("sink: "+format, args...) }

// Classify names what err means for a sink: "down", "event", "gone" or
// "throttled" (for logs and tests).
func Classify(err error) string {
	k, _ := kindOf(err)
	return [...]string{"down", "event", "gone", "throttled"}[k]
}
