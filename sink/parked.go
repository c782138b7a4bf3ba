package sink

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/compensa/compensa/outbox"
)

// parkedEvent is how relay_sink_parked.event holds an Event. jsonb refuses
// some JSON that every consumer accepts (a \u0000 escape, a lone surrogate,
// a number beyond numeric's range) and Go's encoder refuses JSON nested
// deeper than outbox.MaxJSONDepth, while a row may hold either, text that is
// not UTF-8 (a SQL_ASCII database) or hundreds of megabytes. Were such an
// event parked as JSON, the batch's transaction would fail and the stream
// would stall on it. So an event that jsonb may not hold as it is goes to
// relay_sink_parked.event_raw (bytea, see parkedBytes) whole, and event
// keeps a readable summary of it (InRaw set, payload null).
//
// PayloadBase64 and HeadersBase64 are how rows parked before event_raw
// existed kept such a payload or headers value; they are still read.
type parkedEvent struct {
	*Event
	Payload       json.RawMessage `json:"payload"`
	Headers       json.RawMessage `json:"headers,omitempty"`
	PayloadBase64 []byte          `json:"payload_jsonb_unsafe,omitempty"`
	HeadersBase64 []byte          `json:"headers_jsonb_unsafe,omitempty"`
	// InRaw says that the event is in event_raw and this is its summary.
	InRaw bool `json:"in_event_raw,omitempty"`
}

// parkedBytes is an Event as relay_sink_parked.event_raw holds it: JSON in
// which every value is bytes (base64), so that it keeps each byte of the
// row and cannot fail to encode.
type parkedBytes struct {
	ID            []byte `json:"id"`
	TenantID      []byte `json:"tenant_id,omitempty"`
	AggregateType []byte `json:"aggregate_type,omitempty"`
	AggregateID   []byte `json:"aggregate_id,omitempty"`
	EventType     []byte `json:"event_type,omitempty"`
	Payload       []byte `json:"payload,omitempty"`
	Headers       []byte `json:"headers,omitempty"`
	CorrelationID []byte `json:"correlation_id,omitempty"`
	CausationID   []byte `json:"causation_id,omitempty"`
	CreatedAt     string `json:"created_at,omitempty"`
	Poison        []byte `json:"poison,omitempty"`
	// Not omitted when empty: an empty payload read from a bytea column is
	// sent as an empty body, a missing one as the payload.
	RawPayload []byte `json:"payload_base64"`
	RawHeaders []byte `json:"headers_base64"`
}

// maxParkedJSONB bounds the payload and headers parked as JSON in event:
// jsonb holds at most 256 MB in one value. Larger events go to event_raw.
const maxParkedJSONB = 64 << 20

// maxParkedDepth is the nesting past which a payload is parked as bytes:
// jsonb's parser is bounded by the server's stack (max_stack_depth), and
// the envelope adds a level to what the outbox row held.
const maxParkedDepth = 1000

// maxSummaryText bounds each text of the readable summary of an event in
// event_raw.
const maxSummaryText = 4096

// encodeParked returns the event column's JSON and, for an event that jsonb
// may not hold as it is, the event_raw bytes (nil otherwise). It cannot
// fail: parking must never fail on what a row holds.
func encodeParked(ev *Event) (string, []byte) {
	if !needsRaw(ev) {
		if b, err := json.Marshal(parkedEvent{Event: ev, Payload: ev.Payload, Headers: ev.Headers}); err == nil {
			return string(b), nil
		}
	}
	pb := parkedBytes{
		ID: []byte(ev.ID), TenantID: []byte(ev.TenantID), AggregateType: []byte(ev.AggregateType),
		AggregateID: []byte(ev.AggregateID), EventType: []byte(ev.EventType), Payload: ev.Payload, Headers: ev.Headers,
		CorrelationID: []byte(ev.CorrelationID), CausationID: []byte(ev.CausationID), Poison: []byte(ev.Poison),
		RawPayload: ev.RawPayload, RawHeaders: ev.RawHeaders,
	}
	if !ev.CreatedAt.IsZero() {
		pb.CreatedAt = ev.CreatedAt.Format(time.RFC3339Nano)
	}
	raw, _ := json.Marshal(pb) // only bytes and a string: cannot fail
	sum := Event{CreatedAt: ev.CreatedAt, Payload: json.RawMessage("null")}
	for _, f := range []struct{ dst, src *string }{{&sum.ID, &ev.ID}, {&sum.TenantID, &ev.TenantID},
		{&sum.AggregateType, &ev.AggregateType}, {&sum.AggregateID, &ev.AggregateID}, {&sum.EventType, &ev.EventType},
		{&sum.CorrelationID, &ev.CorrelationID}, {&sum.CausationID, &ev.CausationID}, {&sum.Poison, &ev.Poison}} {
		*f.dst = summaryText(*f.src)
	}
	b, err := json.Marshal(parkedEvent{Event: &sum, Payload: sum.Payload, InRaw: true})
	if err != nil {
		b, _ = json.Marshal(map[string]any{"id": sum.ID, "event_type": sum.EventType, "in_event_raw": true})
	}
	return string(b), raw
}

