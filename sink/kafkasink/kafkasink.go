// Package kafkasink delivers outbox events to Kafka with franz-go's
// idempotent producer: key = aggregate_id (one aggregate, one partition, in
// order), value = payload, header "id" = the outbox row's id, and the row's
// fields and headers as headers; or, with a cloudevents format, a
// CloudEvent per the Kafka protocol binding (ce_ headers in binary mode). Deliver waits for every produce callback.
package kafkasink

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/compensa/compensa/sink"
)

// Config configures a Kafka sink.
type Config struct {
	Brokers []string
	Topic   sink.Template
	// Timeout bounds each record's delivery (retries included).
	Timeout time.Duration
	// MaxMessageBytes is the topics' max.message.bytes (0: Kafka's default,
	// 1,000,012); it becomes the producer's ProducerBatchMaxBytes.
	MaxMessageBytes int
	// Opts are extra client options (tests: a shorter metadata refresh).
	Opts []kgo.Opt
	// Format is sink.FormatEnvelope (or empty), sink.FormatCloudEvents
	// (binary content mode: attributes as ce_ headers, datacontenttype as
	// content-type, per the Kafka protocol binding) or
	// sink.FormatCloudEventsStructured.
	Format string
	// Source is the CloudEvents source.
	Source string
}

// Sink is a Kafka destination; safe for concurrent use.
type Sink struct {
	cfg Config
	cl  *kgo.Client
	// maxBytes is the producer's cap on a record batch per topic.
	maxBytes func(topic string) int32
}

var _ sink.Sink = (*Sink)(nil)

// New creates the client; it connects lazily, so a relay starts while Kafka
// is down and parks meanwhile.
func New(cfg Config) (*Sink, error) {
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	opts := append([]kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.AllowAutoTopicCreation(),
		kgo.RequiredAcks(kgo.AllISRAcks()), // the idempotent producer's default, said out loud
		kgo.RecordDeliveryTimeout(cfg.Timeout),
		kgo.ProducerLinger(0),
	}, cfg.Opts...)
	if cfg.MaxMessageBytes > 0 {
		opts = append(opts, kgo.ProducerBatchMaxBytes(int32(cfg.MaxMessageBytes)))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("kafka sink: %w", err)
	}
	maxBytes, _ := cl.OptValue(kgo.ProducerBatchMaxBytesFn).(func(string) int32)
	return &Sink{cfg: cfg, cl: cl, maxBytes: maxBytes}, nil
}

// recordBatchOverhead is the wire size of a record batch holding no
// record (franz-go's constant, plus room for a flexible request's varints).
const recordBatchOverhead = 61 + 5

// batchBytes is the size of a record batch holding rec alone, as franz-go
// counts it against ProducerBatchMaxBytes (first record: both deltas 0).
func batchBytes(rec *kgo.Record) int {
	l := 1 + 1 + 1 + // attributes, timestamp delta, offset delta
		varintLen(len(rec.Key)) + len(rec.Key) + varintLen(len(rec.Value)) + len(rec.Value) + varintLen(len(rec.Headers))
	for _, h := range rec.Headers {
		l += varintLen(len(h.Key)) + len(h.Key) + varintLen(len(h.Value)) + len(h.Value)
	}
	return recordBatchOverhead + varintLen(l) + l
}

// varintLen is the length of n as a zig-zag varint.
func varintLen(n int) int {
	u := uint64(n)<<1 ^ uint64(int64(n)>>63)
	return max(1, (bits.Len64(u)+6)/7)
}

// Topic is the topic an event is produced to (an expression that fails
// fills its part with "_"; Deliver refuses such an event).
func (s *Sink) Topic(ev *sink.Event) string { return s.cfg.Topic.Expand(ev, cleanPart) }

// cleanPart makes a value one part of a topic's name.
func cleanPart(v string) string {
	return strings.Map(func(r rune) rune {
		// '.' separates the parts of a topic's name: a value is one
		// part ({raw(…)} keeps its dots).
		if r < 128 && (r == '_' || r == '-' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			return r
		}
		return '_'
	}, v)
}

// Record is the record ev is produced as. The error refuses this event:
// an expression of the topic failed, or Kafka refuses the topic's name.
func Record(cfg Config, ev *sink.Event) (*kgo.Record, error) {
	topic, err := cfg.Topic.Render(ev, cleanPart)
	if err != nil {
		return nil, sink.EventError(err)
	}
	if err := checkTopic(topic); err != nil {
		// The broker would refuse it for every record: refuse this
		// event, not the sink.
		return nil, sink.EventError(err)
	}
	enc := ev.Encode(cfg.Format, cfg.Source, "ce_", "content-type", nil)
	rec := &kgo.Record{Topic: topic, Key: []byte(ev.AggregateID), Value: enc.Body}
	rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: "id", Value: []byte(ev.ID)})
	for _, h := range enc.Headers {
		if h.Key != "id" {
			rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: h.Key, Value: []byte(h.Value)})
		}
	}
	return rec, nil
}

// Deliver produces evs in order and waits for every callback.
func (s *Sink) Deliver(ctx context.Context, evs []*sink.Event) []error {
	errs := make([]error, len(evs))
	var wg sync.WaitGroup
	// Aggregates with an event refused before producing: producing their
	// later events would put them ahead of it.
	refused := map[string]bool{}
	for i, ev := range evs {
		if refused[ev.AggregateKey()] {
			errs[i] = sink.ErrHeldBack
			continue
		}
		rec, err := Record(s.cfg, ev)
		if err != nil {
			errs[i] = err
			refused[ev.AggregateKey()] = true
			continue
		}
		// franz-go fails a record larger than its batch cap, but only from
		// the callback, after the aggregate's later records were handed
		// over: check first, so a too-large record is never produced.
		if s.maxBytes != nil {
			if size, limit := batchBytes(rec), int(s.maxBytes(rec.Topic)); size > limit {
				errs[i] = sink.EventError(fmt.Errorf("record of %d bytes is larger than the %d bytes topic %s takes (kafka.max_message_bytes)", size, limit, rec.Topic))
				refused[ev.AggregateKey()] = true
				continue
			}
		}
		wg.Add(1)
		s.cl.Produce(ctx, rec, func(_ *kgo.Record, err error) {
			errs[i] = classify(err)
			wg.Done()
		})
	}
	wg.Wait()
	failed := map[string]bool{}
	for i, ev := range evs {
		k := ev.AggregateKey()
		if failed[k] && errs[i] == nil {
			errs[i] = sink.ErrHeldBack
		}
		if errs[i] != nil {
			failed[k] = true
		}
	}
	return errs
}

// maxTopicBytes is the longest topic name Kafka takes.
const maxTopicBytes = 249

// checkTopic refuses a topic name Kafka refuses (Topic has already mapped
// every character to one Kafka takes).
func checkTopic(topic string) error {
	switch {
	case len(topic) > maxTopicBytes:
		return fmt.Errorf("topic of %d characters is longer than the %d Kafka takes", len(topic), maxTopicBytes)
	case topic == "." || topic == "..":
		return fmt.Errorf("topic %q is not a name Kafka takes", topic)
	}
	return nil
}

func classify(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.RecordListTooLarge) || errors.Is(err, kerr.InvalidRecord) || errors.Is(err, kerr.InvalidTopicException) {
		return sink.EventError(err)
	}
	return err
}

// Close flushes nothing (every record was awaited) and closes the client.
func (s *Sink) Close() error {
	s.cl.Close()
	return nil
}
