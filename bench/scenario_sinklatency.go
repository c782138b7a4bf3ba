package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/compensa/compensa/cdc"
	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/sink"
	"github.com/compensa/compensa/sink/kafkasink"
	"github.com/compensa/compensa/sink/natssink"
	"github.com/compensa/compensa/sink/rabbitsink"
	"github.com/compensa/compensa/sink/redissink"
	"github.com/compensa/compensa/sink/webhook"
)

// SinkLatencyCase is the sink latency scenario for one sink and rate: a
// producer commits single-row outbox transactions at Rate events/s for a
// fixed window while the relay's stream delivers them to the sink, with the
// correlator starting the bench saga for every event in the same batch
// transactions (the sagas' steps are not run); each
// event's latency runs from the producer's clock_timestamp() in the row
// (created_at, written by the inserting statement, which commits on its own)
// to the sink's acknowledgement of that event: the NATS PubAck, the Kafka
// produce ack, the webhook's 2xx, RabbitMQ's publisher confirm, the reply
// to Redis's XADD script.
type SinkLatencyCase struct {
	Sink         string         `json:"sink"`
	Rate         int            `json:"rate"`
	AchievedRate float64        `json:"achieved_rate"`
	Seconds      float64        `json:"seconds"`
	Latency      LatencySummary `json:"latency"`
	// Where the latency goes: from created_at to the start of the Deliver
	// call that carried the event (the stream, the batch before and its
	// commit), the Deliver calls' durations, the gaps between one call's
	// end and the next one's start (the correlator's commit, the stream's
	// next batch), and the largest batch.
	// The upstream part of BeforeDeliver, per stream batch: from the
	// newest event's created_at to its transaction's commit timestamp, and
	// from that commit timestamp to the stream handing the batch over (the
	// WAL flush, decoding, the stream's queue behind earlier batches).
	InsertToCommit LatencySummary `json:"insert_to_commit"`
	CommitToRelay  LatencySummary `json:"commit_to_relay"`
	BeforeDeliver  LatencySummary `json:"before_deliver"`
	Deliver        LatencySummary `json:"deliver"`
	Between        LatencySummary `json:"between_deliveries"`
	MaxBatch       int            `json:"max_batch_events"`
}

// SinkFloorCase is the sinks' floor at one rate: created_at → receipt by a
// bare replication reader (see floorLatency).
type SinkFloorCase struct {
	Rate    int            `json:"rate"`
	Latency LatencySummary `json:"latency"`
}

// floorFor is the floor measured at rate, if any.
func (r *Report) floorFor(rate int) (LatencySummary, bool) {
	for _, f := range r.SinkFloor {
		if f.Rate == rate {
			return f.Latency, true
		}
	}
	return LatencySummary{}, false
}

// sinkLatencyRuns are the cases of the scenario, in the order they run.
func (r *run) sinkLatencyRuns() []struct {
	sink string
	rate int
} {
	low, high := 1000, 5000
	if r.cfg.Quick {
		low, high = 200, 1000
	}
	return []struct {
		sink string
		rate int
	}{{"nats", low}, {"nats", high}, {"webhook", low}, {"webhook", high}, {"kafka", low}, {"kafka", high},
		{"rabbitmq", low}, {"rabbitmq", high}, {"redis", low}, {"redis", high}}
}

