package sink

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/compensa/compensa/cdc"
	"github.com/compensa/compensa/internal/logthrottle"
	"github.com/compensa/compensa/outbox"
)

// Destination is a configured sink and its connection.
type Destination struct {
	Spec Spec
	Sink Sink
}

// FanoutConfig configures a Fanout. Pool is required.
type FanoutConfig struct {
	Pool         *pgxpool.Pool
	Destinations []Destination
	// DrainInterval is how often the drainer looks for parked rows that are
	// due (default 200ms); it is also woken when a batch parks.
	DrainInterval time.Duration
	// MaxBackoff caps the wait between attempts of a parked event and
	// between probes of a sink that is down (default 30s).
	MaxBackoff time.Duration
	// Registerer receives the sink metrics (nil: not registered).
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

// Sink states, as relay_sinks.state and `relay sinks list` show them.
const (
	StateUp        = "up"
	StateDown      = "down"      // unreachable: new events are parked, the drainer probes
	StateThrottled = "throttled" // asked to slow down (429, Retry-After)
	StateDisabled  = "disabled"  // answered 410: parks until `relay sinks retry`
	// StateFailing: the sink's events could neither be delivered nor
	// parked (writing the parked table failed, e.g. a missing privilege);
	// the stream waits and /readyz says why.
	StateFailing = "failing"
)

// Fanout is the stream's sink in front of the correlator: it delivers each
// batch to every matching destination, parks what could not be delivered
// and passes the batch on. See the package documentation for the promise.
type Fanout struct {
	cfg   FanoutConfig
	log   *slog.Logger
	dests []*dest
	next  cdc.Sink
	wake  chan struct{}

	// noID numbers rows without an id per source transaction (commit LSN),
	// so that they get stable, distinct ids. It carries over from a Partial
	// batch to the next part of the same transaction, and restarts with
	// each stream session, which replays a transaction from its start.
	noID      map[uint64]int
	noIDAfter cdc.Batch // the batch before: is the next one its sequel?
	resynced  atomic.Bool
}

type dest struct {
	spec Spec
	sink Sink
	log  *slog.Logger

	mu        sync.Mutex
	state     string
	reason    string
	until     time.Time   // down/throttled: when the drainer may probe
	failures  int         // consecutive failed probes
	lastRetry time.Time   // newest retry request acted on
	dirty     atomic.Bool // state changed since relay_sinks was written

	refusals     refusals    // refused events, logged once per status and interval
	lastFailure  string      // reason of the latest failed delivery
	failureDirty atomic.Bool // lastFailure changed since relay_sinks was written
	// parkErr (under mu) is why the newest batch could not park this
	// sink's events ("" once it could): while set the sink is failing.
	parkErr string
	// throttle keeps a failure that repeats in this sink's loops to one
	// log line per interval.
	throttle *logthrottle.Throttle

	parked atomic.Int64 // approximate: refreshed by the drainer
	// parkEpoch moves after each commit that parked events for this sink
	// and at each stream session (Resync); emptyAt is the epoch at which
	// the drainer last counted no parked row, having read the epoch before
	// counting. While they are equal nothing can be parked, and a batch
	// skips the query for held aggregates.
	parkEpoch, emptyAt atomic.Uint64
	delivered          atomic.Uint64

	mDelivered prometheus.Counter
	mFiltered  prometheus.Counter
	mParked    prometheus.Gauge
	mSeconds   prometheus.Observer
}

// NewFanout validates cfg, records each destination in relay_sinks and
// loads the state a previous run left (a disabled sink stays disabled).
func NewFanout(ctx context.Context, cfg FanoutConfig) (*Fanout, error) {
	if cfg.Pool == nil {
		return nil, errors.New("sink: FanoutConfig.Pool is nil")
	}
	cfg.DrainInterval = cmp.Or(cfg.DrainInterval, 200*time.Millisecond)
	cfg.MaxBackoff = cmp.Or(cfg.MaxBackoff, 30*time.Second)
	f := &Fanout{cfg: cfg, log: cfg.Logger, wake: make(chan struct{}, 1)}
	if f.log == nil {
		f.log = slog.New(slog.DiscardHandler)
	}
	delivered := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "compensa_sink_delivered_total",
		Help: "Events the sink's destination acknowledged (directly or from the parked table)."}, []string{"sink"})
	filtered := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "compensa_sink_filtered_total",
		Help: "Events the sink's filter rejected: dropped for that sink, never parked."}, []string{"sink"})
	parked := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "compensa_sink_parked",
		Help: "Events parked for the sink, waiting to be delivered."}, []string{"sink"})
	seconds := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "compensa_sink_delivery_seconds",
		Help:    "Time from handing events to the sink to its acknowledgement (one observation per delivery call).",
		Buckets: prometheus.ExponentialBuckets(0.0005, 4, 10)}, []string{"sink"})
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{delivered, filtered, parked, seconds} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("sink: register metrics: %w", err)
			}
		}
	}
	seen := map[string]bool{}
	for _, d := range cfg.Destinations {
		if d.Sink == nil || d.Spec.Name == "" || seen[d.Spec.Name] {
			return nil, fmt.Errorf("sink: destination %q: every destination needs a unique name and a Sink", d.Spec.Name)
		}
		seen[d.Spec.Name] = true
		if d.Spec.MaxParked <= 0 {
			d.Spec.MaxParked = DefaultMaxParked
		}
		x := &dest{spec: d.Spec, sink: d.Sink, state: StateUp, log: f.log.With("sink", d.Spec.Name),
			mDelivered: delivered.WithLabelValues(d.Spec.Name), mParked: parked.WithLabelValues(d.Spec.Name),
			mFiltered: filtered.WithLabelValues(d.Spec.Name),
			mSeconds:  seconds.WithLabelValues(d.Spec.Name)}
		x.throttle = logthrottle.New(x.log, 0)
		x.parkEpoch.Store(1) // unknown until counted
		var state string
		var reason *string
		var retry *time.Time
		err := cfg.Pool.QueryRow(ctx, sqlRegister, d.Spec.Name, d.Spec.Kind()).Scan(&state, &reason, &retry)
		if err != nil {
			return nil, fmt.Errorf("sink: record sink %q in relay_sinks (did `relay migrate` run?): %w", d.Spec.Name, err)
		}
		if state == StateDisabled {
			x.state, x.reason = StateDisabled, deref(reason)
			x.log.Error("sink is DISABLED (its endpoint answered 410 Gone): events are parked, not delivered; run `relay sinks retry "+d.Spec.Name+"` once the endpoint accepts them again",
				"reason", x.reason)
		}
		if retry != nil {
			x.lastRetry = *retry
		}
		f.dests = append(f.dests, x)
	}
	if err := f.refreshParked(ctx); err != nil {
		return nil, err
	}
	return f, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// Sink returns the stream's sink: deliveries first, then next (the
