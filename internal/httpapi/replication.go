package httpapi

import (
	"context"
	"sync"
	"time"
)

// ReplicationStatus is what /v1/replication reports about the relay's slot.
// Its JSON keys are those of `relay lag --json` (cdc.LagReport) plus exists
// and streamer.
type ReplicationStatus struct {
	Slot string `json:"slot"`
	// Exists is false when the slot is gone: the relay cannot resume
	// without possibly skipping events.
	Exists bool `json:"exists"`
	// Active: a walsender streams from the slot right now.
	Active bool `json:"active"`
	// WALStatus is pg_replication_slots.wal_status (reserved, extended,
	// unreserved, lost).
	WALStatus string `json:"wal_status"`
	LagBytes  int64  `json:"lag_bytes"`
	// LagSeconds is the age of the oldest committed outbox row the relay
	// has not handled yet: 0 when it is caught up (cdc.LagReport); nil when
	// unknown (no checkpoint yet).
	LagSeconds        *float64 `json:"lag_seconds"`
	ConfirmedFlushLSN string   `json:"confirmed_flush_lsn"`
	CurrentLSN        string   `json:"current_lsn"`
	// Streamer says which replica streams: the walsender's pid, the
	// client's application name and address, from pg_stat_replication.
	// The server fills it in when the ReplicationFunc leaves it empty; ""
	// when nobody streams.
	Streamer string `json:"streamer"`
	// Failover, SynchronizedStandbySlots and FailoverReady: whether the
	// slot survives a promotion (PostgreSQL 17+), as cdc.LagReport.
	Failover                 bool   `json:"failover"`
	SynchronizedStandbySlots string `json:"synchronized_standby_slots"`
	FailoverReady            bool   `json:"failover_ready"`
}

// Healthy reports whether the slot can still deliver every event: it exists
// and its WAL is not lost. An inactive slot is healthy: between two
// leaders nobody streams for a few seconds.
func (s ReplicationStatus) Healthy() bool { return s.Exists && s.WALStatus != "lost" }

// ReplicationFunc returns the slot's status, read from the database (for
// example by cdc.QueryLag) so that any replica can answer.
type ReplicationFunc func(ctx context.Context) (ReplicationStatus, error)

// LagSample is one point of the lag chart.
type LagSample struct {
	At         time.Time `json:"at"`
	LagBytes   int64     `json:"lag_bytes"`
	LagSeconds float64   `json:"lag_seconds"`
	OK         bool      `json:"ok"`
}

// lagRing keeps the newest samples, oldest first when read.
type lagRing struct {
	mu      sync.Mutex
	buf     []LagSample
	next    int
	full    bool
	minGap  time.Duration
	lastAdd time.Time
}

func newLagRing(size int, minGap time.Duration) *lagRing {
	return &lagRing{buf: make([]LagSample, size), minGap: minGap}
}

// add stores s unless a sample was stored less than minGap ago (requests
// for the page also sample, and must not crowd out the minutes the chart
// is meant to show).
func (r *lagRing) add(s LagSample) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.lastAdd.IsZero() && s.At.Sub(r.lastAdd) < r.minGap {
		return
	}
	r.lastAdd = s.At
	r.buf[r.next] = s
	r.next = (r.next + 1) % len(r.buf)
	if r.next == 0 {
		r.full = true
	}
}

func (r *lagRing) samples() []LagSample {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.full {
		return append([]LagSample(nil), r.buf[:r.next]...)
	}
	out := make([]LagSample, 0, len(r.buf))
	out = append(out, r.buf[r.next:]...)
	return append(out, r.buf[:r.next]...)
}
