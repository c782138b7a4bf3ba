package sink

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/compensa/compensa/outbox"
)

func TestParkedFormKeepsWhatJSONBRefuses(t *testing.T) {
	t.Parallel()
	deep := strings.Repeat("[", 12000) + strings.Repeat("]", 12000)
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
		{deep, true},
		{"{\"a\":\"\xff\"}", true},
		{`not json`, true},
	} {
		if got := jsonbUnsafe([]byte(c.json)); got != c.unsafe {
			t.Errorf("jsonbUnsafe(%.40s) = %v, want %v", c.json, got, c.unsafe)
		}
		ev := &Event{ID: "1", EventType: "x", Payload: json.RawMessage(c.json), Headers: json.RawMessage(c.json),
			Poison: "p", RawPayload: []byte{0, 0xff}, CreatedAt: time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)}
		body, raw := encodeParked(ev)
		if c.unsafe && (raw == nil || strings.Contains(body, c.json)) {
			t.Errorf("parked form of %.40s keeps it as JSON: %.200s", c.json, body)
		}
		requireStorable(t, body)
		back, err := decodeParked([]byte(body), raw)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(back, ev) {
			t.Errorf("round trip of %.40s: %+v", c.json, back)
		}
	}
}

// Text that is not UTF-8 (a SQL_ASCII database) or holds NUL, and ids and
// aggregates longer than an index entry, are parked whole and keyed by a
// storable key.
func TestParkedFormKeepsHostileText(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("Ω", 3000)
	ev := &Event{ID: "id-\xff" + long, TenantID: "t\x00", AggregateType: "ord\xc3er", AggregateID: long, EventType: "x\xfe",
		Payload: json.RawMessage(`{"a":1}`), Poison: "aggregate_type is not valid UTF-8"}
	body, raw := encodeParked(ev)
	if raw == nil {
		t.Fatal("an event with text that is not UTF-8 is parked as JSON")
	}
	requireStorable(t, body)
	var sum map[string]any
	if err := json.Unmarshal([]byte(body), &sum); err != nil || sum["in_event_raw"] != true || sum["payload"] != nil {
		t.Fatalf("summary %s: %v", body, err)
	}
	back, err := decodeParked([]byte(body), raw)
	if err != nil || !reflect.DeepEqual(back, ev) {
		t.Fatalf("round trip: %+v, %v", back, err)
	}
	for _, k := range []string{storedKey(ev.ID), ev.AggregateKey(), storedKey(ev.ID + "x")} {
		if len(k) > maxStoredKey || !utf8.ValidString(k) || strings.ContainsRune(k, 0) {
			t.Errorf("key %.60q… (%d bytes) cannot be stored", k, len(k))
		}
	}
	if storedKey(ev.ID) == storedKey(ev.ID+"x") {
		t.Error("two long ids got one key")
	}
	if k := storedKey("plain-id"); k != "plain-id" {
		t.Errorf("a plain id changed: %q", k)
	}
}

// requireStorable fails unless jsonb would take s: UTF-8, JSON, nothing
// jsonb refuses, and no deeper than the relay encodes.
func requireStorable(t *testing.T, s string) {
	t.Helper()
	if err := outbox.CheckJSONB([]byte(s)); err != nil {
		t.Fatalf("the event column would be refused by jsonb (%v): %.200s", err, s)
	}
	if d := outbox.JSONDepth([]byte(s)); d > maxParkedDepth+1 {
		t.Fatalf("the event column nests %d deep", d)
	}
	if !bytes.Contains([]byte(s), []byte(`"id"`)) {
		t.Fatalf("the event column has no id: %.200s", s)
	}
}

// FuzzParkedForm: whatever an event holds, its parked form is JSON that
// jsonb takes (plus, when needed, bytes), and it reads back unchanged; its
// webhook envelope is UTF-8 JSON.
func FuzzParkedForm(f *testing.F) {
	f.Add("id-1", "order.placed", "o-1", []byte(`{"n":1}`), []byte(`{"k":"v"}`), "", []byte(nil), uint16(0))
	f.Add("id-\xff", "order.pla\xffced", "o-\x00", []byte("{\"a\":\"\xff\"}"), []byte(`{"n":1e200000}`), "poison", []byte{0, 0xff}, uint16(12000))
	f.Add("", "", "", []byte(`{"a":"\u0000"}`), []byte(`["\udc00"]`), "p\x00", []byte(nil), uint16(1500))
	f.Fuzz(func(t *testing.T, id, typ, agg string, payload, headers []byte, poison string, rawPayload []byte, depth uint16) {
		d := int(depth) % 13000
		payload = append(append([]byte(strings.Repeat("[", d)), payload...), strings.Repeat("]", d)...)
		ev := &Event{ID: id, EventType: typ, AggregateID: agg, AggregateType: agg, Payload: payload, Headers: headers,
			Poison: poison, RawPayload: rawPayload}
		if len(ev.Payload) == 0 {
			ev.Payload = json.RawMessage("null")
		}
		if len(ev.Headers) == 0 {
			ev.Headers = nil
		}
		body, raw := encodeParked(ev)
		requireStorable(t, body)
		back, err := decodeParked([]byte(body), raw)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(back, ev) {
			t.Fatalf("round trip changed the event:\n%+v\n%+v", ev, back)
		}
		env := ev.Envelope()
		if !utf8.Valid(env) || !json.Valid(env) {
			t.Fatalf("envelope is not UTF-8 JSON: %.200s", env)
		}
		for _, k := range []string{storedKey(ev.ID), ev.AggregateKey()} {
			if len(k) > maxStoredKey || !utf8.ValidString(k) || strings.ContainsRune(k, 0) {
				t.Fatalf("key %.60q (%d bytes) cannot be stored", k, len(k))
			}
		}
	})
}

// An event Go's encoder cannot encode as it is (JSON too deep, not UTF-8)
// still gets an envelope: its payload and headers in base64, the reason in
// poison.
func TestEnvelopeOfAnEventGoCannotEncode(t *testing.T) {
	t.Parallel()
	deep := json.RawMessage(strings.Repeat("[", 12000) + strings.Repeat("]", 12000))
	for _, ev := range []*Event{
		{ID: "1", EventType: "x", Payload: deep},
		{ID: "2", EventType: "x", Payload: json.RawMessage(`{}`), Headers: deep},
		{ID: "3", EventType: "x", Payload: json.RawMessage("{\"a\":\"\xff\"}")},
	} {
		var env struct {
			Payload       json.RawMessage `json:"payload"`
			Poison        string          `json:"poison"`
			PayloadBase64 []byte          `json:"payload_base64"`
			HeadersBase64 []byte          `json:"headers_base64"`
		}
		b := ev.Envelope()
		if err := json.Unmarshal(b, &env); err != nil || !utf8.Valid(b) {
			t.Fatalf("event %s: envelope %.100s: %v", ev.ID, b, err)
		}
		if !strings.Contains(env.Poison, "cannot be encoded as JSON") || string(env.Payload) != "null" {
			t.Errorf("event %s: poison %q, payload %s", ev.ID, env.Poison, env.Payload)
		}
		if !bytes.Equal(env.PayloadBase64, ev.Payload) || (ev.Headers != nil && !bytes.Equal(env.HeadersBase64, ev.Headers)) {
			t.Errorf("event %s: the bytes did not travel in base64", ev.ID)
		}
	}
}
