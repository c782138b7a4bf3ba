package sink

import (
	"encoding/json"
	"strings"
	"time"
	"unicode/utf8"
)

// CloudEvents 1.0 (https://github.com/cloudevents/spec): how an event maps
// to one, for every sink whose format is cloudevents (binary content mode)
// or cloudevents-structured.
//
//	id              the outbox row's id (the dedupe id: the same on every replay)
//	source          the sink's source (default DefaultSource)
//	specversion     1.0
//	type            event_type ("compensa.unreadable" when a poison row's could not be read)
//	subject         aggregate_id (omitted when empty)
//	time            created_at, RFC 3339 (omitted when unknown)
//	datacontenttype application/json; application/octet-stream for a poison
//	                payload that is not JSON (RawPayload)
//	data            the payload (or the transform's result)
//	extensions      tenantid, aggregatetype, correlationid, causationid,
//	                traceparent, tracestate (from the row's headers), poison
//	                (why the row could not be decoded); each omitted when empty
//
// A poison payload that is not JSON is data as it was read: the body in
// binary mode, data_base64 in structured mode. Attribute values are
// CloudEvents strings: invalid UTF-8 is replaced and control characters are
// dropped. The row's other headers travel as message headers beside the
// attributes (never one that starts with ce- or ce_, which would pose as
// an attribute), as in the envelope format.

// CloudEvents media types.
const (
	ContentTypeJSON        = "application/json"
	ContentTypeOctetStream = "application/octet-stream"
	ContentTypeCloudEvents = "application/cloudevents+json"
	// unreadableType is the type of a poison event whose event_type could
	// not be read (a CloudEvent's type may not be empty).
	unreadableType = "compensa.unreadable"
)

// CloudEvent is an event as CloudEvents context attributes and data.
type CloudEvent struct {
	// Attrs are the context attributes, lower-case names, in a fixed order
	// (specversion first), datacontenttype included, empty ones left out.
	Attrs []Header
	// Data is the data as sent in binary mode.
	Data []byte
	// Binary: Data is not JSON (structured mode writes data_base64).
	Binary bool
}

// CloudEvent maps ev (see the table above) with the given source.
func (e *Event) CloudEvent(source string) CloudEvent {
	c := CloudEvent{Attrs: make([]Header, 0, 14)}
	add := func(k, v string) {
		if v = ceString(v); v != "" {
			c.Attrs = append(c.Attrs, Header{k, v})
		}
	}
	add("specversion", "1.0")
	add("id", e.ID)
	add("source", source)
	add("type", cmpOr(ceString(e.EventType), unreadableType))
	add("subject", e.AggregateID)
	if !e.CreatedAt.IsZero() {
		add("time", e.CreatedAt.UTC().Format(time.RFC3339Nano))
	}
	switch {
	case e.RawPayload != nil:
		c.Data, c.Binary = e.RawPayload, true
	case len(e.Payload) == 0:
		c.Data = []byte("null")
	case !json.Valid(e.Payload) || !utf8.Valid(e.Payload):
		// Cannot be carried as JSON as it is (see poisonEnvelope).
		c.Data, c.Binary = e.Payload, true
	default:
		c.Data = e.Payload
	}
	if c.Binary {
		add("datacontenttype", ContentTypeOctetStream)
	} else {
		add("datacontenttype", ContentTypeJSON)
	}
	add("tenantid", e.TenantID)
	add("aggregatetype", e.AggregateType)
	add("correlationid", e.CorrelationID)
	add("causationid", e.CausationID)
	if len(e.Headers) > 0 && !emptyObject(e.Headers) {
		var hs map[string]json.RawMessage
		if json.Unmarshal(e.Headers, &hs) == nil {
			for _, k := range []string{"traceparent", "tracestate"} {
				var s string
				if json.Unmarshal(hs[k], &s) == nil {
					add(k, s)
				}
			}
		}
	}
	add("poison", e.Poison)
	return c
}

// Attr returns the value of attribute name ("" when absent).
func (c CloudEvent) Attr(name string) string {
	for _, a := range c.Attrs {
		if a.Key == name {
			return a.Value
		}
	}
	return ""
}

// Structured is the event as an application/cloudevents+json document.
func (c CloudEvent) Structured() []byte {
	b := make([]byte, 0, 256+len(c.Data)*4/3)
	b = append(b, '{')
	for i, a := range c.Attrs {
		if i > 0 {
			b = append(b, ',')
		}
		k, _ := json.Marshal(a.Key)
		v, _ := json.Marshal(a.Value)
		b = append(append(append(b, k...), ':'), v...)
	}
	if c.Binary {
		d, _ := json.Marshal(c.Data) // []byte marshals as base64
		b = append(append(b, `,"data_base64":`...), d...)
	} else {
		b = append(append(b, `,"data":`...), c.Data...)
	}
	return append(b, '}')
}

// BinaryHeaders are the attributes as headers of a binding's binary
// content mode: datacontenttype as contentType, every other attribute as
// prefix+name (HTTP and NATS "ce-", Kafka "ce_"); encode rewrites each
// value (HTTP's percent-encoding), nil: as they are.
func (c CloudEvent) BinaryHeaders(prefix, contentType string, encode func(string) string) []Header {
	out := make([]Header, 0, len(c.Attrs))
	for _, a := range c.Attrs {
		k, v := prefix+a.Key, a.Value
		if a.Key == "datacontenttype" {
			k = contentType
		}
		if encode != nil {
			v = encode(v)
		}
		out = append(out, Header{k, v})
	}
	return out
}

// PercentEncode encodes an attribute value for an HTTP header (the HTTP
// binding, 3.1.3.2): space, '"', '%' and everything outside printable
// ASCII as %XX of its UTF-8 bytes.
func PercentEncode(v string) string {
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c > ' ' && c < 0x7f && c != '"' && c != '%' {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&15])
	}
	return b.String()
}

// ceString makes v a CloudEvents String: valid UTF-8 without control
// characters (U+0000-U+001F, U+007F-U+009F).
func ceString(v string) string {
	v = strings.ToValidUTF8(v, "\uFFFD")
	return strings.Map(func(r rune) rune {
		if r < 0x20 || (r >= 0x7f && r <= 0x9f) {
			return -1
		}
		return r
	}, v)
}

// Encoded is an event as one broker message: its body and headers.
type Encoded struct {
	Body    []byte
	Headers []Header
}

// Encode encodes ev for a message broker in format: the envelope format
// is the payload as the body and MessageHeaders; a cloudevents format is
// as described above, its attribute headers starting with prefix and
// datacontenttype sent as contentType (binary mode), or the structured
// document with contentType application/cloudevents+json.
func (e *Event) Encode(format, source, prefix, contentType string, encode func(string) string) Encoded {
	switch format {
	case FormatCloudEvents:
		c := e.CloudEvent(source)
		return Encoded{Body: c.Data, Headers: append(c.BinaryHeaders(prefix, contentType, encode), e.rowHeaders(nil, true)...)}
	case FormatCloudEventsStructured:
		c := e.CloudEvent(source)
		return Encoded{Body: c.Structured(), Headers: append([]Header{{contentType, ContentTypeCloudEvents}}, e.rowHeaders(nil, true)...)}
	}
	return Encoded{Body: e.Body(), Headers: e.MessageHeaders()}
}
