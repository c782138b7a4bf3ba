package kafkasink_test

import (
	"encoding/json"
	"testing"

	"github.com/compensa/compensa/sink"
	"github.com/compensa/compensa/sink/kafkasink"
	"github.com/compensa/compensa/test/cetest"
)

// The record of each CloudEvents mode decodes with the SDK (ce_ headers per
// the Kafka binding), keeps the header "id" and the key, and a topic
// expression's result fills one part of the name.
func TestCloudEventsRecord(t *testing.T) {
	t.Parallel()
	ev := &sink.Event{ID: "e-1", AggregateType: "order", AggregateID: "o-1", EventType: "order.placed", CorrelationID: "c-1",
		Payload: json.RawMessage(`{"tenant":"a.b/c"}`)}
	topic, err := sink.ParseTemplate("outbox.${ event.payload.tenant }")
	if err != nil {
		t.Fatal(err)
	}
	for _, format := range []string{sink.FormatCloudEvents, sink.FormatCloudEventsStructured} {
		rec, err := kafkasink.Record(kafkasink.Config{Topic: topic, Format: format, Source: "/s"}, ev)
		if err != nil {
			t.Fatal(err)
		}
		hs := map[string]string{}
		for _, h := range rec.Headers {
			hs[h.Key] = string(h.Value)
		}
		if rec.Topic != "outbox.a_b_c" || string(rec.Key) != "o-1" || hs["id"] != "e-1" {
			t.Errorf("%s: topic %q key %q headers %v", format, rec.Topic, rec.Key, hs)
		}
		got, err := cetest.Kafka(hs, rec.Value)
		if err != nil {
			t.Fatalf("%s: SDK: %v (%v)", format, err, hs)
		}
		if got.ID() != "e-1" || got.Source() != "/s" || got.Type() != "order.placed" || got.Subject() != "o-1" ||
			got.Extensions()["correlationid"] != "c-1" || string(got.Data()) != `{"tenant":"a.b/c"}` {
			t.Errorf("%s: %s", format, got)
		}
	}
}
