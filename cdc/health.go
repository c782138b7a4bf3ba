package cdc

import (
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
)

// DefaultStallAfter is how long committed work may wait behind the
// acknowledged position, or the stream stay down, before Health says the
// stream is stalled.
const DefaultStallAfter = time.Minute

// BatchFailureThreshold is how many times in a row the same batch may fail
// before Health reports it at once, without waiting for StallAfter: a
// transient error (a deadlock, a restart) rarely hits one batch five times
// within the few seconds the backoff takes to get there.
const BatchFailureThreshold = 5

// Health is the stream's own view of whether it keeps up with committed
// work (for /readyz and the metrics). A replica standing by for the slot is
// healthy: another one streams.
type Health struct {
	// Stalled: work handed to the sink has waited longer than StallAfter
	// without the acknowledged position moving past it, the stream has been
	// down (not streaming, and not standing by) that long, or the same batch
	// failed BatchFailureThreshold times in a row.
	Stalled bool
	// Reasons say why, one line each, starting with "stream: ".
	Reasons []string
	// BatchFailures counts every batch the sink failed on since the start.
	BatchFailures uint64
}

// health is the state behind Health, updated by the sink goroutine and by
// Run's session loop.
type health struct {
	mu sync.Mutex
	// handed is the end of the newest batch handed to the sink, done the
	// end of the newest one it committed; work waits while handed > done,
	// since waitSince (the later of the newest commit and the moment work
	// started waiting).
	handed, done pglogrepl.LSN
	waitSince    time.Time
	// failures counts the consecutive failures of the batch at failLSN
	// (its end), the stream being stuck at failFrom (done then).
	failures          int
	failFrom, failLSN pglogrepl.LSN
	failErr           string
	total             uint64
	// downSince is when the stream stopped streaming with an error (zero
	// while it streams or stands by); downErr is the newest such error.
	downSince time.Time
	downErr   string
}

func (h *health) handOver(b Batch, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.handed <= h.done {
		h.waitSince = now
	}
	h.handed = max(h.handed, b.EndLSN)
}

func (h *health) committed(b Batch, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.done = max(h.done, b.EndLSN)
	h.waitSince = now
	h.failures, h.failErr = 0, ""
}

func (h *health) failed(b Batch, err string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.total++
	if h.failures > 0 && h.failFrom == h.done {
		h.failures++
	} else {
		h.failures, h.failFrom = 1, h.done
	}
	h.failLSN, h.failErr = b.EndLSN, err
}

// sessionEnded records that the stream is not streaming because of err.
func (h *health) sessionEnded(err string, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.downSince.IsZero() {
		h.downSince = now
	}
	h.downErr = err
}

// streaming records that a session streams again.
func (h *health) streaming() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.downSince, h.downErr = time.Time{}, ""
}

// standingBy forgets this process's view of the slot: another replica
// leads it, and what this one handed over before is that one's business.
func (h *health) standingBy() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.handed, h.done = 0, 0
	h.failures, h.failErr = 0, ""
	h.downSince, h.downErr = time.Time{}, ""
}

func (h *health) report(stallAfter time.Duration, now time.Time) Health {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := Health{BatchFailures: h.total}
	waiting := h.handed > h.done && now.Sub(h.waitSince) > stallAfter
	switch {
	case h.failures >= BatchFailureThreshold || (waiting && h.failures > 0):
		out.Reasons = append(out.Reasons, fmt.Sprintf("stream: the batch at %s failed %d times: %s", h.failLSN, h.failures, h.failErr))
	case waiting:
		out.Reasons = append(out.Reasons, fmt.Sprintf("stream: committed work up to %s has waited %s behind the acknowledged position %s",
			h.handed, now.Sub(h.waitSince).Round(time.Second), h.done))
	}
	if !h.downSince.IsZero() && now.Sub(h.downSince) > stallAfter && h.failures == 0 {
		out.Reasons = append(out.Reasons, fmt.Sprintf("stream: not streaming for %s: %s", now.Sub(h.downSince).Round(time.Second), h.downErr))
	}
	out.Stalled = len(out.Reasons) > 0
	return out
}

// Health reports whether the stream keeps up; see Health.
func (s *Stream) Health() Health {
	return s.health.report(s.cfg.StallAfter, time.Now())
}
