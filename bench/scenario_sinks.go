package bench

import (
	"context"
	"fmt"

	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/sink"
	"github.com/compensa/compensa/sink/natssink"
	"github.com/compensa/compensa/sink/rabbitsink"
	"github.com/compensa/compensa/sink/redissink"
	"github.com/compensa/compensa/sink/webhook"
)

// SinkCase is the sinks scenario: the single-row load of scenario 1 read by
// pg_recvlogical and by the relay's stream delivering every event to a sink
// (checkpoint commits only, no sagas): a NATS JetStream stream on a
// nats-server process of its own, a webhook on a local endpoint
// that reads each request whole and answers 204 (hookEndpoint), a RabbitMQ
// exchange with one durable queue bound, and a Redis stream (appendfsync
// always), each broker a process of its own.
type SinkCase struct {
	Events            int     `json:"events"`
	RecvlogicalPerSec float64 `json:"recvlogical_events_per_sec"`
	NATSPerSec        float64 `json:"nats_sink_events_per_sec"`
	NATSRatio         float64 `json:"nats_sink_ratio"`
	WebhookPerSec     float64 `json:"webhook_sink_events_per_sec"`
	WebhookRatio      float64 `json:"webhook_sink_ratio"`
	RabbitMQPerSec    float64 `json:"rabbitmq_sink_events_per_sec,omitempty"`
	RabbitMQRatio     float64 `json:"rabbitmq_sink_ratio,omitempty"`
	RedisPerSec       float64 `json:"redis_sink_events_per_sec,omitempty"`
	RedisRatio        float64 `json:"redis_sink_ratio,omitempty"`
	// The spread of the passes' ratios: (max − min) / median.
	NATSRatioSpread    *float64 `json:"nats_sink_ratio_spread"`
	WebhookRatioSpread *float64 `json:"webhook_sink_ratio_spread"`
}

