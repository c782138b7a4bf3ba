package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/compensa/compensa/cdc"
	"github.com/compensa/compensa/correlator"
	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/pgjournal"
)

// latencyScenario is scenario 2: the whole relay (stream, correlator, step
// runner, wired as `relay run` wires them) runs in this process while a
// producer commits single-row outbox transactions at a fixed rate. For each
// event it records, on this process's monotonic clock:
//
//   - when the producer's commit was acknowledged;
//   - when the correlator's transaction that started its saga had committed
//     (the sink's HandleBatch returned);
//   - when the saga's first step had committed (the runner's OnStep hook,
//     called after the commit).
//
// One clock for all three avoids comparing the server's now() (a
// transaction's start, not its commit) with another machine's.
//
// Each rate runs on a fresh relay over empty tables, so that a backlog left
// by one rate does not count against the next. The wait for the last events
// is bounded (drainLimit): an event still without its saga start or first
// step then counts with the time waited so far, a lower bound, and the case
// records how many there were (a relay that cannot keep up has no finite
// percentile to report).
func (r *run) latencyScenario(ctx context.Context) error {
	for i, rt := range r.sz.latencyRates {
		d := r.sz.latencyDuration
		if i == 0 {
			d = r.sz.latencyLong
		}
		c, err := r.latencyCase(ctx, rt, d)
		if err != nil {
			return fmt.Errorf("%d events/s: %w", rt, err)
		}
		r.report.Latency = append(r.report.Latency, c)
	}
	return nil
}

// drainLimit bounds the wait for the events' first steps once the producer
// is done.
func (r *run) drainLimit() time.Duration { return max(10*time.Second, r.sz.latencyDuration) }

func (r *run) latencyCase(ctx context.Context, perSec int, dur time.Duration) (LatencyCase, error) {
	count := int(float64(perSec) * dur.Seconds())
	c := LatencyCase{Rate: perSec, Produced: count}
	p, err := r.openPipeline(ctx, count+1) // seq 0 is the warm-up event
	if err != nil {
		return c, err
	}
	defer p.close()
	tl, prod, steps, streamErr := p.tl, p.prod, &p.steps, p.streamErr
	tl.stop.Store(0)
	r.progress("latency: %d events/s for %s", perSec, dur)
	steps0 := steps.Load()
	began := time.Now()
	if err := prod.produce(ctx, 1, count, perSec); err != nil {
		return c, err
	}
	produced := time.Since(began)
	c.Seconds, c.AchievedRate = produced.Seconds(), rate(count, produced)
	complete, err := tl.wait(ctx, tl.end, 1, count, max(r.drainLimit(), 2*dur), streamErr)
	if err != nil {
		return c, err
	}
	// Steps/s from the producer's start until every saga ended (or the
	// wait gave up): under overload, the rate at which the runner works
	// through the backlog.
	c.StepsPerSec = rate(int(steps.Load()-steps0), time.Since(began))
	if stop := tl.stop.Load(); stop != 0 {
		c.StepsPerSec = rate(int(steps.Load()-steps0), tl.base.Add(time.Duration(stop)).Sub(began))
	}
	c.Start, c.FirstStep, c.End, c.StartUnfinished, c.FirstStepUnfinished, c.EndUnfinished = tl.summaries(1, count)
	if !complete {
		r.progress("latency: %d events/s: %d events without a saga start and %d without a first step %s after the producer stopped; they count with the time waited (a lower bound)",
			perSec, c.StartUnfinished, c.FirstStepUnfinished, r.drainLimit())
	}
	r.progress("latency: %d events/s (achieved %.0f): start p50 %.1f p99 %.1f max %.1f ms; first step p50 %.1f p99 %.1f max %.1f ms; end p99 %.1f ms; %.0f steps/s",
		perSec, c.AchievedRate, c.Start.P50, c.Start.P99, c.Start.Max, c.FirstStep.P50, c.FirstStep.P99, c.FirstStep.Max, c.End.P99, c.StepsPerSec)
	return c, nil
}

// pipeline is the whole relay (stream, correlator, step runner, wired as
// `relay run` wires them) on a fresh slot over empty tables, with a producer,
// after one warm-up event (seq 0) went all the way through. Its timeline
// holds events [0, n).
type pipeline struct {
	tl        *timeline
	prod      *producer
	steps     atomic.Int64 // step commits (not compensations)
	ended     atomic.Int64 // sagas COMPLETED (the warm-up's included)
	streamErr chan error
	closers   []func()
}

