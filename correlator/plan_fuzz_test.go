package correlator

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/compensa/compensa/internal/briefs"
	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/saga"
)

// FuzzPlanAdd routes hostile events through plan.add, the correlator's
// decision per event, with the real brief_enrichment definition registered.
// Whatever the event, exactly one thing happens to it, and what reaches the
// database can be stored there:
//
//   - poison (decoded as unusable by the stream) is parked, never started;
//   - a parked event has a reason, and its id, type, reason and raw row are
//     valid UTF-8 without NUL (text columns refuse both), the raw row JSON
//     that jsonb accepts;
//   - a started saga's context and a reply's payload are the event's
//     payload, and jsonb accepts them, or the batch's statement would fail
//     and the stream would replay the same batch for ever instead of parking
//     the one event.
func FuzzPlanAdd(f *testing.F) {
	brief := `{"brief_id": "6f9619ff-8b86-d011-b42d-00cf4fc964ff"}`
	f.Add(briefs.EventCreated, []byte(brief), []byte(`{}`), "", "0b7e6c2a-1f0e-4a57-9a43-5d2c1e6f8b90", "")
	f.Add(briefs.EventCreated, []byte(`{"brief_id": "nope"}`), []byte(nil), "", "order-1", "")
	f.Add(briefs.EventCreated, []byte(`{"brief_id": "\u0000"}`), []byte(nil), "", "x", "")
	f.Add(briefs.EventCreated, []byte("{\"brief_id\": \"\xff\xfe\"}"), []byte(nil), "", "x\x00y", "")
	f.Add(briefs.EventCreated, []byte(`{"brief_id": `), []byte(nil), "payload is not valid JSON", "x", "")
	f.Add(briefs.EventCreated, []byte(brief), []byte(`{"workspace_id": "6f9619ff-8b86-d011-b42d-00cf4fc964ff"}`), "", "", "")
	f.Add("research_brief.enriched", []byte(`{"ok": true}`), []byte(nil), "", "r1", "6f9619ff-8b86-d011-b42d-00cf4fc964ff")
	f.Add("reply", []byte("not json"), []byte(nil), "", "r2", "6f9619ff-8b86-d011-b42d-00cf4fc964ff")
	f.Add("noise", []byte{}, []byte(nil), "", "", "")
	reg := saga.NewRegistry()
	if err := briefs.Register(reg); err != nil {
		f.Fatal(err)
	}
	routes := buildRoutes(reg)
	f.Fuzz(func(t *testing.T, eventType string, payload, headers []byte, poison, rawID, corr string) {
		if poison != "" {
			// The stream's reasons are sentences ("payload is not valid
			// JSON: ..."), never only NUL bytes, which parking strips.
			poison = "decoded as unusable: " + poison
		}
		ev := outbox.Event{EventType: eventType, Payload: payload, Headers: headers, Poison: poison,
			RawID: rawID, TenantID: outbox.NilTenant, LSN: 0x16B3748}
		if rawID != "" {
			ev.ID = outbox.EventIDFromText(rawID)
		}
		if c, err := uuid.Parse(corr); err == nil {
			ev.CorrelationID = uuid.NullUUID{UUID: c, Valid: true}
		}
		var p plan
		p.add(routes, &ev)
		if p.seen != 1 {
			t.Fatalf("seen = %d", p.seen)
		}
		outcomes := 0
		for _, n := range []int{len(p.startSaga), len(p.replyEvent), len(p.deadReason)} {
			if n > 0 {
				outcomes++
			}
		}
		if outcomes > 1 || len(p.replyEvent) > 1 || len(p.deadReason) > 1 {
			t.Fatalf("one event had several outcomes: %d starts, %d replies, %d dead letters",
				len(p.startSaga), len(p.replyEvent), len(p.deadReason))
		}
		if poison != "" && len(p.deadReason) != 1 {
			t.Fatalf("a poison event was not parked (%d starts, %d replies)", len(p.startSaga), len(p.replyEvent))
		}
		for i := range p.deadReason {
			if p.deadReason[i] == "" {
				t.Fatal("parked without a reason")
			}
			for _, s := range []string{p.deadEventID[i], p.deadEventType[i], p.deadReason[i], p.deadRaw[i]} {
				if !utf8.ValidString(s) || strings.ContainsRune(s, 0) {
					t.Fatalf("dead letter field a text column refuses: %q", s)
				}
			}
			if reason := jsonbRefuses([]byte(p.deadRaw[i])); reason != "" {
				t.Fatalf("dead letter raw row %q: jsonb refuses it: %s", p.deadRaw[i], reason)
			}
		}
		for i := range p.startContext {
			if p.startContext[i] != string(payload) || p.startTrigger[i] != ev.ID || ev.ID == uuid.Nil {
				t.Fatalf("start %d: context %q trigger %s, want the event's payload and id %s", i, p.startContext[i], p.startTrigger[i], ev.ID)
			}
			if reason := jsonbRefuses([]byte(p.startContext[i])); reason != "" {
				t.Fatalf("started a saga whose context jsonb refuses (%s): %q; the batch would fail for ever instead of parking the event", reason, p.startContext[i])
			}
		}
		for i := range p.replyPayload {
			if reason := jsonbRefuses([]byte(p.replyPayload[i])); reason != "" {
				t.Fatalf("reply payload jsonb refuses (%s): %q", reason, p.replyPayload[i])
			}
		}
	})
}

