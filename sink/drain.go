package sink

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/compensa/compensa/internal/backoff"
)

// drainPage bounds one drain round: rows per aggregate and in all.
const (
	drainPerAggregate = 100
	drainRows         = 1000
)

// Run drains parked events in the background, one loop per sink, until ctx
// ends. Only one process drains a sink at a time (a session advisory lock
// per sink), so replicas may all run it.
func (f *Fanout) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wakes := make([]chan struct{}, len(f.dests))
	for i, d := range f.dests {
		wakes[i] = make(chan struct{}, 1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.drainLoop(ctx, d, wakes[i])
		}()
	}
	// One wake channel for the batch path, spread to every sink's loop.
	for {
		select {
		case <-ctx.Done():
			wg.Wait()
			return nil
		case <-f.wake:
			for _, w := range wakes {
				select {
				case w <- struct{}{}:
				default:
				}
			}
		}
	}
}

func (f *Fanout) drainLoop(ctx context.Context, d *dest, wake <-chan struct{}) {
	lastCount := time.Time{}
	for {
		progress, err := f.drainOnce(ctx, d)
		if err != nil && ctx.Err() == nil {
			d.throttle.Warn("drain", "drain parked events", "err", err)
		} else if err == nil {
			d.throttle.Recovered("drain", "draining parked events again")
		}
		// drainOnce lowers the count by what it delivered; a full count of
		// the parked table is only a periodic correction.
		if time.Since(lastCount) > 2*time.Second {
			if err := f.refreshParked(ctx); err == nil {
				lastCount = time.Now()
			}
		}
		if progress && err == nil {
			continue // more may be due at once
		}
		select {
		case <-ctx.Done():
			return
		case <-wake:
		case <-time.After(f.cfg.DrainInterval):
		}
	}
}

