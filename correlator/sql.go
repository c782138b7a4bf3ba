package correlator

// The correlator's SQL, in one place. Every statement takes column arrays and
// unnests them, so a batch of any size costs one statement per kind of effect.

// sqlCheckpoint advances the slot's checkpoint only forwards; it returns no
// row when the batch is not past it (a replay). updated_at is the source
// commit time of the batch's newest transaction (now() for a first-start
// read): every outbox row created after it is not handled yet, which is
// what cdc.QueryLag measures. It returns the transaction's now(), which a
// start sent as COPY needs (copyRows).
const sqlCheckpoint = `
INSERT INTO relay_checkpoints AS c (slot_name, lsn, updated_at)
VALUES ($1, $2::pg_lsn, coalesce($3::timestamptz, now()))
ON CONFLICT (slot_name) DO UPDATE SET lsn = EXCLUDED.lsn, updated_at = EXCLUDED.updated_at
WHERE c.lsn < EXCLUDED.lsn
RETURNING now()`

// The start's INSERT comes in two forms. A batch whose triggers are all new
// (every batch, as long as nothing is read twice) inserts plainly: the unique
// index saga_trigger_once_uq (trigger_event_id, saga_name) refuses a second
// start of a trigger, whatever the version, and with it the batch's
// transaction. The correlator then starts the batch again with the guarded
// form, ON CONFLICT DO NOTHING, which turns a second start into nothing (see
// Correlator.HandleBatch). The plain form spares every start the
// speculative insertion of ON CONFLICT (a probe of each unique index before
// the insert, a lock and a confirmation record in the WAL), a fifth of the
// start's server time, and it returns nothing: it starts every instance or
// fails. The guarded form returns how many instances it created, per saga.

const startColumns = `
  INSERT INTO saga_instances (id, tenant_id, workspace_id, saga_name, saga_version, trigger_event_id,
                              correlation_id, context, timeout_at, next_attempt_at, trigger_aggregate_id, traceparent)
  SELECT t.id, t.tenant, t.workspace, t.saga, t.version, t.trigger, t.corr, t.ctx::jsonb,
         CASE WHEN t.deadline_us > 0 THEN now() + t.deadline_us * interval '1 microsecond' END,
         now(), t.aggregate, t.traceparent
  FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::int[], $5::uuid[], $6::uuid[], $7::text[], $8::bigint[], $9::text[], $10::uuid[], $11::text[])
       AS t(tenant, workspace, saga, version, trigger, corr, ctx, deadline_us, aggregate, id, traceparent)`

// sqlCopyStart is sqlStart for a batch of many starts (copyStarts): the
// rows of copyRows, with the columns of sqlStart in the same order.
const sqlCopyStart = `COPY saga_instances (id, tenant_id, workspace_id, saga_name, saga_version, trigger_event_id,
  correlation_id, context, timeout_at, next_attempt_at, trigger_aggregate_id, traceparent) FROM STDIN (FORMAT binary)`

const startCount = `
  RETURNING saga_name)
SELECT saga_name, count(*)::int FROM ins GROUP BY saga_name`

// sqlStart starts one instance per (saga, trigger event) of a batch whose
// triggers are new.
const sqlStart = startColumns

// sqlStartGuarded is sqlStart for a batch that may hold triggers started
// before: those start nothing.
const sqlStartGuarded = `
WITH ins AS (` + startColumns + `
  ON CONFLICT DO NOTHING` + startCount

const keyedColumns = `
  INSERT INTO saga_instances (id, tenant_id, workspace_id, saga_name, saga_version, trigger_event_id,
                              correlation_id, context, timeout_at, next_attempt_at, trigger_aggregate_id,
                              concurrency_key, concurrency_limit, concurrency_lsn, concurrency_ord, traceparent)
  SELECT t.id, t.tenant, t.workspace, t.saga, t.version, t.trigger, t.corr, t.ctx::jsonb,
         CASE WHEN t.deadline_us > 0 THEN now() + t.deadline_us * interval '1 microsecond' END,
         now(), t.aggregate, t.ckey, t.climit, t.clsn::pg_lsn, t.cord, t.traceparent
  FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::int[], $5::uuid[], $6::uuid[], $7::text[], $8::bigint[], $9::text[], $10::uuid[],
              $11::text[], $12::int[], $13::text[], $14::int[], $15::text[])
       AS t(tenant, workspace, saga, version, trigger, corr, ctx, deadline_us, aggregate, id, ckey, climit, clsn, cord, traceparent)`

// sqlStartKeyed is sqlStart for a batch in which some saga has a
// concurrency limit: it also stores each instance's concurrency key, limit
// and place in the stream (NULL for the others), which the runner's claim
// reads. A batch without one uses sqlStart and pays nothing for it.
const sqlStartKeyed = keyedColumns

// sqlStartKeyedGuarded is sqlStartKeyed with ON CONFLICT DO NOTHING.
const sqlStartKeyedGuarded = `
WITH ins AS (` + keyedColumns + `
  ON CONFLICT DO NOTHING` + startCount

