package sink

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"
)

// refusalLogInterval is how often a destination refusing events with the
// same status is logged again: a burst of refusals (every event of a
// release the endpoint does not accept) is one WARN, not one per event.
const refusalLogInterval = time.Minute

// statusError carries the status a destination answered (an HTTP code).
type statusError struct {
	code int
	err  error
}

func (e *statusError) Error() string { return e.err.Error() }
func (e *statusError) Unwrap() error { return e.err }

// WithStatus records the status code a destination answered with err (a
// webhook's HTTP status), so that refusals are logged per status.
func WithStatus(code int, err error) error { return &statusError{code: code, err: err} }

// StatusOf returns the status recorded by WithStatus, or 0.
func StatusOf(err error) int {
	var s *statusError
	if errors.As(err, &s) {
		return s.code
	}
	return 0
}

// refusals logs a destination's refusals of single events: the first of
// each status at once, then at most once per refusalLogInterval with how
// many were not logged, and at once when the reason of a status changes.
type refusals struct {
	mu   sync.Mutex
	seen map[int]*refusalEntry
}

type refusalEntry struct {
	at         time.Time
	reason     string
	suppressed int
}

func (r *refusals) note(log *slog.Logger, err error) {
	code, reason := StatusOf(err), err.Error()
	now := time.Now()
	r.mu.Lock()
	if r.seen == nil {
		r.seen = map[int]*refusalEntry{}
	}
	e := r.seen[code]
	if e != nil && e.reason == reason && now.Sub(e.at) < refusalLogInterval {
		e.suppressed++
		r.mu.Unlock()
		return
	}
	suppressed, since := 0, time.Duration(0)
	if e != nil {
		suppressed, since = e.suppressed, now.Sub(e.at)
	}
	r.seen[code] = &refusalEntry{at: now, reason: reason}
	r.mu.Unlock()
	attrs := []any{"reason", reason}
	if code != 0 {
		attrs = append(attrs, "status", code)
	}
	if suppressed > 0 {
		attrs = append(attrs, "repeated", suppressed, "in_last", since.Round(time.Second).String())
	}
	log.Warn("destination refused events: each is parked with the reason and its aggregate's later events wait behind it; see `relay sinks parked`", attrs...)
}

// noteFailure remembers the reason of the latest failed delivery for
// relay_sinks.last_reason; the drainer writes it when it changed.
func (d *dest) noteFailure(reason string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.lastFailure != reason {
		d.lastFailure = reason
		d.failureDirty.Store(true)
	}
}

// saveLastFailure records d's latest failure reason in relay_sinks.
func (f *Fanout) saveLastFailure(ctx context.Context, d *dest) {
	d.failureDirty.Store(false)
	d.mu.Lock()
	reason := d.lastFailure
	d.mu.Unlock()
	if _, err := f.cfg.Pool.Exec(ctx, sqlSetLastReason, d.spec.Name, reason); err != nil && ctx.Err() == nil {
		d.failureDirty.Store(true)
		d.log.Warn("record the sink's last failure", "err", err)
	}
}