// correlator, whose Config.InBatchTx must be WriteParked).
func (f *Fanout) Sink(next cdc.Sink) cdc.Sink {
	f.next = next
	return cdc.SinkFunc(f.handleBatch)
}

// parkRow is one event to park for one sink.
type parkRow struct {
	sink   string
	ev     *Event
	reason string
	// hold parks it for the operator: the drainer leaves it (and the later
	// events of its aggregate) until `relay sinks retry`.
	hold bool
}

type pending struct {
	parks     []parkRow
	delivered map[string]int
	// filtered counts, per sink, the events its filter rejected.
	filtered map[string]int
	// parkErr is set by WriteParked when writing the parked rows failed.
	parkErr error
}

type pendingKey struct{}

func (f *Fanout) handleBatch(ctx context.Context, b cdc.Batch) error {
	if f.next == nil {
		return errors.New("sink: Fanout.Sink was not given the next sink")
	}
	per := make([][]*Event, len(f.dests))
	holds := make([]map[*Event]string, len(f.dests))
	// filtered counts, per sink, the events its filter rejected; counted
	// once the batch commits, so that a batch replayed after a crash
	// counts once.
	filtered := make([]int, len(f.dests))
	any := false
	var noID map[uint64]int
	if f.resynced.Swap(false) {
		f.noIDAfter = cdc.Batch{}
	}
	if prev := f.noIDAfter; prev.Partial && prev.CommitLSN == b.CommitLSN {
		noID = maps.Clone(f.noID) // kept only if this batch commits
	}
	for i := range b.Events {
		oe := &b.Events[i]
		if oe.Message && oe.Poison != "" {
			// A refused message is a dead letter only: it may come from a
			// transaction that rolled back, or hold nothing to deliver.
			continue
		}
		var ev *Event
		for j, d := range f.dests {
			if ev == nil {
				ev = FromOutbox(oe)
				if oe.RawID == "" && oe.ID == uuid.Nil {
					// Numbered within the source transaction (see noID);
					// the id is fixed once the held row is written.
					if noID == nil {
						noID = map[uint64]int{}
					}
					noID[oe.LSN]++
					ev.ID = fmt.Sprintf("(no id) %s #%d", pglogrepl.LSN(oe.LSN), noID[oe.LSN])
				}
			}
			// A poison event (the correlator makes it a dead letter) still
			// goes to every sink that selects it; see routePoison.
			selects, hold := d.spec.Match.Selects(ev), ""
			if oe.Poison != "" {
				selects, hold = routePoison(d.spec.Match, oe, ev)
			}
			if !selects {
				continue
			}
			if hold == "" && d.spec.Filter != nil {
				// Rejected: dropped for this sink, so it neither parks nor
				// holds back its aggregate. A filter that fails keeps
				// the event: the sink refuses it with the reason (Shaped).
				if keep, err := d.spec.Keep(ev, nil); err == nil && !keep {
					filtered[j]++
					continue
				}
			}
			if hold != "" {
				if holds[j] == nil {
					holds[j] = map[*Event]string{}
				}
				holds[j][ev] = hold
			}
			per[j] = append(per[j], ev)
			any = true
		}
	}
	countFiltered := func() {
		for j, d := range f.dests {
			if filtered[j] > 0 {
				d.mFiltered.Add(float64(filtered[j]))
			}
		}
	}
	if !any {
		next := ctx
		if p := filteredOnly(f.dests, filtered); p != nil {
			next = context.WithValue(ctx, pendingKey{}, p)
		}
		if err := f.next.HandleBatch(next, b); err != nil {
			return err
		}
		f.noID, f.noIDAfter = noID, cdc.Batch{Partial: b.Partial, CommitLSN: b.CommitLSN}
		countFiltered()
		return nil
	}
	held, err := f.heldAggregates(ctx, per)
	if err != nil {
		return err
	}
	for j, d := range f.dests {
		if err := f.backpressure(ctx, d, len(per[j])); err != nil {
			return err
		}
	}
	results := make([]pending, len(f.dests))
	var wg sync.WaitGroup
	for j, d := range f.dests {
		if len(per[j]) == 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[j] = d.deliverBatch(ctx, per[j], held[d.spec.Name], holds[j])
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return err
	}
	p := &pending{delivered: map[string]int{}}
	if q := filteredOnly(f.dests, filtered); q != nil {
		p.filtered = q.filtered
	}
	for j, r := range results {
		p.parks = append(p.parks, r.parks...)
		if n := r.delivered[f.dests[j].spec.Name]; n > 0 {
			p.delivered[f.dests[j].spec.Name] = n
		}
	}
	if err := f.next.HandleBatch(context.WithValue(ctx, pendingKey{}, p), b); err != nil {
		if p.parkErr != nil && ctx.Err() == nil {
			for j, d := range f.dests {
				if len(results[j].parks) > 0 {
					d.parkFailed(p.parkErr)
				}
			}
		}
		return err
	}
	f.noID, f.noIDAfter = noID, cdc.Batch{Partial: b.Partial, CommitLSN: b.CommitLSN}
	countFiltered()
	for j, d := range f.dests {
		if len(per[j]) > 0 {
			d.parkedOK() // its events were delivered or parked
		}
		n := results[j].delivered[d.spec.Name]
		d.delivered.Add(uint64(n))
		d.mDelivered.Add(float64(n))
		if k := len(results[j].parks); k > 0 {
			d.parkEpoch.Add(1)
			d.mParked.Set(float64(d.parked.Add(int64(k))))
		}
		for _, r := range results[j].parks {
			if r.hold {
				d.log.Error("EVENT HELD for the operator: parked, not delivered, and the later events of its aggregate wait behind it until `relay sinks retry "+d.spec.Name+"`",
					"event_id", r.ev.ID, "reason", r.reason)
			}
		}
	}
	if len(p.parks) > 0 {
		select {
		case f.wake <- struct{}{}:
		default:
		}
	}
	return nil
}

