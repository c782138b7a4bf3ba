// Package kafkasink delivers outbox events to Kafka with franz-go's
// idempotent producer: key = aggregate_id (one aggregate, one partition, in
// order), value = payload, header "id" = the outbox row's id, and the row's
// fields and headers as headers. Deliver waits for every produce callback.
package kafkasink

import (
	"context"
	"errors"
	"fmt"
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
	// Opts are extra client options (tests: a shorter metadata refresh).
	Opts []kgo.Opt
}

// Sink is a Kafka destination; safe for concurrent use.
type Sink struct {
	cfg Config
	cl  *kgo.Client
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
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("kafka sink: %w", err)
	}
	return &Sink{cfg: cfg, cl: cl}, nil
}

// Topic is the topic an event is produced to.
func (s *Sink) Topic(ev *sink.Event) string {
	return s.cfg.Topic.Expand(ev, func(v string) string {
		return strings.Map(func(r rune) rune {
			if r < 128 && (r == '.' || r == '_' || r == '-' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
				return r
			}
			return '_'
		}, v)
	})
}

// Deliver produces evs in order and waits for every callback.
func (s *Sink) Deliver(ctx context.Context, evs []*sink.Event) []error {
	errs := make([]error, len(evs))
	var wg sync.WaitGroup
	for i, ev := range evs {
		rec := &kgo.Record{Topic: s.Topic(ev), Key: []byte(ev.AggregateID), Value: ev.Body()}
		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: "id", Value: []byte(ev.ID)})
		for _, h := range ev.MessageHeaders() {
			if h.Key != "id" {
				rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: h.Key, Value: []byte(h.Value)})
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

func classify(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.RecordListTooLarge) || errors.Is(err, kerr.InvalidRecord) {
		return sink.EventError(err)
	}
	return err
}

// Close flushes nothing (every record was awaited) and closes the client.
func (s *Sink) Close() error {
	s.cl.Close()
	return nil
}
