package bench

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/compensa/compensa/cdc"
	"github.com/compensa/compensa/correlator"
	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/sink"
)

// benchRegistry holds the bench saga: triggered by benchEventType, three
// steps that do nothing but commit (the runner's own writes are the cost
// measured). step0 is called from the first step's Do, inside its
// transaction, so that the latency scenario can tie an instance to its
// event.
func benchRegistry(step0 func(x *saga.StepTx)) *saga.Registry {
	reg := saga.NewRegistry()
	noop := func(context.Context, *saga.StepTx) error { return nil }
	first := noop
	if step0 != nil {
		first = func(_ context.Context, x *saga.StepTx) error { step0(x); return nil }
	}
	reg.MustRegister(saga.Definition{
		Name: benchSaga, Version: 1,
		Triggers: []saga.Trigger{{EventType: benchEventType}},
		Steps: []saga.Step{
			{Name: "reserve", Do: first},
			{Name: "charge", Do: noop},
			{Name: "confirm", Do: noop},
		},
	})
	return reg
}

const benchStepsPerSaga = 3

// countingSink passes batches to the correlator and notices when the wanted
// number of events has been committed.
type countingSink struct {
	inner   cdc.Sink
	want    int
	onBatch func(b *cdc.Batch) // after a successful commit (optional)
	onStart func(b *cdc.Batch) // as the batch comes in (optional)

	events, batches atomic.Int64
	// busy is the time spent inside the correlator (nanoseconds): compared
	// with the wall time it tells whether the sink or the stream limits.
	busy   atomic.Int64
	once   sync.Once
	done   chan struct{}
	doneAt time.Time
}

func newCountingSink(inner cdc.Sink, want int) *countingSink {
	return &countingSink{inner: inner, want: want, done: make(chan struct{})}
}

func (s *countingSink) HandleBatch(ctx context.Context, b cdc.Batch) error {
	if s.onStart != nil {
		s.onStart(&b)
	}
	began := time.Now()
	err := s.inner.HandleBatch(ctx, b)
	s.busy.Add(int64(time.Since(began)))
	if err != nil {
		return err
	}
	if s.onBatch != nil {
		s.onBatch(&b)
	}
	n := s.events.Add(int64(len(b.Events)))
	s.batches.Add(1)
	if s.want > 0 && n >= int64(s.want) && !b.Partial {
		s.once.Do(func() { s.doneAt = time.Now(); close(s.done) })
	}
	return nil
}

// consumeResult is one pass of the relay's stream over a scenario's WAL.
type consumeResult struct {
	Events  int           `json:"events"`
	Batches int           `json:"batches"`
	Took    time.Duration `json:"took_ns"`
	// SinkBusy is the time spent inside the sink (the correlator's
	// transactions).
	SinkBusy time.Duration `json:"sink_busy_ns"`
	// PeakRSS is the consuming process's own resident high-water mark
	// (VmHWM), set by a child consumer.
	PeakRSS int64 `json:"peak_rss_bytes,omitempty"`
}

// consumeOptions configures consume.
type consumeOptions struct {
	URL, Publication, Slot string
	// Registry is what the correlator routes with: empty for "checkpoint
	// commits only", the bench saga for "one saga per event".
	Registry *saga.Registry
	Want     int
	Timeout  time.Duration
	Logger   *slog.Logger
	// Destinations, when set, put the sinks' fan-out in front of the
	// correlator, as `relay run --sinks` does.
	Destinations []sink.Destination
	// OnBatch, when set, is called with each batch as the stream hands it
	// over, before the sinks and the correlator see it.
	OnBatch func(b *cdc.Batch)
}

// consume runs the relay's stream with the correlator as its sink, as
// `relay run` wires them (without the step runner), until Want events are
// committed. The time runs from the stream's start (connection, leadership
// and slot checks included, as pg_recvlogical's includes its start-up) to the
// commit of the last event.
func consume(ctx context.Context, o consumeOptions) (consumeResult, error) {
	var res consumeResult
	pcfg, err := pgxpool.ParseConfig(o.URL)
	if err != nil {
		return res, err
	}
	pcfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return res, err
	}
	defer pool.Close()
	ccfg := &correlator.Config{Registry: o.Registry, Logger: o.Logger.With("component", "correlator")}
	var fanout *sink.Fanout
	if len(o.Destinations) > 0 {
		if fanout, err = sink.NewFanout(ctx, sink.FanoutConfig{Pool: pool, Destinations: o.Destinations, Logger: o.Logger}); err != nil {
			return res, err
		}
		ccfg.InBatchTx = fanout.WriteParked
	}
	corr, err := correlator.New(pool, ccfg)
	if err != nil {
		return res, err
	}
	var inner cdc.Sink = corr
	if fanout != nil {
		inner = fanout.Sink(corr)
	}
	counting := newCountingSink(inner, o.Want)
	counting.onStart = o.OnBatch
	stream, err := cdc.NewStream(cdc.Config{
		DatabaseURL: o.URL, Slot: o.Slot, Publication: o.Publication,
		LoadCheckpoint: func(ctx context.Context) (pglogrepl.LSN, bool, error) {
			if fanout != nil {
				if err := fanout.Resync(ctx); err != nil {
					return 0, false, err
				}
			}
			return corr.LoadCheckpoint(ctx, o.Slot)
		},
		Logger: o.Logger.With("component", "cdc", "slot", o.Slot),
	}, counting)
	if err != nil {
		return res, err
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	began := time.Now()
	go func() { errc <- stream.Run(sctx) }()
	timer := time.NewTimer(o.Timeout)
	defer timer.Stop()
	var runErr error
	select {
	case <-counting.done:
		res.Took = counting.doneAt.Sub(began)
	case runErr = <-errc:
		errc <- runErr
		if runErr == nil {
			runErr = fmt.Errorf("stream stopped early")
		}
	case <-timer.C:
		runErr = fmt.Errorf("%d of %d events after %s", counting.events.Load(), o.Want, o.Timeout)
	case <-ctx.Done():
		runErr = ctx.Err()
	}
	cancel()
	if err := <-errc; err != nil && runErr == nil {
		runErr = err
	}
	res.Events, res.Batches, res.SinkBusy = int(counting.events.Load()), int(counting.batches.Load()), time.Duration(counting.busy.Load())
	if runErr != nil {
		return res, fmt.Errorf("bench: relay stream on slot %s: %w", o.Slot, runErr)
	}
	return res, nil
}

// seqOf reads the "seq" number out of a bench payload without a full decode.
func seqOf(payload []byte) (int64, bool) {
	i := bytes.Index(payload, []byte(`"seq":`))
	if i < 0 {
		return 0, false
	}
	rest := bytes.TrimLeft(payload[i+len(`"seq":`):], " ")
	j := 0
	for j < len(rest) && rest[j] >= '0' && rest[j] <= '9' {
		j++
	}
	n, err := strconv.ParseInt(string(rest[:j]), 10, 64)
	return n, err == nil
}