func (r *run) sinkLatencyScenario(ctx context.Context) error {
	window := 10 * time.Second
	if r.cfg.Quick {
		window = 2 * time.Second
	}
	ns, natsURL, err := startNATS(ctx)
	if err != nil {
		return err
	}
	defer ns.Shutdown()
	hook, err := startHookEndpoint()
	if err != nil {
		return err
	}
	defer hook.Close()
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(3))
	if err != nil {
		return fmt.Errorf("bench: start an in-process Kafka broker: %w", err)
	}
	defer kc.Close()
	brokers, err := startBrokers(func(n string) { r.report.Notes = append(r.report.Notes, "sinklatency: "+n) })
	if err != nil {
		return err
	}
	defer brokers.close()

	seen := map[int]bool{}
	for _, c := range r.sinkLatencyRuns() {
		if seen[c.rate] {
			continue
		}
		seen[c.rate] = true
		r.progress("sinklatency: the floor, a bare replication reader, at %d events/s for %s", c.rate, window)
		fl, err := r.floorLatency(ctx, c.rate, window)
		if err != nil {
			return fmt.Errorf("the floor at %d events/s: %w", c.rate, err)
		}
		r.progress("sinklatency: the floor at %d events/s: p50 %.1f ms, p95 %.1f ms, p99 %.1f ms, max %.1f ms",
			c.rate, fl.P50, fl.P95, fl.P99, fl.Max)
		r.report.SinkFloor = append(r.report.SinkFloor, SinkFloorCase{Rate: c.rate, Latency: fl})
	}
	for i, c := range r.sinkLatencyRuns() {
		var (
			s    sink.Sink
			spec = sink.Spec{Name: fmt.Sprintf("lat%s%d", c.sink, i)}
		)
		switch c.sink {
		case "nats":
			s, err = natssink.New(natssink.Config{URL: natsURL, Stream: fmt.Sprintf("LAT%d", i),
				Subject: sink.MustTemplate(fmt.Sprintf("lat%d.{aggregate_type}.{event_type}", i))})
			spec.NATS = &sink.NATSSpec{}
		case "webhook":
			s, err = webhook.New(webhook.Config{URL: hook.URL, Secret: "whsec_YmVuY2gtYmVuY2gtYmVuY2gtYmVuY2g=", Concurrency: sink.DefaultWebhookConcurrency})
			spec.Webhook = &sink.WebhookSpec{}
		case "kafka":
			s, err = kafkasink.New(kafkasink.Config{Brokers: kc.ListenAddrs(), Topic: sink.MustTemplate(fmt.Sprintf("lat%d.{aggregate_type}", i))})
			spec.Kafka = &sink.KafkaSpec{}
		case "rabbitmq":
			if brokers.rabbit == nil {
				continue
			}
			exchange := fmt.Sprintf("lat%d", i)
			if err := brokers.rabbitTopology(exchange); err != nil {
				return err
			}
			s, err = rabbitsink.New(rabbitsink.Config{URL: brokers.rabbit.URL(), Password: brokers.rabbit.Password, Exchange: exchange,
				RoutingKey: sink.MustTemplate("outbox.{aggregate_type}.{event_type}")})
			spec.RabbitMQ = &sink.RabbitMQSpec{}
		case "redis":
			if brokers.redis == nil {
				continue
			}
			if err := brokers.flushRedis(ctx); err != nil {
				return err
			}
			s, err = redissink.New(redissink.Config{URL: brokers.redis.URL(), Password: brokers.redis.Password,
				Stream: sink.MustTemplate(fmt.Sprintf("lat%d.{aggregate_type}", i))})
			spec.Redis = &sink.RedisSpec{}
		}
		if err != nil {
			return err
		}
		r.progress("sinklatency: %s sink at %d events/s for %s", c.sink, c.rate, window)
		lc, err := r.sinkLatencyCase(ctx, spec, s, c.rate, window)
		s.Close()
		if err != nil {
			return fmt.Errorf("%s sink at %d events/s: %w", c.sink, c.rate, err)
		}
		lc.Sink = c.sink
		r.progress("sinklatency: %s sink at %d events/s: p50 %.1f ms, p95 %.1f ms, p99 %.1f ms, max %.1f ms; per batch insert→commit p99 %.1f max %.1f ms, commit→relay p50 %.1f p99 %.1f max %.1f ms; before Deliver p50 %.1f p99 %.1f ms; %d Deliver calls p50 %.1f p99 %.1f max %.1f ms, largest %d events; between calls p99 %.1f max %.1f ms",
			c.sink, c.rate, lc.Latency.P50, lc.Latency.P95, lc.Latency.P99, lc.Latency.Max,
			lc.InsertToCommit.P99, lc.InsertToCommit.Max, lc.CommitToRelay.P50, lc.CommitToRelay.P99, lc.CommitToRelay.Max, lc.BeforeDeliver.P50, lc.BeforeDeliver.P99,
			lc.Deliver.Count, lc.Deliver.P50, lc.Deliver.P99, lc.Deliver.Max, lc.MaxBatch, lc.Between.P99, lc.Between.Max)
		r.report.SinkLatency = append(r.report.SinkLatency, lc)
	}
	return nil
}

