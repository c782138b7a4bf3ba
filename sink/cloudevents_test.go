package sink_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/compensa/compensa/sink"
	"github.com/compensa/compensa/test/cetest"
)

const (
	traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	source      = "/compensa/shop/public.outbox"
)

func fullEvent() *sink.Event {
	return &sink.Event{ID: "0b3c7a8e-1f2d-4c5b-9a6e-7d8f9e0a1b2c", TenantID: "6a0f6a0e-0000-4000-8000-000000000001",
		AggregateType: "order", AggregateID: "o-17", EventType: "order.placed", Payload: json.RawMessage(`{"amount":42,"items":["a"]}`),
		Headers:       json.RawMessage(`{"traceparent":"` + traceparent + `","tracestate":"vendor=1","x-team":"billing","ce-type":"forged"}`),
		CorrelationID: "6a0f6a0e-0000-4000-8000-000000000002", CausationID: "6a0f6a0e-0000-4000-8000-000000000003",
		CreatedAt: time.Date(2026, 12, 4, 10, 11, 12, 345678000, time.UTC)}
}

// checkFull checks every attribute of fullEvent as the SDK decoded it.
func checkFull(t *testing.T, got *event.Event) {
	t.Helper()
	if err := got.Validate(); err != nil {
		t.Fatalf("not a valid CloudEvent: %v", err)
	}
	want := fullEvent()
	for name, pair := range map[string][2]string{
		"specversion": {got.SpecVersion(), "1.0"}, "id": {got.ID(), want.ID}, "source": {got.Source(), source},
		"type": {got.Type(), want.EventType}, "subject": {got.Subject(), want.AggregateID},
		"time":            {got.Time().Format(time.RFC3339Nano), want.CreatedAt.Format(time.RFC3339Nano)},
		"datacontenttype": {got.DataContentType(), "application/json"},
	} {
		if pair[0] != pair[1] {
			t.Errorf("%s = %q, want %q", name, pair[0], pair[1])
		}
	}
	ext := got.Extensions()
	for name, v := range map[string]string{"tenantid": want.TenantID, "aggregatetype": "order", "correlationid": want.CorrelationID,
		"causationid": want.CausationID, "traceparent": traceparent, "tracestate": "vendor=1"} {
		if s, _ := ext[name].(string); s != v {
			t.Errorf("extension %s = %v, want %q", name, ext[name], v)
		}
	}
	if len(ext) != 6 {
		t.Errorf("extensions %v, want exactly the six of the event", ext)
	}
	var data map[string]any
	if err := got.DataAs(&data); err != nil || data["amount"] != float64(42) {
		t.Errorf("data %s (%v), want the payload", got.Data(), err)
	}
}

func TestCloudEventStructuredDecodesWithTheSDK(t *testing.T) {
	t.Parallel()
	b := fullEvent().CloudEvent(source).Structured()
	got, err := cetest.Kafka(map[string]string{"content-type": sink.ContentTypeCloudEvents}, b)
	if err != nil {
		t.Fatalf("SDK: %v\n%s", err, b)
	}
	checkFull(t, got)
}

func TestCloudEventBinaryDecodesWithTheSDK(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, prefix string
		decode       func(map[string]string, []byte) (*event.Event, error)
	}{{"nats", "ce-", cetest.NATS}, {"kafka", "ce_", cetest.Kafka}} {
		enc := fullEvent().Encode(sink.FormatCloudEvents, source, c.prefix, "content-type", nil)
		hs := map[string]string{}
		for _, h := range enc.Headers {
			hs[h.Key] = h.Value
		}
		if hs["x-team"] != "billing" || hs[c.prefix+"type"] != "order.placed" {
			t.Errorf("%s: headers %v: want the row's own header beside the attributes, and no forged ce-type", c.name, hs)
		}
		got, err := c.decode(hs, enc.Body)
		if err != nil {
			t.Fatalf("%s: SDK: %v", c.name, err)
		}
		checkFull(t, got)
	}
}

func TestCloudEventLeavesAbsentExtensionsOut(t *testing.T) {
	t.Parallel()
	ev := &sink.Event{ID: "e-1", EventType: "x.y", Payload: json.RawMessage(`null`)}
	c := ev.CloudEvent(source)
	for _, a := range c.Attrs {
		switch a.Key {
		case "specversion", "id", "source", "type", "datacontenttype":
		default:
			t.Errorf("attribute %s=%q present for an event without it", a.Key, a.Value)
		}
	}
	got, err := cetest.NATS(map[string]string{"content-type": sink.ContentTypeCloudEvents}, c.Structured())
	if err != nil || len(got.Extensions()) != 0 || got.Subject() != "" {
		t.Fatalf("SDK: %v %v", got, err)
	}
}

// A poison row whose payload is not JSON is carried as it was read: the
// body in binary mode, data_base64 in structured mode, with its reason in
// the poison extension and an octet-stream content type.
func TestCloudEventOfAPoisonEvent(t *testing.T) {
	t.Parallel()
	raw := []byte("not json \xff")
	ev := &sink.Event{ID: "e-2", Poison: "payload is not JSON", RawPayload: raw, Payload: json.RawMessage("null"),
		AggregateID: "bad\nline"}
	c := ev.CloudEvent(source)
	got, err := cetest.Kafka(map[string]string{"content-type": sink.ContentTypeCloudEvents}, c.Structured())
	if err != nil {
		t.Fatalf("SDK: %v\n%s", err, c.Structured())
	}
	if string(got.Data()) != string(raw) || got.DataContentType() != sink.ContentTypeOctetStream || got.Type() != "compensa.unreadable" {
		t.Fatalf("data %q type %q content type %q", got.Data(), got.Type(), got.DataContentType())
	}
	if got.Extensions()["poison"] != "payload is not JSON" || got.Subject() != "badline" {
		t.Fatalf("extensions %v subject %q", got.Extensions(), got.Subject())
	}
	enc := ev.Encode(sink.FormatCloudEvents, source, "ce_", "content-type", nil)
	if string(enc.Body) != string(raw) {
		t.Fatalf("binary body %q, want the bytes read", enc.Body)
	}
}

func TestPercentEncode(t *testing.T) {
	t.Parallel()
	if got := sink.PercentEncode(`a b"%é~`); got != "a%20b%22%25%C3%A9~" {
		t.Fatal(got)
	}
}
