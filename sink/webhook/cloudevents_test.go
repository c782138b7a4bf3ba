package webhook_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/compensa/compensa/sink"
	"github.com/compensa/compensa/sink/webhook"
	"github.com/compensa/compensa/test/cetest"
)

// In both CloudEvents modes the request is signed over the body actually
// sent, and the CloudEvents SDK's HTTP binding reads every attribute.
func TestCloudEventsWebhookIsSignedAndDecodes(t *testing.T) {
	t.Parallel()
	key, _ := webhook.DecodeSecret(secret)
	for _, format := range []string{sink.FormatCloudEvents, sink.FormatCloudEventsStructured} {
		var mu sync.Mutex
		var got []*event.Event
		var ids []string
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			if !webhook.Verify(key, r.Header.Get("webhook-id"), r.Header.Get("webhook-timestamp"), body, r.Header.Get("webhook-signature")) {
				t.Errorf("%s: signature does not verify over the body sent", format)
			}
			e, err := cetest.HTTPParts(r.Header, body)
			if err != nil {
				t.Errorf("%s: SDK: %v\n%v\n%s", format, err, r.Header, body)
			}
			mu.Lock()
			got, ids = append(got, e), append(ids, r.Header.Get("webhook-id"))
			mu.Unlock()
			w.WriteHeader(204)
		}))
		s, err := webhook.New(webhook.Config{URL: srv.URL + "/events", Secret: secret, Format: format, Source: "/shop/orders"})
		if err != nil {
			t.Fatal(err)
		}
		ev := &sink.Event{ID: "0b3c7a8e-1f2d-4c5b-9a6e-7d8f9e0a1b2c", TenantID: "t-1", AggregateType: "order", AggregateID: "o-1",
			EventType: "order.placed", Payload: json.RawMessage(`{"n":1}`), CorrelationID: "c-1", CausationID: "k-1",
			Headers:   json.RawMessage(`{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01","tracestate":"v=1"}`),
			CreatedAt: time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC)}
		poison := &sink.Event{ID: "p-1", AggregateID: "o-2", Poison: "payload is not JSON", RawPayload: []byte("\x00\xff"), Payload: json.RawMessage("null")}
		errs := s.Deliver(context.Background(), []*sink.Event{ev, poison})
		s.Close()
		srv.Close()
		if errs[0] != nil || errs[1] != nil {
			t.Fatalf("%s: %v", format, errs)
		}
		if len(got) != 2 || got[0] == nil || got[1] == nil {
			t.Fatalf("%s: got %v", format, got)
		}
		e := got[0]
		if e.ID() != ev.ID || ids[0] != ev.ID || e.Source() != "/shop/orders" || e.Type() != "order.placed" || e.Subject() != "o-1" ||
			e.SpecVersion() != "1.0" || !e.Time().Equal(ev.CreatedAt) || e.DataContentType() != "application/json" || string(e.Data()) != `{"n":1}` {
			t.Errorf("%s: %s", format, e)
		}
		x := e.Extensions()
		if x["tenantid"] != "t-1" || x["aggregatetype"] != "order" || x["correlationid"] != "c-1" || x["causationid"] != "k-1" ||
			x["traceparent"] != "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" || x["tracestate"] != "v=1" || len(x) != 6 {
			t.Errorf("%s: extensions %v", format, x)
		}
		p := got[1]
		// The binary mode percent-encodes header values (HTTP binding
		// 3.1.3.2), which this SDK version hands on without decoding.
		reason, _ := p.Extensions()["poison"].(string)
		reason, _ = url.PathUnescape(reason)
		if string(p.Data()) != "\x00\xff" || p.DataContentType() != "application/octet-stream" || reason != "payload is not JSON" {
			t.Errorf("%s: poison event %s", format, p)
		}
	}
}
