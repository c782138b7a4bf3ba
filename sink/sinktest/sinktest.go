// Package sinktest is the conformance suite every sink.Sink passes against a
// real destination (an HTTP server, an embedded nats-server, a kfake
// cluster): the same assertions for each, as the journal's suite is for
// journals.
package sinktest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/compensa/compensa/sink"
)

// Received is one message as the destination's consumer saw it.
type Received struct {
	ID      string
	Headers map[string]string
	// Payload is the event's payload as received (for a webhook, taken out
	// of the envelope).
	Payload json.RawMessage
	// Raw is what a consumer gets of a payload that is not JSON: the body
	// (NATS, Kafka) or the envelope's payload_base64 (webhook).
	Raw []byte
}

// Harness connects the suite to one kind of destination.
type Harness struct {
	// New returns a fresh sink and a function that returns everything the
	// destination holds so far, in arrival order (it may wait briefly).
	New func(t *testing.T) (sink.Sink, func() []Received)
	// Break makes the destination unavailable; Heal brings it back. Both
	// nil: the fault test is skipped for this kind (say why in the test).
	Break, Heal func(t *testing.T)
	// Dedupes is true when the destination drops a resend by id (JetStream).
	Dedupes bool
}

// Events makes n events over aggs aggregates, in commit order.
func Events(n, aggs int) []*sink.Event {
	out := make([]*sink.Event, n)
	for i := range out {
		out[i] = &sink.Event{
			ID: uuid.NewString(), AggregateType: "order", AggregateID: fmt.Sprintf("o-%d", i%aggs),
			EventType: "order.placed", TenantID: uuid.NewString(), CorrelationID: uuid.NewString(),
			Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i)),
			Headers: json.RawMessage(`{"trace":"t-1","attempt":2}`),
		}
	}
	return out
}