// pipelineOptions add to the pipeline what `relay run` adds with its
// retention flags; the zero value is the latency scenario's pipeline.
type pipelineOptions struct {
	// OutboxRetention is --outbox-retention (0: the stream deletes none).
	OutboxRetention time.Duration
	// Janitor, when set, runs the retention janitor beside the runner as
	// `relay run` does (History 0 and DedupeWindow 0 is --saga-retention 0
	// --dedupe-window 0: it then only folds the status counts).
	Janitor *pgjournal.RetentionConfig
}

func (p *pipeline) close() {
	for i := len(p.closers) - 1; i >= 0; i-- {
		p.closers[i]()
	}
}

func (r *run) openPipeline(ctx context.Context, n int) (*pipeline, error) {
	return r.openPipelineWith(ctx, n, pipelineOptions{})
}

func (r *run) openPipelineWith(ctx context.Context, n int, opts pipelineOptions) (_ *pipeline, err error) {
	e := r.env
	p := &pipeline{tl: newTimeline(n), streamErr: make(chan error, 1)}
	defer func() {
		if err != nil {
			p.close()
		}
	}()
	if err := e.reset(ctx); err != nil {
		return nil, err
	}
	slot := e.slotName("latency")
	if _, err := e.createSlot(ctx, slot, true); err != nil {
		return nil, err
	}
	tl, steps, streamErr := p.tl, &p.steps, p.streamErr

	var bySeq, endSeq sync.Map // instance id → seq, from the first step's Do
	reg := benchRegistry(func(x *saga.StepTx) {
		if seq, ok := seqOf(x.State); ok {
			bySeq.Store(x.Instance.ID, seq)
			endSeq.Store(x.Instance.ID, seq)
		}
	})
	cfg := (&saga.RunnerConfig{}).WithDefaults()
	pool, err := openRelayPool(ctx, e.url, cfg.Workers)
	if err != nil {
		return nil, err
	}
	p.closers = append(p.closers, pool.Close)
	journal, err := pgjournal.New(pool, nil)
	if err != nil {
		return nil, err
	}
	runner, err := saga.NewRunner(journal, pool, reg, &saga.RunnerConfig{
		Logger: r.log.With("component", "runner"),
		Hooks: saga.Hooks{OnStep: func(ev saga.StepEvent) {
			if ev.Compensation || ev.Outcome != saga.OutcomeCompleted {
				return
			}
			steps.Add(1)
			if ev.StepName != "reserve" {
				return
			}
			if seq, ok := bySeq.LoadAndDelete(ev.InstanceID); ok {
				tl.mark(tl.step, seq.(int64))
			}
		}, OnTerminal: func(ev saga.TerminalEvent) {
			if ev.Status == saga.StatusCompleted {
				p.ended.Add(1)
			}
			if seq, ok := endSeq.LoadAndDelete(ev.InstanceID); ok && ev.Status == saga.StatusCompleted {
				tl.mark(tl.end, seq.(int64))
			}
		}},
	})
	if err != nil {
		return nil, err
	}
	corr, err := correlator.New(pool, &correlator.Config{Registry: reg, Wake: runner.Wake, Logger: r.log.With("component", "correlator")})
	if err != nil {
		return nil, err
	}
	sink := newCountingSink(corr, 0)
	sink.onBatch = func(b *cdc.Batch) {
		for i := range b.Events {
			if seq, ok := seqOf(b.Events[i].Payload); ok {
				tl.mark(tl.start, seq)
			}
		}
	}
	scfg := cdc.Config{DatabaseURL: e.url, Slot: slot, Publication: e.pub, Logger: r.log.With("component", "cdc")}
	if opts.OutboxRetention > 0 {
		scfg.Retention = opts.OutboxRetention
		// `relay run` deletes every minute; a retention shorter than two
		// minutes (the quick soak's) needs rounds to match.
		scfg.RetentionInterval = max(time.Second, min(cdc.DefaultRetentionInterval, opts.OutboxRetention/2))
	}
	stream, err := cdc.NewStream(scfg, sink)
	if err != nil {
		return nil, err
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	p.closers = append(p.closers, cancel)
	if err := runner.Start(runCtx); err != nil {
		return nil, err
	}
	go func() { streamErr <- stream.Run(runCtx) }()
	p.closers = append(p.closers, func() {
		cancel()
		select { // a stream that failed has already handed its error to a wait
		case <-streamErr:
		case <-time.After(30 * time.Second):
		}
		stopCtx, c := context.WithTimeout(context.Background(), 30*time.Second)
		defer c()
		runner.Stop(stopCtx)
	})
	if opts.Janitor != nil {
		stop, err := startJanitor(runCtx, pool, journal, reg, *opts.Janitor)
		if err != nil {
			return nil, err
		}
		p.closers = append(p.closers, func() { cancel(); stop() })
	}

	prod, err := newProducer(ctx, e.url, tl)
	if err != nil {
		return nil, err
	}
	p.prod = prod
	p.closers = append(p.closers, prod.close)

	// Warm up: one event all the way through before the clock counts.
	if err := prod.produce(ctx, 0, 1, 1); err != nil {
		return nil, err
	}
	if ok, err := tl.wait(ctx, tl.end, 0, 1, 60*time.Second, streamErr); err != nil || !ok {
		return nil, fmt.Errorf("warm-up: the first event had no first step within a minute (%v)", err)
	}
	return p, nil
}

// timeline holds, per event sequence number, the nanoseconds (since base)
// of its producer commit, saga start and first step; 0 is "not yet".
type timeline struct {
	// stop is when a bounded wait gave up (0: it did not).
	stop atomic.Int64

	base                     time.Time
	commit, start, step, end []atomic.Int64
}

func newTimeline(n int) *timeline {
	return &timeline{base: time.Now(), commit: make([]atomic.Int64, n), start: make([]atomic.Int64, n),
		step: make([]atomic.Int64, n), end: make([]atomic.Int64, n)}
}

func (t *timeline) mark(col []atomic.Int64, seq int64) {
	if seq < 0 || seq >= int64(len(col)) {
		return
	}
	col[seq].CompareAndSwap(0, int64(time.Since(t.base))+1)
}

// wait blocks until events [from, from+n) have reached col (their first
// step, or the saga's end), or limit passes (complete is then false, and the
// time is kept as the end of the wait), or the stream fails.
func (t *timeline) wait(ctx context.Context, col []atomic.Int64, from int64, n int, limit time.Duration, streamErr <-chan error) (complete bool, err error) {
	deadline := time.Now().Add(limit)
	for i := from; i < from+int64(n); {
		if col[i].Load() != 0 {
			i++
			continue
		}
		select {
		case err := <-streamErr:
			return false, fmt.Errorf("the relay's stream stopped: %v", err)
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.stop.Store(int64(time.Since(t.base)) + 1)
			return false, nil
		}
	}
	return true, nil
}

// summaries returns the distributions of events [from, from+n) and how many
// had no saga start and no first step: those count with the time from their
// commit to the end of the wait (a lower bound).
func (t *timeline) summaries(from int64, n int) (start, step, end LatencySummary, noStart, noStep, noEnd int) {
	stop := t.stop.Load()
	if stop == 0 {
		stop = int64(time.Since(t.base)) + 1
	}
	var s, f, e []time.Duration
	for i := from; i < from+int64(n); i++ {
		c := t.commit[i].Load()
		if c == 0 {
			continue
		}
		at := func(v int64, missing *int) time.Duration {
			if v == 0 {
				*missing++
				v = stop
			}
			return time.Duration(max(0, v-c))
		}
		s = append(s, at(t.start[i].Load(), &noStart))
		f = append(f, at(t.step[i].Load(), &noStep))
		e = append(e, at(t.end[i].Load(), &noEnd))
	}
	return summarize(s), summarize(f), summarize(e), noStart, noStep, noEnd
}

// producer commits single-row outbox transactions on a schedule.
type producer struct {
	pool *pgxpool.Pool
	tl   *timeline
}

const producerConns = 16

func newProducer(ctx context.Context, url string, tl *timeline) (*producer, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = producerConns
	cfg.MinConns = producerConns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return &producer{pool: pool, tl: tl}, nil
}

func (p *producer) close() { p.pool.Close() }

// produce commits events [first, first+count) at perSec, open loop: event k
// is due at start + k/perSec whether or not earlier ones were slow, so a
// stall shows up as latency instead of a lower rate.
func (p *producer) produce(ctx context.Context, first int64, count, perSec int) error {
	start := time.Now()
	interval := time.Second / time.Duration(perSec)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, producerConns)
	for range producerConns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				k := next.Add(1) - 1
				if k >= int64(count) {
					return
				}
				if d := time.Until(start.Add(time.Duration(k) * interval)); d > 0 {
					time.Sleep(d)
				}
				seq := first + k
				if _, err := p.pool.Exec(ctx, sqlProduceOne, seq, benchEventType); err != nil {
					errs <- fmt.Errorf("producer: %w", err)
					return
				}
				p.tl.mark(p.tl.commit, seq)
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}