// sqlReplies delivers replies to instances waiting on their correlation id.
// Only events not yet in the inbox count, so a replayed reply is a no-op. Of
// several fresh replies for one instance, the first in stream order is
// delivered and the others are recorded as late, as they would be had they
// come in separate batches. Waiting rows are locked before they are read
// again, so a step that stopped waiting meanwhile gets nothing, and the inbox
// records what the UPDATE actually delivered. Delivery revokes the lease, so
// a worker still holding one cannot commit over the reply, and journals a
// reply_received event. An instance paused while it waited takes its reply
// and stays PAUSED (the update leaves the status alone); it uses the reply
// when resumed. A reply is accepted only from the waiting instance's
// own tenant: one from another tenant is never delivered, is recorded in the
// inbox as foreign, and its event id is returned for the caller to park. It
// returns (delivered, late, foreign event ids).
const sqlReplies = `
WITH ev AS (
  SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $5::uuid[]) WITH ORDINALITY AS e(event_id, corr, payload, tenant, ord)
),
fresh AS (
  SELECT DISTINCT ON (ev.event_id) ev.* FROM ev
  WHERE NOT EXISTS (SELECT 1 FROM relay_inbox i WHERE i.consumer = $4 AND i.event_id = ev.event_id)
  ORDER BY ev.event_id, ev.ord
),
waiting AS (
  SELECT si.id, si.awaiting_correlation_id AS corr, si.tenant_id AS tenant FROM saga_instances si
  WHERE si.awaiting_correlation_id IN (SELECT corr FROM fresh) AND si.status IN ('RUNNING', 'PAUSED')
  FOR UPDATE
),
chosen AS (
  SELECT DISTINCT ON (w.id) w.id, f.event_id, f.payload
  FROM waiting w JOIN fresh f ON f.corr = w.corr AND f.tenant = w.tenant
  ORDER BY w.id, f.ord
),
foreign_reply AS (
  SELECT DISTINCT f.event_id FROM fresh f JOIN waiting w ON f.corr = w.corr AND f.tenant <> w.tenant
),
delivered AS (
  UPDATE saga_instances si
  SET reply = c.payload::jsonb, awaiting_correlation_id = NULL, awaiting_until = NULL,
      next_attempt_at = now(), lease_id = NULL, lease_expires_at = NULL,
      current_version = si.current_version + 1, updated_at = now()
  FROM chosen c
  WHERE si.id = c.id
  RETURNING si.id, si.current_version, si.current_step, c.event_id, c.payload
),
inbox AS (
  INSERT INTO relay_inbox (consumer, event_id, instance_id, outcome)
  SELECT DISTINCT ON (f.event_id) $4, f.event_id, d.id,
         CASE WHEN d.id IS NOT NULL THEN 'delivered'
              WHEN f.event_id IN (SELECT event_id FROM foreign_reply) THEN 'foreign'
              ELSE 'late' END
  FROM fresh f LEFT JOIN delivered d ON d.event_id = f.event_id
  ORDER BY f.event_id, d.id
  ON CONFLICT (consumer, event_id) DO NOTHING
  RETURNING outcome
),
journaled AS (
  INSERT INTO saga_events (instance_id, version, kind, step, payload, xid)
  SELECT d.id, d.current_version, 'reply_received', d.current_step,
         jsonb_build_object('kind', 'reply_received', 'step', d.current_step,
                            'output', d.payload::jsonb, 'reason', 'reply event ' || d.event_id::text),
         GREATEST(pg_current_xact_id(),
                  (SELECT p.xid FROM saga_events p WHERE p.instance_id = d.id AND p.version = d.current_version - 1))
  FROM delivered d
  RETURNING 1
)
SELECT (SELECT count(*) FROM journaled), (SELECT count(*) FROM inbox WHERE outcome = 'late'),
       (SELECT coalesce(array_agg(event_id), '{}') FROM foreign_reply
         WHERE event_id NOT IN (SELECT event_id FROM delivered))`

// sqlPark parks unusable events with their reason. It returns how many rows
// it added (a replayed part of a large transaction adds none).
const sqlPark = `
WITH ins AS (
  INSERT INTO relay_dead_letters (event_id, event_type, lsn, reason, raw)
  SELECT t.event_id, t.event_type, t.lsn::pg_lsn, t.reason, t.raw::jsonb
  FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[]) AS t(event_id, event_type, lsn, reason, raw)
  ON CONFLICT DO NOTHING
  RETURNING 1)
SELECT count(*) FROM ins`

// sqlTriggersVisible reports whether every transaction of $1 (32-bit xids
// from logical decoding, recent) is visible to the statement's snapshot. The
// epoch comes from the snapshot's xmax: a recent xid above xmax's low 32 bits
// belongs to the epoch before.
const sqlTriggersVisible = `
WITH r AS (SELECT pg_current_snapshot() AS snap, pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS xmax)
SELECT coalesce(bool_and(pg_visible_in_snapshot(
         (GREATEST(0, (r.xmax >> 32) - CASE WHEN x > (r.xmax & 4294967295) THEN 1 ELSE 0 END) << 32 | x)::text::xid8,
         r.snap)), true)
FROM r, unnest($1::bigint[]) AS x`
