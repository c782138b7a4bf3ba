// Package cdc streams committed outbox inserts out of PostgreSQL's
// write-ahead log (logical replication, pgoutput) and hands them to a Sink,
// one Batch per source transaction.
//
// It owns the replication slot and the publication, pgoutput decoding,
// batching by transaction, acknowledging LSNs, heartbeats, lag, leader
// election between replicas and the optional outbox retention. It never
// touches saga tables.
//
// What it promises:
//
//   - Exact acknowledgement. The flush position reported to PostgreSQL is the
//     end LSN of the newest batch the sink committed (or, when nothing is in
//     flight, the server's own WAL end from a keepalive or a transaction
//     without outbox rows); it never moves backwards and write, flush and
//     apply are always set explicitly. A crash replays at most the batches
//     the sink had not reported done; the sink's checkpoint and unique
//     indexes absorb the replay.
//   - Idle protection. A transactional logical message ("compensa_heartbeat")
//     every HeartbeatInterval becomes an empty Batch, so the checkpoint and
//     the slot advance while the outbox is idle and other tables write.
//   - One streamer per slot. A session advisory lock keyed by the slot name
//     elects the leader; other replicas poll and take over within about
//     LeaderPollInterval once the leader's session ends.
//   - Slot loss is fatal. A slot that is missing while a checkpoint exists, or
//     whose wal_status is 'lost', stops Run with ErrSlotLost: events may have
//     been skipped, so the slot is re-created only with Config.RecreateSlot.
//   - Nothing written before the slot existed is lost. On first start (no
//     checkpoint) the slot is created with an exported snapshot; the outbox
//     rows visible in it are handed over as Snapshot batches, and streaming
//     starts at the slot's consistent point.
//   - Bounded memory. A transaction with more than MaxBatchEvents outbox rows
//     is handed over in Partial batches; the checkpoint reaches the
//     transaction's end only with the last one.
//   - A row that cannot be decoded (payload that is not JSON, a tenant id that
//     is not a UUID) becomes an Event with Poison set, never a crash.
//   - Secrets never appear in errors or logs.
//
// Transient failures (server restart, walsender terminated, connection cut,
// a sink error) end the current session; Run reconnects with capped
// exponential backoff and resumes from the slot's confirmed position.
package cdc
