package cdc

import (
	"time"

	"github.com/jackc/pglogrepl"
)

// Metrics observes the stream. Implementations must be cheap and safe for
// concurrent use; embed NopMetrics to implement only some methods.
type Metrics interface {
	// BatchHandled is called after the sink committed a batch.
	BatchHandled(BatchStats)
	// LagObserved is called after every status update sent to PostgreSQL.
	LagObserved(Lag)
	// LeaderChanged is called when this stream takes or loses leadership.
	LeaderChanged(leader bool)
	// Reconnecting is called when a session ended with a transient error and
	// the stream will retry after wait.
	Reconnecting(err error, wait time.Duration)
}

// BatchStats describes one batch the sink committed.
type BatchStats struct {
	Events int
	// Poison counts the events that carry a Poison reason.
	Poison    int
	Partial   bool
	Snapshot  bool
	Heartbeat bool
	EndLSN    pglogrepl.LSN
	// Duration is how long HandleBatch took.
	Duration time.Duration
}

// NopMetrics ignores everything.
type NopMetrics struct{}

func (NopMetrics) BatchHandled(BatchStats)           {}
func (NopMetrics) LagObserved(Lag)                   {}
func (NopMetrics) LeaderChanged(bool)                {}
func (NopMetrics) Reconnecting(error, time.Duration) {}