// sinkLatencyCase measures one sink at one rate: the stream starts, one
// warm-up event is delivered (the stream's start-up is not the sink's
// latency), then the producer runs for window at perSec.
func (r *run) sinkLatencyCase(ctx context.Context, spec sink.Spec, s sink.Sink, perSec int, window time.Duration) (SinkLatencyCase, error) {
	e := r.env
	var lc SinkLatencyCase
	if err := e.reset(ctx); err != nil {
		return lc, err
	}
	if _, err := e.pool.Exec(ctx, `TRUNCATE relay_sink_parked, relay_sinks`); err != nil {
		return lc, fmt.Errorf("bench: reset sink tables: %w", err)
	}
	slot := e.slotName(spec.Name)
	if _, err := e.createSlot(ctx, slot, true); err != nil {
		return lc, err
	}
	count := int(int64(perSec) * int64(window) / int64(time.Second))
	ts := &timedSink{Sink: s, first: make(chan struct{})}
	prod, err := newProducer(ctx, e.url, newTimeline(count+1))
	if err != nil {
		return lc, err
	}
	defer prod.close()
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		// A relay that only relays, as in the sinks' throughput part: no
		// saga starts on these events. Starting 5,000 sagas a second is
		// what part 2 measures; here it would charge the sinks with the
		// correlator's inserts.
		_, err := consume(cctx, consumeOptions{URL: e.url, Publication: e.pub, Slot: slot, Registry: saga.NewRegistry(),
			Want: count + 1, Timeout: r.sz.timeout, Logger: r.log,
			Destinations: []sink.Destination{{Spec: spec, Sink: ts}}, OnBatch: ts.batchIn})
		done <- err
	}()
	if err := prod.produce(ctx, 0, 1, 1); err != nil {
		return lc, err
	}
	select {
	case <-ts.first:
	case err := <-done:
		return lc, fmt.Errorf("the stream ended before the warm-up event: %v", err)
	case <-time.After(r.sz.timeout):
		return lc, fmt.Errorf("the warm-up event was not delivered within %s", r.sz.timeout)
	}
	ts.reset()
	began := time.Now()
	if err := prod.produce(ctx, 1, count, perSec); err != nil {
		return lc, err
	}
	produced := time.Since(began)
	if err := <-done; err != nil {
		return lc, err
	}
	var parked int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM relay_sink_parked`).Scan(&parked); err != nil {
		return lc, err
	}
	if parked > 0 {
		return lc, fmt.Errorf("%d events were parked instead of delivered", parked)
	}
	ts.mu.Lock()
	lat, before, calls := ts.lat, ts.before, ts.calls
	lc.InsertToCommit, lc.CommitToRelay = summarize(ts.insertToCommit), summarize(ts.commitToRelay)
	ts.mu.Unlock()
	if len(lat) != count {
		return lc, fmt.Errorf("%d of %d events acknowledged", len(lat), count)
	}
	lc.Rate, lc.Seconds, lc.AchievedRate, lc.Latency = perSec, produced.Seconds(), rate(count, produced), summarize(lat)
	lc.BeforeDeliver = summarize(before)
	var took, between []time.Duration
	for i, c := range calls {
		took = append(took, c.end.Sub(c.start))
		if i > 0 {
			between = append(between, c.start.Sub(calls[i-1].end))
		}
		lc.MaxBatch = max(lc.MaxBatch, c.events)
	}
	lc.Deliver, lc.Between = summarize(took), summarize(between)
	return lc, nil
}

// timedSink records, for each event the wrapped sink acknowledges, the time
// since the event's created_at (the producer's clock_timestamp(); the server
// and the bench share the machine's clock).
type timedSink struct {
	sink.Sink
	first     chan struct{}
	firstOnce sync.Once
	mu        sync.Mutex
	lat       []time.Duration
	before    []time.Duration // created_at to the start of the event's Deliver call
	calls     []deliverCall
	// per stream batch (see SinkLatencyCase)
	insertToCommit, commitToRelay []time.Duration
}

// batchIn records, for a batch the stream hands over, how long its newest
// event took to commit and the commit to reach the relay's sinks.
func (t *timedSink) batchIn(b *cdc.Batch) {
	now := time.Now()
	var newest time.Time
	for i := range b.Events {
		if c := b.Events[i].CreatedAt; c.After(newest) {
			newest = c
		}
	}
	if newest.IsZero() || b.CommitTime.IsZero() {
		return
	}
	t.mu.Lock()
	t.insertToCommit = append(t.insertToCommit, b.CommitTime.Sub(newest))
	t.commitToRelay = append(t.commitToRelay, now.Sub(b.CommitTime))
	t.mu.Unlock()
}

type deliverCall struct {
	start, end time.Time
	events     int
}

func (t *timedSink) Deliver(ctx context.Context, evs []*sink.Event) []error {
	start := time.Now()
	errs := t.Sink.Deliver(ctx, evs)
	now := time.Now()
	t.mu.Lock()
	for i, ev := range evs {
		if errs[i] == nil && !ev.CreatedAt.IsZero() {
			t.lat = append(t.lat, now.Sub(ev.CreatedAt))
			t.before = append(t.before, start.Sub(ev.CreatedAt))
		}
	}
	t.calls = append(t.calls, deliverCall{start: start, end: now, events: len(evs)})
	t.mu.Unlock()
	t.firstOnce.Do(func() { close(t.first) })
	return errs
}

func (t *timedSink) reset() {
	t.mu.Lock()
	t.lat, t.before, t.calls, t.insertToCommit, t.commitToRelay = nil, nil, nil, nil, nil
	t.mu.Unlock()
}
