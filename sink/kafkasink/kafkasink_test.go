package kafkasink_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/goleak"

	"github.com/compensa/compensa/sink"
	"github.com/compensa/compensa/sink/kafkasink"
	"github.com/compensa/compensa/sink/sinktest"
	"github.com/compensa/compensa/test/testkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func cluster(t *testing.T) *kfake.Cluster {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(3))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// readTopic consumes every record of topic from the start, partition by
// partition (order is per partition, and one aggregate is one partition).
func readTopic(addrs []string, topic string) func() []sinktest.Received {
	return func() []sinktest.Received {
		cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
		if err != nil {
			return nil
		}
		defer cl.Close()
		var out []sinktest.Received
		empty := 0
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
			fs := cl.PollFetches(ctx)
			cancel()
			n := 0
			fs.EachRecord(func(r *kgo.Record) {
				n++
				h := map[string]string{}
				for _, x := range r.Headers {
					h[x.Key] = string(x.Value)
				}
				out = append(out, sinktest.Received{ID: h["id"], Headers: h, Payload: r.Value, Raw: r.Value})
			})
			// Three empty polls in a row end the read; before the first
			// record, fifteen: a client's first fetch after the broker
			// came back can take seconds beside a loaded suite.
			if n > 0 {
				empty = 0
			} else if empty++; empty == 3 && len(out) > 0 || empty == 15 {
				return out
			}
		}
	}
}

func TestConformance(t *testing.T) {
	testkit.SkipShort(t, "the whole sink contract against a fake Kafka cluster")
	c := cluster(t)
	var fault *kfake.FaultHandle
	sinktest.Run(t, sinktest.Harness{
		New: func(t *testing.T) (sink.Sink, func() []sinktest.Received) {
			topic := "t" + strings.ReplaceAll(uuid.NewString(), "-", "")[:12]
			s, err := kafkasink.New(kafkasink.Config{Brokers: c.ListenAddrs(), Topic: sink.MustTemplate(topic), Timeout: 2 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s, readTopic(c.ListenAddrs(), topic)
		},
		// A broker that refuses every produce with a retriable error until healed.
		Break: func(*testing.T) {
			fault = c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.NotEnoughReplicas, Count: -1})
		},
		Heal: func(*testing.T) { fault.Remove() },
	})
}

// TestInjectedProduceFaults: produces refused by the broker (kfake's
// injected faults) are reported as not delivered, never as delivered, and
// a resend of what failed (what the fan-out does from the parked table)
// delivers every event, first arrivals in commit order per aggregate.
func TestInjectedProduceFaults(t *testing.T) {
	testkit.SkipShort(t, "injects produce faults into a fake Kafka cluster")
	c := cluster(t)
	s, err := kafkasink.New(kafkasink.Config{Brokers: c.ListenAddrs(), Topic: sink.MustTemplate("outbox.event.{aggregate_type}"), Timeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// Warm up: the topic exists before the faults, so they hit produces.
	for _, err := range s.Deliver(t.Context(), sinktest.Events(1, 1)) {
		if err != nil {
			t.Fatal(err)
		}
	}
	h := c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.NotEnoughReplicas, Count: 3})
	evs := sinktest.Events(60, 5)
	pending, rounds, failures := evs, 0, 0
	for len(pending) > 0 {
		if rounds++; rounds > 20 {
			t.Fatalf("%d events still failing after 20 rounds", len(pending))
		}
		var next []*sink.Event
		for i, err := range s.Deliver(t.Context(), pending) {
			if err != nil {
				next = append(next, pending[i])
				failures++
			}
		}
		pending = next
	}
	if h.Hits() == 0 {
		t.Fatal("the injected fault was never hit")
	}
	got := readTopic(c.ListenAddrs(), "outbox.event.order")()
	seen := map[string]bool{}
	for _, r := range got {
		seen[r.ID] = true
	}
	for _, ev := range evs {
		if !seen[ev.ID] {
			t.Fatalf("event %s never received", ev.ID)
		}
	}
	sinktest.RequireOrder(t, evs, got)
	t.Logf("%d fault hits, %d failed deliveries resent over %d rounds, %d records for %d events", h.Hits(), failures, rounds, len(got), len(evs))
}