// Run runs the suite.
func Run(t *testing.T, h Harness) {
	t.Run("DeliversWithIDHeadersAndPayload", func(t *testing.T) {
		s, read := h.New(t)
		evs := Events(20, 4)
		requireDelivered(t, s.Deliver(context.Background(), evs))
		got := waitFor(t, read, len(evs))
		byID := map[string]Received{}
		for _, r := range got {
			byID[r.ID] = r
		}
		for _, ev := range evs {
			r, ok := byID[ev.ID]
			if !ok {
				t.Fatalf("event %s not received", ev.ID)
			}
			var a, b any
			json.Unmarshal(ev.Payload, &a)
			json.Unmarshal(r.Payload, &b)
			if fmt.Sprint(a) != fmt.Sprint(b) {
				t.Errorf("payload of %s: got %s, want %s", ev.ID, r.Payload, ev.Payload)
			}
			for k, want := range map[string]string{"event_type": ev.EventType, "aggregate_type": ev.AggregateType,
				"aggregate_id": ev.AggregateID, "tenant_id": ev.TenantID, "correlation_id": ev.CorrelationID,
				"trace": "t-1", "attempt": "2"} {
				if r.Headers[k] != want {
					t.Errorf("event %s header %s = %q, want %q", ev.ID, k, r.Headers[k], want)
				}
			}
		}
	})
	t.Run("RowHeadersCannotSetReservedNames", func(t *testing.T) {
		// A row's headers object cannot set the row's fields, the framing,
		// hop-by-hop or forwarding headers, in any case or spelling.
		s, read := h.New(t)
		evs := Events(1, 1)
		evs[0].Headers = json.RawMessage(`{"TENANT_ID":"forged","Event_Type":"forged","event-type":"forged",` +
			`"Tenant-Id":"forged","AGGREGATE_ID":"forged","Correlation-ID":"forged","causation_id":"forged",` +
			`"X-Forwarded-For":"forged","x_forwarded_host":"forged","Webhook-Id":"forged","WEBHOOK_SIGNATURE":"forged",` +
			`"Content_Type":"forged","Connection":"forged","Keep-Alive":"forged","Upgrade":"forged","Poison":"forged",` +
			`"trace":"t-1"}`)
		requireDelivered(t, s.Deliver(context.Background(), evs))
		got := waitFor(t, read, 1)
		r := got[0]
		for k, v := range r.Headers {
			if strings.Contains(v, "forged") {
				t.Errorf("header %s = %q came from the row's headers", k, v)
			}
		}
		if r.Headers["event_type"] != evs[0].EventType || r.Headers["tenant_id"] != evs[0].TenantID || r.Headers["trace"] != "t-1" {
			t.Errorf("headers %v: want the row's own event_type and tenant_id, and its ordinary header trace", r.Headers)
		}
	})
	t.Run("PoisonEventDeliveredAsRead", func(t *testing.T) {
		// A row the relay could not decode still reaches the sink: its
		// payload's bytes as read, the reason in the poison header.
		s, read := h.New(t)
		evs := Events(3, 1)
		bad := evs[1]
		bad.Poison = "payload is not valid JSON: invalid character 'o'"
		bad.Payload, bad.RawPayload = json.RawMessage("null"), []byte("not json \x00\xff{")
		bad.Headers, bad.RawHeaders = nil, []byte("{trace:")
		requireDelivered(t, s.Deliver(context.Background(), evs))
		got := waitFor(t, read, len(evs))
		RequireOrder(t, evs, got)
		for _, r := range got {
			if r.ID != bad.ID {
				continue
			}
			if !bytes.Equal(r.Raw, bad.RawPayload) {
				t.Fatalf("poison event's payload: got %q, want the bytes as read %q", r.Raw, bad.RawPayload)
			}
			if r.Headers["poison"] != bad.Poison || r.Headers["event_type"] != bad.EventType {
				t.Fatalf("poison event's headers %v: want poison %q and the row's fields", r.Headers, bad.Poison)
			}
			return
		}
		t.Fatal("the poison event was not received")
	})
	t.Run("OrderPerAggregate", func(t *testing.T) {
		s, read := h.New(t)
		evs := Events(200, 7)
		requireDelivered(t, s.Deliver(context.Background(), evs))
		RequireOrder(t, evs, waitFor(t, read, len(evs)))
	})
	t.Run("ResendKeepsTheID", func(t *testing.T) {
		s, read := h.New(t)
		evs := Events(5, 1)
		requireDelivered(t, s.Deliver(context.Background(), evs))
		requireDelivered(t, s.Deliver(context.Background(), evs))
		want := 2 * len(evs)
		if h.Dedupes {
			want = len(evs)
		}
		got := waitFor(t, read, want)
		time.Sleep(200 * time.Millisecond)
		got = read()
		if len(got) != want {
			t.Fatalf("received %d messages after a resend of %d, want %d", len(got), len(evs), want)
		}
		counts := map[string]int{}
		for _, r := range got {
			counts[r.ID]++
		}
		for _, ev := range evs {
			if counts[ev.ID] != want/len(evs) {
				t.Fatalf("id %s received %d times, want %d", ev.ID, counts[ev.ID], want/len(evs))
			}
		}
	})
	t.Run("ConcurrentDeliveries", func(t *testing.T) {
		s, read := h.New(t)
		var wg sync.WaitGroup
		var all [][]*sink.Event
		for range 4 {
			evs := Events(25, 3)
			all = append(all, evs)
			wg.Add(1)
			go func() {
				defer wg.Done()
				requireDelivered(t, s.Deliver(context.Background(), evs))
			}()
		}
		wg.Wait()
		got := waitFor(t, read, 100)
		for _, evs := range all {
			RequireOrder(t, evs, got)
		}
	})
	t.Run("UnavailableFailsThenRecovers", func(t *testing.T) {
		if h.Break == nil {
			t.Skip("this destination has no injected fault in the suite (see the sink's own fault test)")
		}
		s, read := h.New(t)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		h.Break(t)
		evs := Events(6, 2)
		errs := s.Deliver(ctx, evs)
		failed := map[string]bool{}
		for i, err := range errs {
			k := evs[i].AggregateKey()
			if failed[k] && err == nil {
				t.Fatalf("event %d of an aggregate reported delivered after an earlier one failed", i)
			}
			if err != nil {
				failed[k] = true
			}
		}
		if len(failed) == 0 {
			t.Fatal("every event reported delivered while the destination was down")
		}
		h.Heal(t)
		deadline := time.Now().Add(15 * time.Second)
		for {
			errs = s.Deliver(ctx, evs)
			if allNil(errs) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("still failing after the destination came back: %v", errs)
			}
			time.Sleep(200 * time.Millisecond)
		}
		seen := map[string]bool{}
		for _, r := range read() {
			seen[r.ID] = true
		}
		for _, ev := range evs {
			if !seen[ev.ID] {
				t.Fatalf("event %s missing after recovery", ev.ID)
			}
		}
	})
}

func allNil(errs []error) bool {
	for _, e := range errs {
		if e != nil {
			return false
		}
	}
	return true
}

func requireDelivered(t *testing.T, errs []error) {
	t.Helper()
	for i, err := range errs {
		if err != nil {
			t.Errorf("event %d: %v", i, err)
		}
	}
}

func waitFor(t *testing.T, read func() []Received, n int) []Received {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		got := read()
		if len(got) >= n {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("received %d messages, want %d", len(got), n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// RequireOrder checks that the first arrivals of evs' ids follow evs' order
// within each aggregate.
func RequireOrder(t *testing.T, evs []*sink.Event, got []Received) {
	t.Helper()
	pos := map[string]int{}
	for i, r := range got {
		if _, ok := pos[r.ID]; !ok {
			pos[r.ID] = i
		}
	}
	last := map[string]int{}
	for _, ev := range evs {
		p, ok := pos[ev.ID]
		if !ok {
			t.Fatalf("event %s not received", ev.ID)
		}
		k := ev.AggregateKey()
		if prev, seen := last[k]; seen && p < prev {
			t.Fatalf("aggregate %s: event %s arrived before an earlier one", k, ev.ID)
		}
		last[k] = p
	}
}
