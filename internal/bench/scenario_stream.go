package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"

	"github.com/compensa/compensa/cdc"
	"github.com/compensa/compensa/correlator"
	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/saga"
)

// streamScenario is scenario 1: the same WAL consumed by pg_recvlogical, by
// the relay's stream with checkpoint commits only, and by the stream with the
// correlator starting one saga per event; then the correlator alone, to
// show what a batch costs without the stream.
func (r *run) streamScenario(ctx context.Context) error {
	for _, perTx := range r.sz.streamShapes {
		c, err := r.streamCase(ctx, perTx)
		if err != nil {
			return fmt.Errorf("%d rows per transaction: %w", perTx, err)
		}
		r.report.Stream = append(r.report.Stream, c)
	}
	return r.correlatorAlone(ctx)
}

func (r *run) streamCase(ctx context.Context, perTx int) (StreamCase, error) {
	n := r.sz.streamEvents
	c := StreamCase{RowsPerTx: perTx, Events: n}
	e := r.env
	if err := e.reset(ctx); err != nil {
		return c, err
	}
	// Every consumer's slot exists before the first row is written, so all
	// three decode the same WAL from the same point.
	recvSlot, streamSlot, corrSlot := e.slotName("recv"), e.slotName("stream"), e.slotName("corr")
	if _, err := e.createSlot(ctx, recvSlot, false); err != nil {
		return c, err
	}
	for _, s := range []string{streamSlot, corrSlot} {
		if _, err := e.createSlot(ctx, s, true); err != nil {
			return c, err
		}
	}
	r.progress("stream: loading %d outbox rows, %d per transaction", n, perTx)
	if err := e.load(ctx, n, perTx, benchEventType, 0); err != nil {
		return c, err
	}
	end, err := e.currentLSN(ctx)
	if err != nil {
		return c, err
	}
	e.checkpoint(ctx)

	r.progress("stream: (a) pg_recvlogical to %s", end)
	took, err := e.runRecvlogical(ctx, recvSlot, end, r.sz.timeout)
	if err != nil {
		return c, err
	}
	c.RecvlogicalSeconds, c.RecvlogicalPerSec = took.Seconds(), rate(n, took)

	r.progress("stream: (b) relay stream, checkpoint commits only")
	b, err := consume(ctx, consumeOptions{URL: e.url, Publication: e.pub, Slot: streamSlot,
		Registry: saga.NewRegistry(), Want: n, Timeout: r.sz.timeout, Logger: r.log})
	if err != nil {
		return c, err
	}
	c.StreamSeconds, c.StreamPerSec, c.StreamBatches = b.Took.Seconds(), rate(n, b.Took), b.Batches
	c.StreamSinkBusy = share(b.SinkBusy, b.Took)

	r.progress("stream: (c) relay stream + correlator, one saga per event")
	cr, err := consume(ctx, consumeOptions{URL: e.url, Publication: e.pub, Slot: corrSlot,
		Registry: benchRegistry(nil), Want: n, Timeout: r.sz.timeout, Logger: r.log})
	if err != nil {
		return c, err
	}
	c.CorrelateSeconds, c.CorrelatePerSec, c.CorrelateBatches = cr.Took.Seconds(), rate(n, cr.Took), cr.Batches
	c.CorrelateSinkBusy = share(cr.SinkBusy, cr.Took)
	var started int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM saga_instances`).Scan(&started); err != nil {
		return c, err
	}
	if started != n {
		return c, fmt.Errorf("the correlator started %d sagas for %d events", started, n)
	}
	if c.RecvlogicalPerSec > 0 {
		c.StreamRatio = c.StreamPerSec / c.RecvlogicalPerSec
		c.CorrelateRatio = c.CorrelatePerSec / c.RecvlogicalPerSec
	}
	r.progress("stream: %d rows/tx: pg_recvlogical %.0f ev/s, stream %.0f ev/s (%.2f), stream+correlator %.0f ev/s (%.2f)",
		perTx, c.RecvlogicalPerSec, c.StreamPerSec, c.StreamRatio, c.CorrelatePerSec, c.CorrelateRatio)
	return c, nil
}

// correlatorAlone feeds the correlator synthetic batches (no stream, no
// WAL) of 1, 100 and 1,000 events, each starting one saga per event: the cost of a
// batch on its own, which bounds what the stream can reach when it hands
// over one batch per source transaction.
func (r *run) correlatorAlone(ctx context.Context) error {
	e := r.env
	corr, err := correlator.New(e.pool, &correlator.Config{Registry: benchRegistry(nil), Logger: r.log})
	if err != nil {
		return err
	}
	total := min(r.sz.streamEvents, 20000)
	var lsn pglogrepl.LSN = 0x10000000
	tenant := uuid.MustParse(benchTenant)
	for _, size := range []int{1, 100, 1000} {
		if err := e.reset(ctx); err != nil {
			return err
		}
		batches := total / size
		evs := make([]outbox.Event, size)
		began := time.Now()
		for i := range batches {
			lsn += 0x100
			for j := range evs {
				seq := i*size + j
				evs[j] = outbox.Event{ID: uuid.New(), TenantID: tenant, AggregateType: "order",
					AggregateID: fmt.Sprint(seq), EventType: benchEventType,
					Payload: fmt.Appendf(nil, `{"seq": %d, "currency": "EUR", "order_id": "%s", "amount_cents": 4200}`, seq, uuid.New()),
					LSN:     uint64(lsn)}
			}
			b := cdc.Batch{Slot: e.slotName("alone"), Events: evs, CommitLSN: lsn, EndLSN: lsn + 0x10, CommitTime: time.Now()}
			if err := corr.HandleBatch(ctx, b); err != nil {
				return err
			}
		}
		took := time.Since(began)
		cc := CorrelatorCase{BatchEvents: size, Batches: batches, EventsPerSec: rate(batches*size, took), BatchesPerSec: rate(batches, took)}
		r.report.CorrelatorAlone = append(r.report.CorrelatorAlone, cc)
		r.progress("stream: correlator alone, %d events/batch: %.0f events/s, %.0f batches/s", size, cc.EventsPerSec, cc.BatchesPerSec)
	}
	return nil
}