func (r *run) sinksScenario(ctx context.Context) error {
	n := r.sz.streamEvents
	e := r.env
	if err := e.reset(ctx); err != nil {
		return err
	}
	if _, err := e.pool.Exec(ctx, `TRUNCATE relay_sink_parked, relay_sinks`); err != nil {
		return fmt.Errorf("bench: reset sink tables: %w", err)
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
	brokers, err := startBrokers(func(n string) { r.report.Notes = append(r.report.Notes, "sinks: "+n) })
	if err != nil {
		return err
	}
	defer brokers.close()

	type slots struct{ recv, nats, hook, rabbit, redis string }
	runs := make([]slots, r.sz.repeats)
	for i := range runs {
		runs[i] = slots{e.slotName(fmt.Sprintf("srecv%d", i)), e.slotName(fmt.Sprintf("snats%d", i)), e.slotName(fmt.Sprintf("shook%d", i)),
			e.slotName(fmt.Sprintf("srabbit%d", i)), e.slotName(fmt.Sprintf("sredis%d", i))}
		if _, err := e.createSlot(ctx, runs[i].recv, false); err != nil {
			return err
		}
		for _, s := range []string{runs[i].nats, runs[i].hook, runs[i].rabbit, runs[i].redis} {
			if _, err := e.createSlot(ctx, s, true); err != nil {
				return err
			}
		}
	}
	r.progress("sinks: loading %d outbox rows, one per transaction", n)
	if err := e.load(ctx, n, 1, benchEventType, 0); err != nil {
		return err
	}
	end, err := e.currentLSN(ctx)
	if err != nil {
		return err
	}
	var a, nb, wb, nr, wr, qb, qr, sb, sr []float64
	for i, sl := range runs {
		e.checkpoint(ctx)
		r.progress("sinks: run %d/%d pg_recvlogical to %s", i+1, len(runs), end)
		took, err := e.runRecvlogical(ctx, sl.recv, end, r.sz.timeout, false)
		if err != nil {
			return err
		}
		ra := rate(n, took)

		r.progress("sinks: run %d/%d relay stream to a NATS JetStream sink", i+1, len(runs))
		ns, err := natssink.New(natssink.Config{URL: natsURL, Stream: fmt.Sprintf("BENCH%d", i),
			Subject: sink.MustTemplate(fmt.Sprintf("bench%d.{aggregate_type}.{event_type}", i))})
		if err != nil {
			return err
		}
		rn, err := consume(ctx, consumeOptions{URL: e.url, Publication: e.pub, Slot: sl.nats, Registry: saga.NewRegistry(),
			Want: n, Timeout: r.sz.timeout, Logger: r.log,
			Destinations: []sink.Destination{{Spec: sink.Spec{Name: fmt.Sprintf("nats%d", i), NATS: &sink.NATSSpec{}}, Sink: ns}}})
		ns.Close()
		if err != nil {
			return err
		}

		r.progress("sinks: run %d/%d relay stream to a webhook sink (local endpoint answering 204)", i+1, len(runs))
		wh, err := webhook.New(webhook.Config{URL: hook.URL, Secret: "whsec_YmVuY2gtYmVuY2gtYmVuY2gtYmVuY2g=", Concurrency: sink.DefaultWebhookConcurrency})
		if err != nil {
			return err
		}
		rw, err := consume(ctx, consumeOptions{URL: e.url, Publication: e.pub, Slot: sl.hook, Registry: saga.NewRegistry(),
			Want: n, Timeout: r.sz.timeout, Logger: r.log,
			Destinations: []sink.Destination{{Spec: sink.Spec{Name: fmt.Sprintf("hook%d", i), Webhook: &sink.WebhookSpec{}}, Sink: wh}}})
		wh.Close()
		if err != nil {
			return err
		}
		rnRate, rwRate := rate(rn.Events, rn.Took), rate(rw.Events, rw.Took)
		a, nb, wb = append(a, ra), append(nb, rnRate), append(wb, rwRate)
		nr, wr = append(nr, rnRate/ra), append(wr, rwRate/ra)

		if brokers.rabbit != nil {
			r.progress("sinks: run %d/%d relay stream to a RabbitMQ sink (durable queue, confirms)", i+1, len(runs))
			exchange := fmt.Sprintf("bench%d", i)
			if err := brokers.rabbitTopology(exchange); err != nil {
				return err
			}
			rs, err := rabbitsink.New(rabbitsink.Config{URL: brokers.rabbit.URL(), Password: brokers.rabbit.Password, Exchange: exchange,
				RoutingKey: sink.MustTemplate("outbox.{aggregate_type}.{event_type}")})
			if err != nil {
				return err
			}
			rq, err := consume(ctx, consumeOptions{URL: e.url, Publication: e.pub, Slot: sl.rabbit, Registry: saga.NewRegistry(),
				Want: n, Timeout: r.sz.timeout, Logger: r.log,
				Destinations: []sink.Destination{{Spec: sink.Spec{Name: fmt.Sprintf("rabbit%d", i), RabbitMQ: &sink.RabbitMQSpec{}}, Sink: rs}}})
			rs.Close()
			if err != nil {
				return err
			}
			qRate := rate(rq.Events, rq.Took)
			qb, qr = append(qb, qRate), append(qr, qRate/ra)
		}
		if brokers.redis != nil {
			r.progress("sinks: run %d/%d relay stream to a Redis streams sink (appendfsync always)", i+1, len(runs))
			if err := brokers.flushRedis(ctx); err != nil {
				return err
			}
			ds, err := redissink.New(redissink.Config{URL: brokers.redis.URL(), Password: brokers.redis.Password,
				Stream: sink.MustTemplate("outbox.{aggregate_type}")})
			if err != nil {
				return err
			}
			rd, err := consume(ctx, consumeOptions{URL: e.url, Publication: e.pub, Slot: sl.redis, Registry: saga.NewRegistry(),
				Want: n, Timeout: r.sz.timeout, Logger: r.log,
				Destinations: []sink.Destination{{Spec: sink.Spec{Name: fmt.Sprintf("redis%d", i), Redis: &sink.RedisSpec{}}, Sink: ds}}})
			ds.Close()
			if err != nil {
				return err
			}
			dRate := rate(rd.Events, rd.Took)
			sb, sr = append(sb, dRate), append(sr, dRate/ra)
		}
	}
	var parked int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM relay_sink_parked`).Scan(&parked); err != nil {
		return err
	}
	if parked > 0 {
		r.report.Notes = append(r.report.Notes, fmt.Sprintf("sinks: %d events were parked instead of delivered at once", parked))
	}
	r.report.Sinks = &SinkCase{Events: n, RecvlogicalPerSec: median(a), NATSPerSec: median(nb), NATSRatio: median(nr),
		WebhookPerSec: median(wb), WebhookRatio: median(wr), NATSRatioSpread: spread(nr), WebhookRatioSpread: spread(wr)}
	if len(qb) > 0 {
		r.report.Sinks.RabbitMQPerSec, r.report.Sinks.RabbitMQRatio = median(qb), median(qr)
	}
	if len(sb) > 0 {
		r.report.Sinks.RedisPerSec, r.report.Sinks.RedisRatio = median(sb), median(sr)
	}
	return nil
}
