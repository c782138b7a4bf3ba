// Package correlator turns batches of outbox events from the stream into saga
// work, one database transaction per batch:
//
//   - a trigger event starts exactly one instance of each saga it routes to,
//     whatever the version: the unique index saga_trigger_once_uq over
//     (trigger_event_id, saga_name) refuses a second one, never
//     SELECT-then-INSERT. A batch inserts plainly (with COPY when it
//     starts many, planned a chunk at a time while the COPY runs); one the
//     index refuses starts again with INSERT … ON CONFLICT DO NOTHING, as
//     do the batches after it for a while;
//   - an event whose correlation id matches an instance waiting on a step is
//     delivered to it as a reply, at most once (relay_inbox keyed by
//     (consumer, event id)); a reply nobody waits for is recorded as late;
//   - an event that cannot be used is parked in relay_dead_letters with its
//     reason, LSN and raw row, and the rest of the batch goes on; nothing a
//     row holds can make parking (or a start) fail: keys are made UTF-8 and
//     clipped, raw values sanitized and clipped;
//   - the checkpoint (slot → end LSN) commits with those effects, so that a
//     batch replayed after a crash is recognised and skipped.
//
// A batch costs a fixed number of statements whatever its size: arrays are
// sent once and unnested in SQL, or the starts' rows go in one COPY. An event with no tenant starts its instance
// under the nil tenant 00000000-0000-0000-0000-000000000000.
//
// The correlator does not run steps; after a commit that started or woke
// instances it signals the runner (in process, and with pg_notify on
// WakeChannel for runners in other processes).
package correlator
