package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/compensa/compensa/cdc"
	"github.com/compensa/compensa/correlator"
	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/saga"
)

// streamScenario is scenario 1: the same WAL consumed by pg_recvlogical, by
// the relay's stream with checkpoint commits only, and by the stream with the
// correlator starting one saga per event; then the correlator alone, to
// show what a batch costs without the stream.
//
// The messages variant measures the same with the events written as
// transactional logical decoding messages instead of outbox rows, and what
// each costs its producer (producerCost).
func (r *run) streamScenario(ctx context.Context) error {
	for _, source := range []string{SourceRows, SourceMessages} {
		for _, perTx := range r.sz.streamShapes {
			c, err := r.streamCase(ctx, perTx, source)
			if err != nil {
				return fmt.Errorf("%d %s per transaction: %w", perTx, source, err)
			}
			r.report.Stream = append(r.report.Stream, c)
		}
	}
	if err := r.producerCost(ctx); err != nil {
		return err
	}
	return r.correlatorAlone(ctx)
}

// Where a stream case's events are written.
const (
	SourceRows     = "rows"
	SourceMessages = "messages"
)

func (r *run) streamCase(ctx context.Context, perTx int, source string) (StreamCase, error) {
	n := r.sz.streamEvents
	if perTx > 1 {
		n = r.sz.batchedStreamEvents
	}
	c := StreamCase{RowsPerTx: perTx, Events: n, Source: source}
	e := r.env
	if err := e.reset(ctx); err != nil {
		return c, err
	}
	// Every consumer's slot exists before the first row is written, so that
	// all of them decode the same WAL from the same point; one slot per
	// consumer and repetition.
	type slots struct{ recv, stream, corr string }
	runs := make([]slots, r.sz.repeats)
	for i := range runs {
		runs[i] = slots{e.slotName(fmt.Sprintf("recv%d", i)), e.slotName(fmt.Sprintf("stream%d", i)), e.slotName(fmt.Sprintf("corr%d", i))}
		if _, err := e.createSlot(ctx, runs[i].recv, false); err != nil {
			return c, err
		}
		for _, s := range []string{runs[i].stream, runs[i].corr} {
			if _, err := e.createSlot(ctx, s, true); err != nil {
				return c, err
			}
		}
	}
	r.progress("stream: loading %d outbox %s, %d per transaction", n, source, perTx)
	load := e.load
	if source == SourceMessages {
		load = e.emit
	}
	if err := load(ctx, n, perTx, benchEventType, 0); err != nil {
		return c, err
	}
	end, err := e.currentLSN(ctx)
	if err != nil {
		return c, err
	}
	var a, b, cr, lim, bRatio, cRatio, limRatio, bBusy, cBusy []float64
	for i, sl := range runs {
		c.LoadAverages = append(c.LoadAverages, loadAverage())
		e.checkpoint(ctx)
		r.progress("stream: run %d/%d (a) pg_recvlogical to %s", i+1, len(runs), end)
		cpuA := e.startCPUMeter()
		took, err := e.runRecvlogical(ctx, sl.recv, end, r.sz.timeout, source == SourceMessages)
		if err != nil {
			return c, err
		}
		ra := rate(n, took)
		r.progress("stream: run %d/%d (a) CPU per event: %s", i+1, len(runs), cpuA.stop(n))

		r.progress("stream: run %d/%d (b) relay stream, checkpoint commits only", i+1, len(runs))
		rb, err := consume(ctx, consumeOptions{URL: e.url, Publication: e.pub, Slot: sl.stream,
			Registry: saga.NewRegistry(), Want: n, Timeout: r.sz.timeout, Logger: r.log})
		if err != nil {
			return c, err
		}

		// Each pass starts its sagas afresh: against the previous pass's
		// instances every start would be a cheaper conflict.
		if _, err := e.pool.Exec(ctx, `TRUNCATE saga_instances CASCADE`); err != nil {
			return c, err
		}
		e.checkpoint(ctx)
		r.progress("stream: run %d/%d (c) relay stream + correlator, one saga per event", i+1, len(runs))
		cpuC := e.startCPUMeter()
		rc, err := consume(ctx, consumeOptions{URL: e.url, Publication: e.pub, Slot: sl.corr,
			Registry: benchRegistry(nil), Want: n, Timeout: r.sz.timeout, Logger: r.log})
		if err != nil {
			return c, err
		}
		r.progress("stream: run %d/%d (c) CPU per event: %s", i+1, len(runs), cpuC.stop(n))
		var started int
		if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM saga_instances`).Scan(&started); err != nil {
			return c, err
		}
		if started != n {
			return c, fmt.Errorf("the correlator started %d sagas for %d events", started, n)
		}
		copied, err := e.copyStarts(ctx)
		if err != nil {
			return c, err
		}
		rl := rate(n, took+copied)
		lim, limRatio = append(lim, rl), append(limRatio, rate(n, rc.Took)/rl)
		r.progress("stream: run %d/%d the correlator's limit: decode %s + COPY of its %d rows %s = %.0f ev/s",
			i+1, len(runs), took.Round(time.Millisecond), n, copied.Round(time.Millisecond), rl)
		a, b, cr = append(a, ra), append(b, rate(n, rb.Took)), append(cr, rate(n, rc.Took))
		bRatio, cRatio = append(bRatio, rate(n, rb.Took)/ra), append(cRatio, rate(n, rc.Took)/ra)
		bBusy, cBusy = append(bBusy, share(rb.SinkBusy, rb.Took)), append(cBusy, share(rc.SinkBusy, rc.Took))
		c.StreamBatches, c.CorrelateBatches = rb.Batches, rc.Batches
		r.progress("stream: run %d/%d, %d %s/tx: pg_recvlogical %.0f ev/s, stream %.0f ev/s (%.2f), stream+correlator %.0f ev/s (%.2f)",
			i+1, len(runs), perTx, source, ra, b[i], bRatio[i], cr[i], cRatio[i])
	}
	c.RecvlogicalRuns, c.StreamRuns, c.CorrelateRuns, c.LimitRuns = a, b, cr, lim
	c.RecvlogicalPerSec, c.StreamPerSec, c.CorrelatePerSec = median(a), median(b), median(cr)
	c.StreamRatio, c.CorrelateRatio = median(bRatio), median(cRatio)
	c.CorrelateLimitPerSec, c.CorrelateLimitRatio = median(lim), median(limRatio)
	c.StreamRatioSpread, c.CorrelateRatioSpread, c.CorrelateLimitRatioSpread = spread(bRatio), spread(cRatio), spread(limRatio)
	c.StreamSinkBusy, c.CorrelateSinkBusy = median(bBusy), median(cBusy)
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

// cpuMeter reads, around one consumer's pass, the CPU time of the bench's
// process (the relay's stream and correlator run in it), of its reaped
// children (pg_recvlogical) and of the throwaway cluster's processes (the
// walsender and the correlator's backend; on a server the bench did not
// start, that part is not known). Wall times depend on what else the machine
// runs; CPU time per event much less, so it tells where the time goes and
// why one machine's ratio differs from another's.
type cpuMeter struct {
	e                    *env
	self, childU, childS time.Duration
	server               time.Duration
	serverKnown          bool
}

func (e *env) startCPUMeter() cpuMeter {
	m := cpuMeter{e: e, self: selfCPU()}
	m.childU, m.childS = childrenCPU()
	m.server, m.serverKnown = e.serverCPU()
	return m
}

// stop returns the pass's CPU per event, for n events, as text.
func (m cpuMeter) stop(n int) string {
	// A walsender's time counts once it has exited and been reaped.
	time.Sleep(200 * time.Millisecond)
	u, s := childrenCPU()
	per := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) / float64(n) }
	out := fmt.Sprintf("bench process %.2f µs, its children (pg_recvlogical) %.2f µs user + %.2f µs system",
		per(selfCPU()-m.self), per(u-m.childU), per(s-m.childS))
	if srv, ok := m.e.serverCPU(); ok && m.serverKnown {
		out += fmt.Sprintf(", PostgreSQL %.2f µs", per(srv-m.server))
	}
	return out
}

// childrenCPU is the user and system time of the bench's reaped children.
func childrenCPU() (user, sys time.Duration) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru); err != nil {
		return 0, 0
	}
	return time.Duration(ru.Utime.Nano()), time.Duration(ru.Stime.Nano())
}

// serverCPU is the CPU time of the throwaway cluster: its postmaster's live
// children and those that have exited. It reports false on a server the
// bench did not start.
func (e *env) serverCPU() (time.Duration, bool) {
	if e.cluster == nil {
		return 0, false
	}
	b, err := os.ReadFile(filepath.Join(e.cluster.DataDir, "postmaster.pid"))
	if err != nil {
		return 0, false
	}
	pm, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if err != nil {
		return 0, false
	}
	_, reaped, ok := procTimes(pm)
	if !ok {
		return 0, false
	}
	total := reaped
	kids, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pm, pm))
	for _, f := range strings.Fields(string(kids)) {
		if pid, err := strconv.Atoi(f); err == nil {
			if own, _, ok := procTimes(pid); ok {
				total += own
			}
		}
	}
	return total, true
}

// procTimes reads a process's own CPU time and that of its reaped children
// from /proc.
func procTimes(pid int) (own, reaped time.Duration, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 > len(s) {
		return 0, 0, false
	}
	f := strings.Fields(s[i+2:])
	if len(f) < 15 {
		return 0, 0, false
	}
	var t [4]int64
	for j := range t {
		t[j], _ = strconv.ParseInt(f[11+j], 10, 64)
	}
	const tick = 10 * time.Millisecond // USER_HZ is 100 on Linux
	return time.Duration(t[0]+t[1]) * tick, time.Duration(t[2]+t[3]) * tick, true
}

// producerCost measures what one event costs the application that writes
// it, as an outbox row and as a transactional logical decoding message: the
// client's time per transaction (BEGIN, the statement, COMMIT, one event
// each, one connection) and the WAL written per event; and for the row, the
// WAL and time of its later removal (DELETE, then VACUUM), which a message
// never needs. Rows and messages passes alternate; figures are medians.
// The WAL of a row includes the full-page images its index pages cost after
// a checkpoint, as it does in production.
func (r *run) producerCost(ctx context.Context) error {
	e := r.env
	// Each transaction waits for its commit's flush: 1,000 of each kind in
	// a quick run, 20,000 in a full one.
	n := min(r.sz.streamEvents/5, 20000)
	if err := e.reset(ctx); err != nil {
		return err
	}
	conn, err := e.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	walAt := func() (pglogrepl.LSN, error) {
		var s string
		if err := conn.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&s); err != nil {
			return 0, err
		}
		return pglogrepl.ParseLSN(s)
	}
	// pass runs n one-event transactions of q and returns the time per
	// transaction (µs) and the WAL per event (bytes).
	pass := func(q string, seq int64) (float64, float64, error) {
		from, err := walAt()
		if err != nil {
			return 0, 0, err
		}
		began := time.Now()
		for i := range n {
			tx, err := conn.Begin(ctx)
			if err != nil {
				return 0, 0, err
			}
			if _, err := tx.Exec(ctx, q, seq+int64(i), benchEventType); err != nil {
				tx.Rollback(ctx)
				return 0, 0, err
			}
			if err := tx.Commit(ctx); err != nil {
				return 0, 0, err
			}
		}
		took := time.Since(began)
		to, err := walAt()
		if err != nil {
			return 0, 0, err
		}
		return float64(took.Microseconds()) / float64(n), float64(to-from) / float64(n), nil
	}
	var rowTx, rowWAL, msgTx, msgWAL, cleanWAL, cleanTime []float64
	for i := range r.sz.repeats {
		r.progress("stream: producer cost, run %d/%d: %d transactions with one outbox row, then one message, each", i+1, r.sz.repeats, n)
		tx, wal, err := pass(sqlProduceRow, int64(i*n))
		if err != nil {
			return fmt.Errorf("bench: producer cost (rows): %w", err)
		}
		rowTx, rowWAL = append(rowTx, tx), append(rowWAL, wal)
		from, err := walAt()
		if err != nil {
			return err
		}
		began := time.Now()
		if _, err := conn.Exec(ctx, `DELETE FROM outbox`); err != nil {
			return err
		}
		if _, err := conn.Exec(ctx, `VACUUM outbox`); err != nil {
			return err
		}
		took := time.Since(began)
		to, err := walAt()
		if err != nil {
			return err
		}
		cleanWAL, cleanTime = append(cleanWAL, float64(to-from)/float64(n)), append(cleanTime, float64(took.Microseconds())/float64(n))
		tx, wal, err = pass(sqlProduceMessage, int64(i*n))
		if err != nil {
			return fmt.Errorf("bench: producer cost (messages): %w", err)
		}
		msgTx, msgWAL = append(msgTx, tx), append(msgWAL, wal)
	}
	p := &ProducerCost{Events: n,
		RowTxMicros: median(rowTx), MessageTxMicros: median(msgTx),
		RowWALBytes: median(rowWAL), MessageWALBytes: median(msgWAL),
		RowCleanupWALBytes: median(cleanWAL), RowCleanupMicros: median(cleanTime)}
	if p.RowTxMicros > 0 && p.RowWALBytes > 0 {
		p.TxRatio, p.WALRatio = p.MessageTxMicros/p.RowTxMicros, p.MessageWALBytes/p.RowWALBytes
		p.WALRatioWithCleanup = p.MessageWALBytes / (p.RowWALBytes + p.RowCleanupWALBytes)
	}
	r.report.Producer = p
	r.progress("stream: producer cost per event: row %.0f µs/tx, %.0f WAL bytes (+%.0f bytes, %.1f µs to delete and vacuum later); message %.0f µs/tx, %.0f WAL bytes",
		p.RowTxMicros, p.RowWALBytes, p.RowCleanupWALBytes, p.RowCleanupMicros, p.MessageTxMicros, p.MessageWALBytes)
	return nil
}

// copyStarts is the write half of the correlator's limit: a COPY, in one
// transaction, of the saga_instances rows the correlator just wrote into a
// table with the same columns and indexes, timed. The rows are read before
// the clock starts.
func (e *env) copyStarts(ctx context.Context) (time.Duration, error) {
	cols := []string{"id", "tenant_id", "workspace_id", "saga_name", "saga_version", "trigger_event_id",
		"correlation_id", "context", "timeout_at", "next_attempt_at", "trigger_aggregate_id", "traceparent"}
	if _, err := e.pool.Exec(ctx, `DROP TABLE IF EXISTS bench_limit_instances;
		CREATE TABLE bench_limit_instances (LIKE saga_instances INCLUDING ALL)`); err != nil {
		return 0, fmt.Errorf("bench: the limit's table: %w", err)
	}
	rows, err := e.pool.Query(ctx, `SELECT `+strings.Join(cols, ", ")+` FROM saga_instances`)
	if err != nil {
		return 0, err
	}
	data, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([]any, error) { return r.Values() })
	if err != nil {
		return 0, err
	}
	began := time.Now()
	if _, err := e.pool.CopyFrom(ctx, pgx.Identifier{"bench_limit_instances"}, cols, pgx.CopyFromRows(data)); err != nil {
		return 0, fmt.Errorf("bench: COPY into the limit's table: %w", err)
	}
	took := time.Since(began)
	if _, err := e.pool.Exec(ctx, `DROP TABLE bench_limit_instances`); err != nil {
		return 0, err
	}
	return took, nil
}
