package cdc

import (
	"context"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/compensa/compensa/outbox"
)

// Batch is the outbox rows of one source transaction (or one part of a large
// one), in commit order.
type Batch struct {
	// Slot is the replication slot the batch came from; the sink keys its
	// checkpoint by it.
	Slot   string
	Events []outbox.Event
	// CommitLSN is the LSN of the source transaction's commit record.
	CommitLSN pglogrepl.LSN
	// EndLSN is the end of the commit record: once the sink has committed the
	// batch, the stream may report EndLSN as flushed.
	//
	// A Partial batch of a streamed transaction cannot know its end yet: its
	// EndLSN is CommitLSN+1, the smallest end the transaction can have, so
	// that "checkpoint >= EndLSN" still means "this transaction was handled"
	// (the previous transaction may end exactly at CommitLSN). Snapshot
	// batches, partial or not, carry the slot's consistent point.
	EndLSN     pglogrepl.LSN
	CommitTime time.Time
	// Partial marks a part of a large transaction that is not its last: the
	// sink commits its effects but must not advance the checkpoint, and the
	// stream does not acknowledge anything until the last part is handled.
	// A crash in between replays the whole transaction; the unique indexes
	// absorb the overlap.
	Partial bool
	// Snapshot marks rows read from the slot's exported snapshot on first
	// start (rows committed before the slot existed).
	Snapshot bool
	// Heartbeat marks the transaction of a relay heartbeat: no events, but
	// the checkpoint moves.
	Heartbeat bool
	// Transactions is how many source transactions the batch holds: the
	// stream merges whole transactions that queued up while the sink was
	// busy into one batch (its CommitLSN, EndLSN and CommitTime are the
	// newest one's). Zero for snapshot batches and parts.
	Transactions int
}

// Sink handles batches. HandleBatch must commit the batch's effects and, for a
// batch that is not Partial, the checkpoint (Slot → EndLSN) in one transaction,
// and return only after the commit: a nil error lets the stream acknowledge
// EndLSN to PostgreSQL. A batch with no events (a heartbeat, or a transaction
// that touched no outbox row) still moves the checkpoint. An error stops the
// stream; nothing is acknowledged past the last successful batch.
type Sink interface {
	HandleBatch(ctx context.Context, b Batch) error
}

// SinkFunc adapts a function to Sink.
type SinkFunc func(ctx context.Context, b Batch) error

// HandleBatch calls f.
func (f SinkFunc) HandleBatch(ctx context.Context, b Batch) error { return f(ctx, b) }
