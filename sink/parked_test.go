package sink

import (
	"bytes"
	"encoding/json"
	"testing"
)

func TestParkedFormKeepsWhatJSONBRefuses(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		json   string
		unsafe bool
	}{
		{`{"a":1,"b":[true,false,null],"c":"x"}`, false},
		{`{"path":"C:\\u0000"}`, false}, // an escaped backslash, then text
		{`{"a":"\u0000"}`, true},
		{`{"a":"\uD83D\uDE00"}`, true}, // a pair jsonb accepts: a false yes costs nothing
		{`["\udc00"]`, true},
		{`{"n":1e5,"m":-2.5E-3}`, false},
		{`{"n":1e200000}`, true},
		{`{"n":1E-20000}`, true},
	} {
		if got := jsonbUnsafe([]byte(c.json)); got != c.unsafe {
			t.Errorf("jsonbUnsafe(%s) = %v, want %v", c.json, got, c.unsafe)
		}
		ev := &Event{ID: "1", EventType: "x", Payload: json.RawMessage(c.json), Headers: json.RawMessage(c.json),
			Poison: "p", RawPayload: []byte{0, 0xff}}
		body, err := encodeParked(ev)
		if err != nil {
			t.Fatal(err)
		}
		if c.unsafe && bytes.Contains(body, []byte(c.json)) {
			t.Errorf("parked form of %s keeps it as JSON: %s", c.json, body)
		}
		back, err := decodeParked(body)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(back.Payload, ev.Payload) || !bytes.Equal(back.Headers, ev.Headers) ||
			!bytes.Equal(back.RawPayload, ev.RawPayload) || back.Poison != ev.Poison {
			t.Errorf("round trip of %s: %+v", c.json, back)
		}
	}
}