// drainOnce delivers one page of due parked events of d, in order per
// aggregate. It reports whether anything was delivered.
func (f *Fanout) drainOnce(ctx context.Context, d *dest) (bool, error) {
	if err := f.checkRetryRequest(ctx, d); err != nil {
		return false, err
	}
	if d.dirty.Swap(false) {
		f.saveState(ctx, d)
	}
	if d.failureDirty.Load() {
		f.saveLastFailure(ctx, d)
	}
	d.mu.Lock()
	state, until := d.state, d.until
	d.mu.Unlock()
	if state == StateDisabled || (state != StateUp && time.Now().Before(until)) {
		return false, nil
	}
	if d.parked.Load() == 0 && state == StateUp {
		return false, nil
	}
	conn, err := f.cfg.Pool.Acquire(ctx)
	if err != nil {
		return false, err
	}
	defer conn.Release()
	var locked bool
	if err := conn.QueryRow(ctx, sqlDrainLock, d.spec.Name).Scan(&locked); err != nil || !locked {
		return false, err
	}
	defer conn.Exec(context.WithoutCancel(ctx), sqlDrainUnlock, d.spec.Name)

	perAgg, limit := drainPerAggregate, drainRows
	if state != StateUp {
		perAgg, limit = 1, 1 // a probe: one event
	}
	rows, err := conn.Query(ctx, sqlDue, d.spec.Name, perAgg, limit)
	if err != nil {
		return false, fmt.Errorf("read due parked events: %w", err)
	}
	var evs []*Event
	var keys []string // event_id of each row: the event's id, or its clipped form
	var attempts []int
	// A row that cannot be read (altered by hand, say) is deferred with the
	// reason like a refused head, and the rows behind it wait: it must not
	// stop the sink's other aggregates.
	var unread, unreadWhy []string
	var unreadAttempts []int
	unreadAgg := map[string]bool{}
	var id, agg, body string
	var raw []byte
	var n int
	_, err = pgx.ForEachRow(rows, []any{&id, &agg, &body, &raw, &n}, func() error {
		if unreadAgg[agg] {
			return nil
		}
		ev, err := decodeParked([]byte(body), raw)
		if err != nil {
			unreadAgg[agg] = true
			unread, unreadWhy = append(unread, id), append(unreadWhy, "the parked row cannot be read: "+err.Error())
			unreadAttempts = append(unreadAttempts, n)
			return nil
		}
		if ev.ID == "" {
			ev.ID = id
		}
		evs = append(evs, ev)
		keys = append(keys, id)
		attempts = append(attempts, n)
		return nil
	})
	if err == nil && len(unread) > 0 {
		waits := make([]int64, len(unread))
		for i := range unread {
			waits[i] = f.backoff(unreadAttempts[i]).Milliseconds()
		}
		if _, err := conn.Exec(ctx, sqlDeferred, d.spec.Name, unread, unreadWhy, waits); err != nil {
			return false, fmt.Errorf("defer %d parked events that cannot be read: %w", len(unread), err)
		}
		d.log.Error("parked events cannot be read: they wait, and hold back the later events of their aggregate", "count", len(unread), "first_event_id", unread[0], "reason", unreadWhy[0])
	}
	if err != nil || len(evs) == 0 {
		if state != StateUp && err == nil {
			// Nothing parked to probe with: believe it is up.
			d.setState(StateUp, "", 0)
			f.saveState(ctx, d)
		}
		return false, err
	}
	errs := d.deliver(ctx, evs)
	var done, deferred, reasons []string
	var waits []int64
	for i := range evs {
		if errs[i] == nil {
			done = append(done, keys[i])
			continue
		}
		if errors.Is(errs[i], ErrHeldBack) {
			continue
		}
		// The head of its aggregate failed: it waits (capped backoff), and
		// the aggregate's later rows wait behind it.
		kind, after := kindOf(errs[i])
		wait := f.backoff(attempts[i])
		if kind == kindThrottled {
			wait = max(wait, after)
		}
		if kind == kindDown {
			wait = 0 // the sink's probe interval paces it
		}
		deferred, reasons, waits = append(deferred, keys[i]), append(reasons, cleanText(errs[i].Error())), append(waits, wait.Milliseconds())
	}
	if len(deferred) > 0 {
		// One statement for the page: a sink refusing many aggregates' heads
		// costs one round trip, not one per aggregate.
		if _, err := conn.Exec(ctx, sqlDeferred, d.spec.Name, deferred, reasons, waits); err != nil {
			return false, fmt.Errorf("defer %d parked events: %w", len(deferred), err)
		}
	}
	if len(done) > 0 {
		if _, err := conn.Exec(ctx, sqlDrained, d.spec.Name, done); err != nil {
			return false, fmt.Errorf("delete %d delivered parked events: %w", len(done), err)
		}
		d.delivered.Add(uint64(len(done)))
		d.mDelivered.Add(float64(len(done)))
		d.parked.Add(-int64(len(done)))
		d.mParked.Set(float64(max(d.parked.Load(), 0)))
	}
	d.mu.Lock()
	now := d.state
	if now == StateDown {
		// Probe failed: the next one waits longer.
		d.until = time.Now().Add(f.backoff(d.failures))
	}
	d.mu.Unlock()
	if now != state || (state != StateUp && len(done) > 0) {
		if len(done) > 0 && now != StateDisabled {
			d.setState(StateUp, "", 0)
		}
		f.saveState(ctx, d)
	}
	return len(done) > 0, nil
}

// backoff is the capped exponential wait after n failed attempts, with jitter.
func (f *Fanout) backoff(n int) time.Duration {
	return backoff.Policy{Base: time.Second, Factor: 2, Max: f.cfg.MaxBackoff, Jitter: 0.5}.Delay(n)
}

// saveState records d's state in relay_sinks for `relay sinks list`.
func (f *Fanout) saveState(ctx context.Context, d *dest) {
	d.dirty.Store(false)
	state, reason := d.shownState()
	if _, err := f.cfg.Pool.Exec(ctx, sqlSetState, d.spec.Name, state, cleanText(reason)); err != nil && ctx.Err() == nil {
		d.dirty.Store(true) // written again on the next round
		d.throttle.Warn("state", "record sink state", "err", err)
	} else if err == nil {
		d.throttle.Recovered("state", "sink state recorded again")
	}
}

// checkRetryRequest acts on a `relay sinks retry` (or POST
// /v1/sinks/{name}/retry): the sink is believed up and probed at once.
func (f *Fanout) checkRetryRequest(ctx context.Context, d *dest) error {
	var at *time.Time
	if err := f.cfg.Pool.QueryRow(ctx, sqlRetryRequested, d.spec.Name).Scan(&at); err != nil {
		return fmt.Errorf("read retry request: %w", err)
	}
	if at == nil || !at.After(d.lastRetry) {
		return nil
	}
	d.lastRetry = *at
	d.log.Info("retry requested: re-driving parked events now")
	d.setState(StateUp, "", 0)
	if err := f.refreshParked(ctx); err != nil {
		return err
	}
	return nil
}
