package kafkasink_test

import (
	"context"
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
				out = append(out, sinktest.Received{ID: h["id"], Headers: h, Payload: r.Value})
			})
			if n == 0 {
				return out
			}
		}
	}
}

func TestConformance(t *testing.T) {
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

// TestInjectedProduceFaults: produces that fail a few times (the idempotent
// producer retries them) still deliver every record once, in order.
func TestInjectedProduceFaults(t *testing.T) {
	c := cluster(t)
	s, err := kafkasink.New(kafkasink.Config{Brokers: c.ListenAddrs(), Topic: sink.MustTemplate("outbox.event.{aggregate_type}"), Timeout: 10 * time.Second})
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
	for i, err := range s.Deliver(t.Context(), evs) {
		if err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
	}
	if h.Hits() == 0 {
		t.Fatal("the injected fault was never hit")
	}
	got := readTopic(c.ListenAddrs(), "outbox.event.order")()
	counts := map[string]int{}
	for _, r := range got {
		counts[r.ID]++
	}
	for _, ev := range evs {
		if counts[ev.ID] != 1 {
			t.Fatalf("event %s received %d times", ev.ID, counts[ev.ID])
		}
	}
}