// needsRaw reports whether jsonb may refuse, or Go's encoder fail on, the
// event as JSON.
func needsRaw(ev *Event) bool {
	for _, s := range []string{ev.ID, ev.TenantID, ev.AggregateType, ev.AggregateID, ev.EventType, ev.CorrelationID, ev.CausationID, ev.Poison} {
		if !utf8.ValidString(s) || strings.IndexByte(s, 0) >= 0 {
			return true
		}
	}
	if len(ev.Payload)+len(ev.Headers)+len(ev.RawPayload)+len(ev.RawHeaders) > maxParkedJSONB {
		return true
	}
	if ev.RawPayload != nil && len(ev.RawPayload) == 0 || ev.RawHeaders != nil && len(ev.RawHeaders) == 0 {
		return true // the envelope's JSON drops an empty value
	}
	return jsonbUnsafe(ev.Payload) || jsonbUnsafe(ev.Headers)
}

// decodeParked reads a parked event from its event column and, when set,
// its event_raw column.
func decodeParked(body, raw []byte) (*Event, error) {
	if raw != nil {
		var pb parkedBytes
		if err := json.Unmarshal(raw, &pb); err != nil {
			return nil, err
		}
		ev := &Event{
			ID: string(pb.ID), TenantID: string(pb.TenantID), AggregateType: string(pb.AggregateType),
			AggregateID: string(pb.AggregateID), EventType: string(pb.EventType), Payload: pb.Payload, Headers: pb.Headers,
			CorrelationID: string(pb.CorrelationID), CausationID: string(pb.CausationID), Poison: string(pb.Poison),
			RawPayload: pb.RawPayload, RawHeaders: pb.RawHeaders,
		}
		if pb.CreatedAt != "" {
			ev.CreatedAt, _ = time.Parse(time.RFC3339Nano, pb.CreatedAt)
		}
		return ev, nil
	}
	p := parkedEvent{Event: new(Event)}
	if err := json.Unmarshal(body, &p); err != nil {
		return nil, err
	}
	ev := p.Event
	ev.Payload, ev.Headers = p.Payload, p.Headers
	if p.PayloadBase64 != nil {
		ev.Payload = p.PayloadBase64
	}
	if p.HeadersBase64 != nil {
		ev.Headers = p.HeadersBase64
	}
	return ev, nil
}

// summaryText is s made fit for the readable summary: valid UTF-8, no NUL,
// at most maxSummaryText bytes.
func summaryText(s string) string {
	s = cleanText(s)
	if len(s) > maxSummaryText {
		cut := maxSummaryText
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "…"
	}
	return s
}

// cleanText makes s storable as text: invalid UTF-8 replaced, NUL removed.
// Reasons go through it: an error may quote what a row held.
func cleanText(s string) string {
	if utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 {
		return s
	}
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "")
}

// maxStoredKey bounds relay_sink_parked's event_id and aggregate_key: both
// are in btree indexes, whose entries must stay under about 2.7 kB.
const maxStoredKey = 1000

// storedKey returns s when it can key relay_sink_parked as it is (valid
// UTF-8, no NUL, at most maxStoredKey bytes), else s cleaned and clipped,
// ending in "…" and a hash of the whole, so that distinct values stay
// distinct.
func storedKey(s string) string {
	if len(s) <= maxStoredKey && utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 {
		return s
	}
	sum := sha256.Sum256([]byte(s))
	c := cleanText(s)
	cut := min(len(c), maxStoredKey-40)
	for cut > 0 && cut < len(c) && !utf8.RuneStart(c[cut]) {
		cut--
	}
	return c[:cut] + "…" + hex.EncodeToString(sum[:16])
}

// jsonbUnsafe reports whether jsonb may refuse the JSON text b, or Go's
// encoder fail on it: not UTF-8, not JSON to Go, nested deeper than
// maxParkedDepth, or holding what jsonb refuses. It errs on the side of yes
// (any surrogate escape, any exponent beyond ±1000, any number of more than
// 1000 characters): a false yes only costs the parked row a readable
// payload.
func jsonbUnsafe(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	if !utf8.Valid(b) || outbox.JSONDepth(b) > maxParkedDepth || !json.Valid(b) || bytes.IndexByte(b, 0) >= 0 {
		return true
	}
	inString := false
	for i := 0; i < len(b); i++ {
		c := b[i]
		if inString {
			switch c {
			case '"':
				inString = false
			case '\\':
				if i+5 < len(b) && b[i+1] == 'u' {
					if h := b[i+2 : i+6]; string(h) == "0000" || (h[0] == 'd' || h[0] == 'D') && (h[1] >= '8' || h[1] >= 'A' && h[1] <= 'F' || h[1] >= 'a' && h[1] <= 'f') {
						return true
					}
					i += 5
				} else {
					i++
				}
			}
			continue
		}
		switch {
		case c == '"':
			inString = true
		case c == '-' || c >= '0' && c <= '9':
			j := i
			for j < len(b) && (b[j] == '-' || b[j] == '+' || b[j] == '.' || b[j] == 'e' || b[j] == 'E' || b[j] >= '0' && b[j] <= '9') {
				j++
			}
			num := b[i:j]
			if len(num) > 1000 {
				return true
			}
			for k, x := range num {
				if x == 'e' || x == 'E' {
					if e, err := strconv.Atoi(string(num[k+1:])); err != nil || e > 1000 || e < -1000 {
						return true
					}
				}
			}
			i = j - 1
		}
	}
	return false
}
