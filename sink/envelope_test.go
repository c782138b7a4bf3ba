package sink_test

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/compensa/compensa/sink"
)

// The envelope is byte for byte what json.Marshal writes for every event
// json.Marshal encodes as valid UTF-8 (the fast path writes the common
// event itself), and valid JSON for every other.
func TestEnvelopeIsJSONMarshal(t *testing.T) {
	t.Parallel()
	texts := []string{"", "o-1", "order.placed", "a\"b", `back\slash`, "<tag>&", "tab\there", "line\nbreak", "\x00\x1f\x7f",
		"é ü", "\u2028\u2029", "bad \xff utf8", "😀", "0b3c7a8e-1f2d-4c5b-9a6e-7d8f9e0a1b2c"}
	raws := []string{"", "null", `{"n":1}`, `{ "a" : [1, 2, {"b": "c"}] }`, `"<script>&"`, `{"x":"\u2028"}`, "{\"x\":\"\u2028\"}",
		`{"bad":}`, `[1,2`, "\"\xff\"", `123`, `"é"`, " \n\t{\"k\":\"v\"}\n"}
	times := []time.Time{{}, time.Date(2026, 12, 1, 10, 0, 0, 123456789, time.UTC),
		time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("x", 5*3600+1800)), time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}
	r := rand.New(rand.NewPCG(1, 2))
	plain := []string{"", "o-1", "order.placed", "0b3c7a8e-1f2d-4c5b-9a6e-7d8f9e0a1b2c", "a b ~ {}"}
	plainRaws := []string{"null", `{"n":1}`, `{ "a" : [1, 2, {"b": "c"}] }`, `123`, " \n\t{\"k\":\"v\"}\n"}
	var pick func([]string) string
	for i := range 20000 {
		// Half of the events are of the kind the fast path writes.
		pick = func(xs []string) string { return xs[r.IntN(len(xs))] }
		if i%2 == 0 {
			pick = func(xs []string) string {
				if &xs[0] == &raws[0] {
					xs = plainRaws
				} else if &xs[0] == &texts[0] {
					xs = plain
				}
				return xs[r.IntN(len(xs))]
			}
		}
		ev := &sink.Event{ID: pick(texts), TenantID: pick(texts), AggregateType: pick(texts), AggregateID: pick(texts),
			EventType: pick(texts), CorrelationID: pick(texts), CausationID: pick(texts), CreatedAt: times[r.IntN(len(times))]}
		if p := pick(raws); p != "" || r.IntN(2) == 0 {
			ev.Payload = json.RawMessage(p)
		}
		if h := pick(raws); h != "" {
			ev.Headers = json.RawMessage(h)
		}
		if i%50 == 1 {
			ev.Poison = pick(texts)
			ev.RawPayload = []byte(pick(raws))
		}
		got := ev.Envelope()
		if pre := ev.AppendEnvelope([]byte("pre")); string(pre) != "pre"+string(got) {
			t.Fatalf("AppendEnvelope %q, Envelope %q", pre, got)
		}
		want, err := json.Marshal(ev)
		if err == nil && utf8.Valid(want) {
			if !bytes.Equal(got, want) {
				t.Fatalf("event %+v:\n got %s\nwant %s", ev, got, want)
			}
			continue
		}
		var back sink.Event
		if !utf8.Valid(got) || json.Unmarshal(got, &back) != nil || back.Poison == "" {
			t.Fatalf("event %+v: envelope %q is not valid JSON with the reason in poison", ev, got)
		}
	}
}
