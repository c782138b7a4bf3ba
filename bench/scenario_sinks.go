package bench

import (
	"context"
	"fmt"

	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/sink"
	"github.com/compensa/compensa/sink/natssink"
	"github.com/compensa/compensa/sink/webhook"
)

// SinkCase is the sinks scenario: the single-row load of scenario 1 read by
// pg_recvlogical and by the relay's stream delivering every event to a sink
// (checkpoint commits only, no sagas): a NATS JetStream stream on a
// nats-server process of its own, and a webhook on a local endpoint
// that reads each request whole and answers 204 (hookEndpoint).
type SinkCase struct {
	Events            int     `json:"events"`
	RecvlogicalPerSec float64 `json:"recvlogical_events_per_sec"`
	NATSPerSec        float64 `json:"nats_sink_events_per_sec"`
	NATSRatio         float64 `json:"nats_sink_ratio"`
	WebhookPerSec     float64 `json:"webhook_sink_events_per_sec"`
	WebhookRatio      float64 `json:"webhook_sink_ratio"`
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

	type slots struct{ recv, nats, hook string }
	runs := make([]slots, r.sz.repeats)
	for i := range runs {
		runs[i] = slots{e.slotName(fmt.Sprintf("srecv%d", i)), e.slotName(fmt.Sprintf("snats%d", i)), e.slotName(fmt.Sprintf("shook%d", i))}
		if _, err := e.createSlot(ctx, runs[i].recv, false); err != nil {
			return err
		}
		for _, s := range []string{runs[i].nats, runs[i].hook} {
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
	var a, nb, wb, nr, wr []float64
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
	}
	var parked int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM relay_sink_parked`).Scan(&parked); err != nil {
		return err
	}
	if parked > 0 {
		r.report.Notes = append(r.report.Notes, fmt.Sprintf("sinks: %d events were parked instead of delivered at once", parked))
	}
	r.report.Sinks = &SinkCase{Events: n, RecvlogicalPerSec: median(a), NATSPerSec: median(nb), NATSRatio: median(nr),
		WebhookPerSec: median(wb), WebhookRatio: median(wr)}
	return nil
}
