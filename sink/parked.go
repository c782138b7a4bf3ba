package sink

import (
	"encoding/json"
	"strconv"
)

// parkedEvent is how relay_sink_parked.event holds an Event. jsonb refuses
// some JSON that every consumer accepts (a \u0000 escape, a lone surrogate,
// a number beyond numeric's range): were such a payload parked as it is,
// the batch's transaction would fail and the stream would stall on it. A
// payload or headers value that may hold one is kept in base64 instead and
// restored on reading.
type parkedEvent struct {
	*Event
	Payload       json.RawMessage `json:"payload"`
	Headers       json.RawMessage `json:"headers,omitempty"`
	PayloadBase64 []byte          `json:"payload_jsonb_unsafe,omitempty"`
	HeadersBase64 []byte          `json:"headers_jsonb_unsafe,omitempty"`
}

func encodeParked(ev *Event) ([]byte, error) {
	p := parkedEvent{Event: ev, Payload: ev.Payload, Headers: ev.Headers}
	if jsonbUnsafe(p.Payload) {
		p.Payload, p.PayloadBase64 = json.RawMessage("null"), ev.Payload
	}
	if jsonbUnsafe(p.Headers) {
		p.Headers, p.HeadersBase64 = nil, ev.Headers
	}
	return json.Marshal(p)
}

func decodeParked(body []byte) (*Event, error) {
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

// jsonbUnsafe reports whether jsonb may refuse the JSON text b. It errs on
// the side of yes (any surrogate escape, any exponent beyond ±1000, any
// number of more than 1000 characters): a false yes only costs the parked
// row a readable payload.
func jsonbUnsafe(b []byte) bool {
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