// TestTooLargeRecordIsRefusedBeforeProducing: a record larger than the
// producer's cap is refused as an event error (parked with the reason),
// never produced, and the later events of its aggregate are held back
// rather than produced ahead of it; other aggregates go on. The check is
// never laxer than franz-go's own: the largest record it lets through is
// acknowledged.
func TestTooLargeRecordIsRefusedBeforeProducing(t *testing.T) {
	c := cluster(t)
	const limit = 2048
	topic := "big" + strings.ReplaceAll(uuid.NewString(), "-", "")[:12]
	s, err := kafkasink.New(kafkasink.Config{Brokers: c.ListenAddrs(), Topic: sink.MustTemplate(topic), Timeout: 3 * time.Second,
		MaxMessageBytes: limit})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	evs := sinktest.Events(4, 1)
	evs[3].AggregateID = "other"
	evs[1].Payload = json.RawMessage(`"` + strings.Repeat("x", 4*limit) + `"`)
	errs := s.Deliver(t.Context(), evs)
	if errs[0] != nil || errs[3] != nil {
		t.Fatalf("events that fit were not delivered: %v", errs)
	}
	if errs[1] == nil || sink.Classify(errs[1]) != "event" || !strings.Contains(errs[1].Error(), "larger than") {
		t.Fatalf("too-large record: %v (kind %s), want an event error naming the size", errs[1], sink.Classify(errs[1]))
	}
	if !errors.Is(errs[2], sink.ErrHeldBack) {
		t.Fatalf("the event after the too-large one in its aggregate: %v, want held back", errs[2])
	}
	var got []sinktest.Received
	for deadline := time.Now().Add(15 * time.Second); len(got) < 2 && time.Now().Before(deadline); {
		got = readTopic(c.ListenAddrs(), topic)()
	}
	if len(got) != 2 || got[0].ID == evs[2].ID || got[1].ID == evs[2].ID {
		ids := []string{}
		for _, r := range got {
			ids = append(ids, r.ID)
		}
		t.Fatalf("topic holds %v, want only the events that fit (not the later event of the refused one's aggregate)", ids)
	}

	// The boundary: the largest payload the check lets through is produced.
	fits := func(n int) error {
		ev := sinktest.Events(1, 1)[0]
		ev.Payload = json.RawMessage(`"` + strings.Repeat("y", n) + `"`)
		return s.Deliver(t.Context(), []*sink.Event{ev})[0]
	}
	lo, hi := 0, limit // fits(lo) passes the check, fits(hi) does not
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		if err := fits(mid); err != nil && strings.Contains(err.Error(), "kafka.max_message_bytes") {
			hi = mid
		} else {
			lo = mid
		}
	}
	if err := fits(lo); err != nil {
		t.Fatalf("a payload of %d bytes passed the size check and franz-go refused it: %v", lo, err)
	}
	t.Logf("cap %d bytes: payloads up to %d bytes are produced, %d is parked", limit, lo, hi)
}

// A topic name Kafka refuses (longer than 249 characters, made from an
// aggregate type) is refused for that event, not taken for an outage.
func TestOverlongTopicIsAnEventError(t *testing.T) {
	c := cluster(t)
	s, err := kafkasink.New(kafkasink.Config{Brokers: c.ListenAddrs(), Topic: sink.MustTemplate("t.{aggregate_type}"), Timeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	evs := sinktest.Events(2, 2)
	evs[0].AggregateType = strings.Repeat("a", 300)
	errs := s.Deliver(t.Context(), evs)
	if sink.Classify(errs[0]) != "event" || !strings.Contains(errs[0].Error(), "249") || errs[1] != nil {
		t.Fatalf("errors %v: want the overlong topic refused as an event error and the other event delivered", errs)
	}
}

// A value fills one part of a topic's name: its dots and the characters
// Kafka refuses become '_'; {raw(…)} keeps the value's dots.
func TestTopicPartsFromEventData(t *testing.T) {
	c := cluster(t)
	for tpl, want := range map[string]string{
		"outbox.{aggregate_type}":      "outbox.payments_internal_x_y",
		"outbox.{raw(aggregate_type)}": "outbox.payments.internal_x_y",
	} {
		s, err := kafkasink.New(kafkasink.Config{Brokers: c.ListenAddrs(), Topic: sink.MustTemplate(tpl), Timeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if got := s.Topic(&sink.Event{AggregateType: "payments.internal/x y"}); got != want {
			t.Errorf("%s: topic %q, want %q", tpl, got, want)
		}
		s.Close()
	}
}
