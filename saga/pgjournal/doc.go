// Package pgjournal is the PostgreSQL saga.Journal: saga_instances is the
// mutable projection (status, position, lease), saga_events the append-only
// history (keyed by instance and version), saga_steps one record per step
// (keyed by instance and sequence). Every change is computed by
// saga.Advance, the same function the memory reference (saga/memjournal)
// uses, and both pass one conformance suite (saga/journaltest) plus a model
// test that drives them with the same random operations.
//
// # Transactions
//
// Every call joins the caller's transaction when the context carries one
// (saga.ContextWithTx), so that the runner commits a step's writes, its
// outbox rows and its journal entry together. The journal expects READ
// COMMITTED there. A refused write (ErrNotFound, ErrConflict, ErrLeaseLost,
// ErrInvalid) leaves the caller's transaction usable. Without one, the
// journal runs its own: BEGIN rides in the same round trip as the locking
// read and COMMIT in the same as the write, so Append and MarkTerminal cost
// two round trips either way; ClaimPending and Heartbeat are one statement
// each. In its own transactions the locking read runs one plan per
// connection, made without sequential scans (plan_cache_mode and
// enable_seqscan for that transaction only): planning it for every call
// cost more than reading.
//
// # Clock and fencing
//
// The journal has one clock: PostgreSQL's clock_timestamp() at the
// statement, or Config.Now when set (tests). Not now(): inside a long
// transaction now() is frozen at its start, and a step transaction that began
// before its lease expired would pass a now() fence long after expiry. Every
// instant (claims, lease expiry, next_attempt_at, event stamps) comes from
// that clock. A fenced write reads the instance FOR UPDATE together with the
// clock and requires lease_id = the caller's and lease_expires_at >= now
// (saga.HoldsLease: at exact expiry the lease still holds); a claim takes an
// instance only when lease_expires_at < now, so the two never overlap. The
// row lock is held until commit, so nobody can take the lease between the
// check and the write.
//
// Tests control time through Config.Now: every statement receives it as
// COALESCE($n::timestamptz, clock_timestamp()), so a test sets the clock to
// a lease's expiry, to the microsecond, and the fence, the claim and the
// heartbeat all see exactly that instant (see the boundary subtests of
// saga/journaltest, run here in TestConformance). TestFenceUsesTheStatementClock
// checks the production clock: a transaction older than the expiry is fenced
// out although now() would let it through.
//
// # Errors
//
// The instance is checked first, then the lease, then what the caller sent:
// an unknown instance with a bad event is ErrNotFound, a stale lease with a
// bad event ErrLeaseLost, and Heartbeat and MarkTerminal answer (false, nil)
// to a stale lease and an unknown instance alike, so a zombie learns nothing.
//
// # Tailers
//
// LoadSince and HeadSeq never skip an event that commits late, and take no
// global lock. They read only events whose xid is below
// pg_snapshot_xmin(pg_current_snapshot()): every transaction below it has
// ended, and anything a running or future transaction adds has an xid at or
// above it. They read in (xid, global_seq) order and resume after the event a
// tailer names by its GlobalSeq: ordering by global_seq alone would not do,
// because a transaction can draw a lower global_seq, yet take its xid later
// and commit after one whose event a tailer has already passed
// (TestTailerReceivesALowerSeqThatCommitsAfterAHigherOneWasRead). The INSERT
// that appends an event raises its xid to its predecessor's when that is
// higher (looked up by primary key in the same statement), so an instance's
// events stay in version order for tailers; a row inserted without an xid
// gets it from a trigger that applies the same rule. The price: an event
// becomes readable only once every older transaction in the cluster (that
// has written anything) has ended, so a long write transaction anywhere
// delays tailers, never appends.
//
// # Writes
//
// A step is one statement after the locking read: the projection's UPDATE
// (a HOT update when no indexed column changes), the step record's upsert
// and the event's INSERT, the last two fed by the UPDATE's RETURNING, so
// that they are written only for an instance that exists and still has the
// version read. That is why the step records and events carry no foreign
// key to saga_instances (a lookup and a row lock per row): deleting an
// instance (or truncating saga_instances) deletes its step records and
// events by trigger instead. A step adds four index entries: the step
// record's primary key and the event's primary key, global_seq and
// (xid, global_seq).
//
// A group's steps (AppendGroup) are one statement for the whole group: the
// same three parts over arrays with a row per instance, each projection
// fenced by its own version, and the events inserted in the group's order.
// A statement's fixed cost (its executor's start and end, the index and
// trigger set-up, the protocol's messages) is then paid once a group, not
// once a step: BenchmarkGroupStepsCPU, groups of eight, went from about 170
// to 130 µs of server CPU a step when the statement first joined its rows
// by the group alone (the id = ANY lookup it now adds was within that
// benchmark's noise).
//
// # Throughput
//
// BenchmarkAppendConcurrent, 8 writers each appending to its own instance in
// its own transaction, this design ("xmin") against the serialised one (one
// pg_advisory_xact_lock before every append, held to commit; implemented only
// in the benchmark). Three runs of -benchtime 3s on 2 shared vCPUs (AMD
// EPYC) with a load average of 7-10 from other work, so read the ratio more
// than the figures:
//
//	cluster                    xmin (appends/s)   global lock (appends/s)
//	fsync off (test cluster)   2,280 - 3,670      1,030 - 1,430
//	fsync + synchronous_commit 1,070 - 1,620        190 - 1,000
//
// Without the lock, 8 writers go 2-3 times as fast with fsync off, and
// 1.6-7 times with durable commits, where the lock also serialises every
// commit's WAL flush.
package pgjournal