// filteredOnly is the pending counts of a batch's filtered events (nil
// when there are none).
func filteredOnly(dests []*dest, filtered []int) *pending {
	var p *pending
	for j, n := range filtered {
		if n > 0 {
			if p == nil {
				p = &pending{filtered: map[string]int{}}
			}
			p.filtered[dests[j].spec.Name] = n
		}
	}
	return p
}

// heldAggregates returns, per sink, the aggregates of this batch that have
// parked rows: their new events queue behind them.
func (f *Fanout) heldAggregates(ctx context.Context, per [][]*Event) (map[string]map[string]bool, error) {
	var sinks, keys []string
	for j, evs := range per {
		d := f.dests[j]
		if d.emptyAt.Load() == d.parkEpoch.Load() {
			continue // nothing parked: see parkEpoch
		}
		for _, ev := range evs {
			sinks = append(sinks, f.dests[j].spec.Name)
			keys = append(keys, ev.AggregateKey())
		}
	}
	out := map[string]map[string]bool{}
	if len(sinks) == 0 {
		return out, nil
	}
	rows, err := f.cfg.Pool.Query(ctx, sqlHeld, sinks, keys)
	if err != nil {
		return nil, fmt.Errorf("sink: read parked aggregates: %w", err)
	}
	var s, k string
	_, err = pgx.ForEachRow(rows, []any{&s, &k}, func() error {
		if out[s] == nil {
			out[s] = map[string]bool{}
		}
		out[s][k] = true
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("sink: read parked aggregates: %w", err)
	}
	return out, nil
}

// backpressure waits while the sink is at its cap of parked events: the
// stream slows down rather than dropping anything.
func (f *Fanout) backpressure(ctx context.Context, d *dest, n int) error {
	warned := false
	for d.parked.Load()+int64(n) > int64(d.spec.MaxParked) && d.parked.Load() > 0 {
		if !warned {
			d.throttle.Warn("max_parked", "sink is at max_parked: the stream waits until parked events drain (WAL is retained meanwhile)",
				"parked", d.parked.Load(), "max_parked", d.spec.MaxParked)
			warned = true
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
		if err := f.refreshParked(ctx); err != nil {
			return err
		}
	}
	if warned {
		d.throttle.Recovered("max_parked", "sink is below max_parked again: the stream goes on")
	}
	return nil
}

// routePoison decides for an event the relay could not decode whether m
// selects it, and gives a reason to hold it for the operator when that
// cannot be told (event_type or aggregate_type unread while m filters on
// it) or when the row has no id to deliver it under. Everything else that
// was read is delivered like any event: at least once, never dropped.
func routePoison(m Match, oe *outbox.Event, ev *Event) (selects bool, hold string) {
	for _, f := range oe.Unread {
		if (f == "event_type" && len(m.EventTypes) > 0) || (f == "aggregate_type" && len(m.AggregateTypes) > 0) {
			return true, "held: " + f + " could not be read, so whether this sink's match selects the event is unknown (" +
				oe.Poison + "); `relay sinks retry` delivers it as it is"
		}
	}
	if !m.Selects(ev) {
		return false, ""
	}
	if oe.RawID == "" && oe.ID == uuid.Nil {
		return true, "held: the row has no id to deliver it under (" + oe.Poison + "); `relay sinks retry` delivers it with the id " + ev.ID
	}
	return true, ""
}

// deliverBatch sends evs (this batch's events for d) and returns what to
// park; holds are the events to park for the operator (see routePoison).
func (d *dest) deliverBatch(ctx context.Context, evs []*Event, held map[string]bool, holds map[*Event]string) pending {
	out := pending{delivered: map[string]int{}}
	d.mu.Lock()
	state, reason := d.state, d.reason
	d.mu.Unlock()
	if len(holds) > 0 {
		held = maps.Clone(held)
		if held == nil {
			held = map[string]bool{}
		}
	}
	var direct []*Event
	for _, ev := range evs {
		k := ev.AggregateKey()
		switch {
		case holds[ev] != "":
			out.parks = append(out.parks, parkRow{sink: d.spec.Name, ev: ev, reason: holds[ev], hold: true})
			held[k] = true // the aggregate's later events queue behind it
		case state != StateUp:
			out.parks = append(out.parks, parkRow{sink: d.spec.Name, ev: ev, reason: "sink " + state + ": " + reason})
		case held[k]:
			out.parks = append(out.parks, parkRow{sink: d.spec.Name, ev: ev, reason: "queued behind a parked event of its aggregate"})
		default:
			direct = append(direct, ev)
		}
	}
	if len(direct) == 0 {
		return out
	}
	errs := d.deliver(ctx, direct)
	for i, ev := range direct {
		if errs[i] == nil {
			out.delivered[d.spec.Name]++
			continue
		}
		out.parks = append(out.parks, parkRow{sink: d.spec.Name, ev: ev, reason: errs[i].Error()})
	}
	return out
}

// deliver calls the sink with a deadline, times it and updates the state
// from the errors it returns.
func (d *dest) deliver(ctx context.Context, evs []*Event) []error {
	start := time.Now()
	errs := d.sink.Deliver(ctx, evs)
	d.mSeconds.Observe(time.Since(start).Seconds())
	if len(errs) != len(evs) {
		errs = make([]error, len(evs))
		for i := range errs {
			errs[i] = errors.New("sink returned a wrong number of results (a bug in the sink)")
		}
	}
	for _, err := range errs {
		if err == nil || errors.Is(err, ErrHeldBack) {
			continue
		}
		d.noteFailure(err.Error())
		kind, after := kindOf(err)
		switch kind {
		case kindEvent:
			d.refusals.note(d.log, err)
		case kindDown:
			d.setState(StateDown, err.Error(), time.Second)
		case kindGone:
			d.setState(StateDisabled, err.Error(), 0)
		case kindThrottled:
			d.setState(StateThrottled, err.Error(), after)
		}
	}
	return errs
}

// setState moves the sink to state (not out of disabled; not back from a
// worse state to a milder one within one call) and logs the change.
func (d *dest) setState(state, reason string, wait time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.state == StateDisabled && state != StateUp {
		return
	}
	changed := d.state != state
	d.state, d.reason = state, reason
	switch state {
	case StateUp:
		d.failures = 0
		d.until = time.Time{}
	case StateDown:
		d.failures++
		d.until = time.Now().Add(wait)
	case StateThrottled:
		d.until = time.Now().Add(max(wait, time.Second))
	}
	if !changed {
		return
	}
	d.dirty.Store(true)
	switch state {
	case StateDisabled:
		d.log.Error("SINK DISABLED: its endpoint answered 410 Gone; events are parked, not delivered, until `relay sinks retry "+d.spec.Name+"`", "reason", reason)
	case StateDown:
		d.log.Warn("sink is down: parking its events and probing", "reason", reason)
	case StateThrottled:
		d.log.Warn("sink asked to slow down: parking its events until the wait is over", "wait", wait.Round(time.Millisecond), "reason", reason)
	case StateUp:
		d.log.Info("sink is up again: draining its parked events in order")
	}
}

// WriteParked is the correlator's Config.InBatchTx: it writes the batch's
// parked rows, delivery and filter counts in the batch's transaction.
func (f *Fanout) WriteParked(ctx context.Context, tx pgx.Tx, _ cdc.Batch) error {
	p, _ := ctx.Value(pendingKey{}).(*pending)
	if p == nil || (len(p.parks) == 0 && len(p.delivered) == 0 && len(p.filtered) == 0) {
		return nil
	}
	var batch pgx.Batch
	if len(p.parks) > 0 {
		n := len(p.parks)
		sinks, ids, keys, reasons := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		events, raws, holds := make([]string, n), make([][]byte, n), make([]bool, n)
		for i, r := range p.parks {
			// Nothing here can fail on what the event holds: see
			// encodeParked, storedKey and cleanText.
			events[i], raws[i] = encodeParked(r.ev)
			sinks[i], ids[i], keys[i], reasons[i] = r.sink, storedKey(r.ev.ID), r.ev.AggregateKey(), cleanText(r.reason)
			holds[i] = r.hold
		}
		batch.Queue(sqlPark, sinks, ids, keys, events, reasons, holds, raws)
	}
	if len(p.delivered) > 0 {
		var names []string
		var counts []int64
		for s, n := range p.delivered {
			names = append(names, s)
			counts = append(counts, int64(n))
		}
		batch.Queue(sqlCountDelivered, names, counts)
	}
	if len(p.filtered) > 0 {
		var names []string
		var counts []int64
		for s, n := range p.filtered {
			names = append(names, s)
			counts = append(counts, int64(n))
		}
		batch.Queue(sqlCountFiltered, names, counts)
	}
	if err := tx.SendBatch(ctx, &batch).Close(); err != nil {
		err = fmt.Errorf("sink: park %d events: %w", len(p.parks), err)
		if len(p.parks) > 0 {
			p.parkErr = err
		}
		return err
	}
	return nil
}

// parkFailed records that d's events could not be parked: d is failing
// until a batch parks for it again.
func (d *dest) parkFailed(err error) {
	d.mu.Lock()
	changed := d.parkErr != err.Error()
	d.parkErr = err.Error()
	d.mu.Unlock()
	if changed {
		d.dirty.Store(true)
	}
	d.throttle.Error("park", "SINK FAILING: its events can be neither delivered nor parked, so the stream waits (see /readyz)", "err", err)
}

// parkedOK records that a batch delivered or parked d's events: it is no
// longer failing.
func (d *dest) parkedOK() {
	d.mu.Lock()
	was := d.parkErr
	d.parkErr = ""
	d.mu.Unlock()
	if was != "" {
		d.dirty.Store(true)
		d.throttle.Recovered("park", "sink parks its events again")
	}
}

// shownState is the state and reason `relay sinks list` shows for d.
func (d *dest) shownState() (state, reason string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.parkErr != "" {
		reason = "cannot park: " + d.parkErr
		if d.state != StateUp && d.reason != "" {
			reason += "; " + d.state + ": " + d.reason
		}
		return StateFailing, reason
	}
	return d.state, d.reason
}

// Failing lists the sinks whose events can be neither delivered nor
// parked, one line each with the reason (for /readyz).
func (f *Fanout) Failing() []string {
	var out []string
	for _, d := range f.dests {
		if state, reason := d.shownState(); state == StateFailing {
			out = append(out, "sink "+d.spec.Name+": can neither deliver nor park its events: "+reason)
		}
	}
	return out
}

// Resync forgets what this process believes is parked: call it whenever
// the stream starts a session (from cdc.Config.LoadCheckpoint), since
// another replica may have led the slot and parked events meanwhile.
func (f *Fanout) Resync(ctx context.Context) error {
	f.resynced.Store(true)
	for _, d := range f.dests {
		d.parkEpoch.Add(1)
	}
	return f.refreshParked(ctx)
}

// refreshParked counts each sink's parked rows.
func (f *Fanout) refreshParked(ctx context.Context) error {
	epochs := make([]uint64, len(f.dests))
	for i, d := range f.dests {
		epochs[i] = d.parkEpoch.Load()
	}
	rows, err := f.cfg.Pool.Query(ctx, `SELECT sink, count(*) FROM relay_sink_parked GROUP BY sink`)
	if err != nil {
		return fmt.Errorf("sink: count parked events: %w", err)
	}
	counts := map[string]int64{}
	var s string
	var n int64
	if _, err := pgx.ForEachRow(rows, []any{&s, &n}, func() error { counts[s] = n; return nil }); err != nil {
		return fmt.Errorf("sink: count parked events: %w", err)
	}
	for i, d := range f.dests {
		n := counts[d.spec.Name]
		d.parked.Store(n)
		d.mParked.Set(float64(n))
		if n == 0 {
			d.emptyAt.Store(epochs[i])
		}
	}
	return nil
}
