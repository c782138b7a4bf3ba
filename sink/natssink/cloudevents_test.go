package natssink_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/compensa/compensa/sink"
	"github.com/compensa/compensa/sink/natssink"
	"github.com/compensa/compensa/test/cetest"
)

// The message of each CloudEvents mode decodes with the SDK; an expression
// in the subject that fails refuses the event, and one whose result holds
// dots and wildcards stays one token.
func TestCloudEventsMessage(t *testing.T) {
	t.Parallel()
	ev := &sink.Event{ID: "e-1", AggregateType: "order", AggregateID: "o-1", EventType: "order.placed", TenantID: "t-1",
		Payload: json.RawMessage(`{"region":"eu.>"}`), Headers: json.RawMessage(`{"Nats-Expected-Stream":"X","x":"y"}`)}
	subject, err := sink.ParseTemplate("outbox.${ event.payload.region }.{raw(event_type)}")
	if err != nil {
		t.Fatal(err)
	}
	for _, format := range []string{sink.FormatCloudEvents, sink.FormatCloudEventsStructured} {
		msg, err := natssink.Message(natssink.Config{Subject: subject, Format: format, Source: "/s"}, ev)
		if err != nil {
			t.Fatal(err)
		}
		if msg.Subject != "outbox.eu__.order.placed" {
			t.Errorf("subject %q", msg.Subject)
		}
		hs := map[string]string{}
		for k, v := range msg.Header {
			if strings.HasPrefix(strings.ToLower(k), "nats-") {
				t.Errorf("%s: header %s taken from the row", format, k)
			}
			hs[k] = v[0]
		}
		got, err := cetest.NATS(hs, msg.Data)
		if err != nil {
			t.Fatalf("%s: SDK: %v (%v)", format, err, hs)
		}
		if got.ID() != "e-1" || got.Source() != "/s" || got.Type() != "order.placed" || got.Subject() != "o-1" ||
			got.Extensions()["tenantid"] != "t-1" || string(got.Data()) != `{"region":"eu.>"}` || hs["x"] != "y" {
			t.Errorf("%s: %s %v", format, got, hs)
		}
	}
	_, err = natssink.Message(natssink.Config{Subject: subject, Format: sink.FormatCloudEvents}, &sink.Event{ID: "e-2", Payload: json.RawMessage(`{}`)})
	if err == nil || sink.Classify(err) != "event" {
		t.Errorf("a failing subject expression: %v, want a refusal of the event", err)
	}
}
