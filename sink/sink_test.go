package sink_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/compensa/compensa/sink"
)

func TestTemplates(t *testing.T) {
	t.Parallel()
	ev := &sink.Event{AggregateType: "order", EventType: "payment.captured", AggregateID: "o 1"}
	tpl := sink.MustTemplate("outbox.{aggregate_type}.{event_type}")
	if got := tpl.Expand(ev, nil); got != "outbox.order.payment.captured" {
		t.Errorf("expand: %q", got)
	}
	if tpl.Prefix() != "outbox." || tpl.Literal() {
		t.Errorf("prefix %q literal %v", tpl.Prefix(), tpl.Literal())
	}
	if got := sink.MustTemplate("t.{tenant_id}").Expand(ev, nil); got != "t._" {
		t.Errorf("an empty value must become _: %q", got)
	}
	// A value is one token for the cleaner; {raw(…)} is cut at its dots.
	dots := func(v string) string { return strings.ReplaceAll(v, ".", "_") }
	if got := tpl.Expand(ev, dots); got != "outbox.order.payment_captured" {
		t.Errorf("a value's dots: %q", got)
	}
	if got := sink.MustTemplate("outbox.{raw(event_type)}.{raw(aggregate_id)}").Expand(&sink.Event{EventType: "a..b", AggregateID: "x"}, dots); got != "outbox.a._.b.x" {
		t.Errorf("raw: %q", got)
	}
	for _, bad := range []string{"a.{nope}", "a.{raw(nope)}", "a.{raw(event_type}", "a.{event_type", "a}", ""} {
		if _, err := sink.ParseTemplate(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestMessageHeaders(t *testing.T) {
	t.Parallel()
	ev := &sink.Event{ID: "1", EventType: "x", AggregateType: "order", TenantID: "t",
		Headers: json.RawMessage(`{"event_type":"forged","n":3,"s":"v","obj":{"a":1}}`)}
	got := map[string]string{}
	for _, h := range ev.MessageHeaders() {
		if _, dup := got[h.Key]; dup {
			t.Errorf("header %s twice", h.Key)
		}
		got[h.Key] = h.Value
	}
	if got["event_type"] != "x" || got["n"] != "3" || got["s"] != "v" || got["obj"] != `{"a":1}` || got["tenant_id"] != "t" {
		t.Errorf("headers %v", got)
	}
	if _, ok := got["aggregate_id"]; ok {
		t.Error("an empty field is sent as a header")
	}
	// Row headers that are an empty object, or a one-key object in a
	// shape close to it, give exactly their keys.
	for headers, want := range map[string]int{`{}`: 3, ` { } `: 3, "{\n}": 3, `{"k":""}`: 4, ` {"a":{}} `: 4, `[]`: 3, `{`: 3} {
		ev.Headers = json.RawMessage(headers)
		if n := len(ev.MessageHeaders()); n != want {
			t.Errorf("row headers %q: %d headers %v, want %d", headers, n, ev.MessageHeaders(), want)
		}
	}
}

func TestHoldBackAndClassify(t *testing.T) {
	t.Parallel()
	evs := []*sink.Event{{ID: "1", AggregateID: "a"}, {ID: "2", AggregateID: "b"}, {ID: "3", AggregateID: "a"}, {ID: "4", AggregateID: "b"}}
	var sent []string
	errs := sink.HoldBack(evs, func(_ int, ev *sink.Event) error {
		sent = append(sent, ev.ID)
		if ev.ID == "1" {
			return sink.RetryAfter(time.Second, errors.New("slow down"))
		}
		return nil
	})
	if strings.Join(sent, ",") != "1,2,4" || !errors.Is(errs[2], sink.ErrHeldBack) || errs[1] != nil || errs[3] != nil {
		t.Fatalf("sent %v errs %v", sent, errs)
	}
	for err, want := range map[error]string{errors.New("refused"): "down", sink.EventError(errors.New("big")): "event",
		sink.Gone(errors.New("410")): "gone", errs[0]: "throttled", errs[2]: "event"} {
		if got := sink.Classify(err); got != want {
			t.Errorf("%v: %s, want %s", err, got, want)
		}
	}
}