// jsonbRefuses says why PostgreSQL's jsonb input would refuse b, as far as
// that can be told without a server: it must be valid UTF-8 JSON, without
// the \u0000 escape and without a UTF-16 surrogate escape that is not part of
// a pair. (Numbers beyond numeric's range are refused too; the server-side
// tests cover those.)
func jsonbRefuses(b []byte) string {
	if !utf8.Valid(b) {
		return "not UTF-8"
	}
	if !json.Valid(b) {
		return "not JSON"
	}
	inString := false
	for i := 0; i < len(b); i++ {
		c := b[i]
		if !inString {
			if c == '"' {
				inString = true
			}
			continue
		}
		switch c {
		case '"':
			inString = false
		case '\\':
			if b[i+1] != 'u' {
				i++
				continue
			}
			r := hex4(b[i+2 : i+6])
			i += 5
			switch {
			case r == 0:
				return `\u0000`
			case r >= 0xDC00 && r <= 0xDFFF:
				return "a low surrogate escape without a high one"
			case r >= 0xD800 && r <= 0xDBFF:
				if i+6 >= len(b) || b[i+1] != '\\' || b[i+2] != 'u' {
					return "a high surrogate escape without a low one"
				}
				if lo := hex4(b[i+3 : i+7]); lo < 0xDC00 || lo > 0xDFFF {
					return "a high surrogate escape without a low one"
				}
				i += 6
			}
		}
	}
	return ""
}

func hex4(b []byte) int {
	n, _ := strconv.ParseUint(string(b), 16, 32)
	return int(n)
}

// TestJSONBRefusesMatchesTheServersRules pins the helper on the cases the
// property relies on.
func TestJSONBRefusesMatchesTheServersRules(t *testing.T) {
	for in, refused := range map[string]bool{
		`{"a": "b"}`:              false,
		`{"a": "\u0000"}`:         true,
		`{"a": "\\u0000"}`:        false,
		`{"a": "\ud83d\ude00"}`:   false,
		`{"a": "\ud83d"}`:         true,
		`{"a": "\ude00"}`:         true,
		`{"a": "\ud83d\u0041"}`:   true,
		`["\ud83d", 1]`:           true,
		"{\"a\": \"\xff\"}":       true,
		`{"a": "é \u00e9 \"q\\"}`: false,
	} {
		if got := jsonbRefuses([]byte(in)) != ""; got != refused {
			t.Errorf("jsonbRefuses(%s) = %t, want %t", in, got, refused)
		}
	}
}
