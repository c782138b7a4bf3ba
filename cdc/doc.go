// Package cdc streams committed outbox inserts, and outbox events written as
// logical decoding messages, out of PostgreSQL's write-ahead log (logical
// replication, pgoutput) and hands them to a Sink, one Batch per source
// transaction.
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
//   - Messages are events too. A transactional logical decoding message with
//     Config.MessagePrefix ("outbox"; pg_logical_emit_message, PostgreSQL
//     14+) whose content is a JSON object with the outbox fields is an Event
//     of its transaction, in WAL order with the transaction's rows; without
//     an id it gets MessageEventID of its position, the same on every
//     replay. A non-transactional one, or content that is not JSON or has no
//     event_type, is a refused Event (Message and Poison set). A message
//     exists only in the WAL: once the slot has passed it, nothing (a resync,
//     a replay) can read it again.
//   - Secrets never appear in errors or logs.
//
// Transient failures (server restart, walsender terminated, connection cut,
// a sink error) end the current session; Run reconnects with capped
// exponential backoff and resumes from the slot's confirmed position. It logs
// the recovery once, when it streams again (after a sink error, when a batch
// commits again).
//
// A resync (OnSlotLost "resync") records its window in the slot's row of
// relay_checkpoints before it replaces the lost slot and clears it once the
// window was re-read; a Run that finds the marker re-reads that window
// before it streams, so a process killed in the middle loses nothing.
//
// # Least privilege
//
// The stream needs no superuser:
//
//	CREATE ROLE relay LOGIN REPLICATION PASSWORD '...';
//	GRANT SELECT ON outbox, relay_checkpoints TO relay; -- first-start read, checkpoint
//	GRANT DELETE ON outbox TO relay;                     -- only with Retention
//	GRANT UPDATE ON relay_checkpoints TO relay;          -- only with OnSlotLost "resync": its marker
//
// plus the correlator's grants on its own tables. The publication is created
// by Run when the role may (it must own the outbox table and have CREATE on
// the database); otherwise create it once as the table's owner, with Setup
// (`relay migrate --create-slot`) or by hand:
//
//	CREATE PUBLICATION relay_outbox_pub FOR TABLE outbox WITH (publish = 'insert');
//
// A logical replication connection (replication=database) matches the
// ordinary pg_hba.conf lines of its database; the DSN's sslmode and other
// settings apply to every connection the stream opens.
//
// # Lag
//
// Stream.Lag is the in-process view: bytes behind the newest server position
// seen, and seconds as the age of the oldest transaction received and not
// yet committed by the sink (0 when caught up). QueryLag is the view from
// any process: bytes are pg_current_wal_lsn() − confirmed_flush_lsn;
// seconds are the age of the oldest outbox row created after the source
// commit time of the newest transaction the sink handled
// (relay_checkpoints.updated_at), 0 when there is none. Neither grows while
// the outbox is idle, whatever the heartbeat interval.
package cdc
