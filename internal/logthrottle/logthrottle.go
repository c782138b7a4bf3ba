// Package logthrottle keeps a failure that repeats from flooding the log:
// the first occurrence is logged, then at most one line per interval with
// the number of repeats, and the recovery once. Each component (the stream,
// the runner, a sink's drainer, the monitor) owns a Throttle; a key names
// one kind of failure within it, so that differing error texts of the same
// failure (a database that is down) count as repeats.
package logthrottle

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// DefaultInterval is how often a repeating failure is logged again.
const DefaultInterval = time.Minute

// Throttle logs failures per key through its logger. The zero value is not
// usable: build one with New. It is safe for concurrent use.
type Throttle struct {
	log      *slog.Logger
	interval time.Duration
	now      func() time.Time

	mu   sync.Mutex
	keys map[string]*failure
}

type failure struct {
	since    time.Time // first occurrence
	lastLine time.Time // newest line written
	repeats  int       // occurrences since lastLine, not logged
	total    int       // occurrences since since
}

// New returns a Throttle logging to log (nil: discarded) at most once per
// interval per key after the first occurrence (0: DefaultInterval).
func New(log *slog.Logger, interval time.Duration) *Throttle {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if interval <= 0 {
		interval = DefaultInterval
	}
	return &Throttle{log: log, interval: interval, now: time.Now, keys: map[string]*failure{}}
}

// Warn records an occurrence of the failure key: it is logged at WARN when
// it is the first since the key last recovered, or when the interval has
// passed since the key's last line; then the message ends with
// "(repeated N times in the last S s)". It reports whether a line was
// written.
func (t *Throttle) Warn(key, msg string, args ...any) bool {
	return t.Log(slog.LevelWarn, key, msg, args...)
}

// Error is Warn at level ERROR.
func (t *Throttle) Error(key, msg string, args ...any) bool {
	return t.Log(slog.LevelError, key, msg, args...)
}

// Log is Warn at the given level.
func (t *Throttle) Log(level slog.Level, key, msg string, args ...any) bool {
	now := t.now()
	t.mu.Lock()
	f := t.keys[key]
	switch {
	case f == nil:
		t.keys[key] = &failure{since: now, lastLine: now, total: 1}
	case now.Sub(f.lastLine) >= t.interval:
		f.repeats++
		f.total++
		msg += fmt.Sprintf(" (repeated %d times in the last %d s)", f.repeats, int(now.Sub(f.lastLine).Round(time.Second)/time.Second))
		f.lastLine, f.repeats = now, 0
	default:
		f.repeats++
		f.total++
		t.mu.Unlock()
		return false
	}
	t.mu.Unlock()
	t.log.Log(context.Background(), level, msg, args...)
	return true
}

// Failing reports whether key failed since it last recovered.
func (t *Throttle) Failing(key string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.keys[key] != nil
}

// Recovered ends the failure key: when it was failing, msg is logged at
// INFO with how many times it failed and for how long, and true returned;
// otherwise nothing is logged (a recovery from nothing is no news).
func (t *Throttle) Recovered(key, msg string, args ...any) bool {
	now := t.now()
	t.mu.Lock()
	f := t.keys[key]
	delete(t.keys, key)
	t.mu.Unlock()
	if f == nil {
		return false
	}
	args = append(args, "failures", f.total, "failing_for", now.Sub(f.since).Round(time.Second).String())
	t.log.Info(msg, args...)
	return true
}
