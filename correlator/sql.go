package correlator

// The correlator's SQL, in one place. Every statement takes column arrays and
// unnests them, so a batch of any size costs one statement per kind of effect.

// sqlCheckpoint advances the slot's checkpoint only forwards; it affects no
// row when the batch is not past it (a replay).
const sqlCheckpoint = `
INSERT INTO relay_checkpoints AS c (slot_name, lsn, updated_at)
VALUES ($1, $2::pg_lsn, now())
ON CONFLICT (slot_name) DO UPDATE SET lsn = EXCLUDED.lsn, updated_at = now()
WHERE c.lsn < EXCLUDED.lsn`

// sqlStart starts one instance per (saga, version, trigger event); the unique
// index saga_trigger_uq turns a second start into nothing. It returns how
// many instances it created, per saga.
const sqlStart = `
WITH ins AS (
  INSERT INTO saga_instances (tenant_id, workspace_id, saga_name, saga_version, trigger_event_id,
                              correlation_id, context, timeout_at, next_attempt_at)
  SELECT t.tenant, t.workspace, t.saga, t.version, t.trigger, t.corr, t.ctx::jsonb,
         CASE WHEN t.deadline_us > 0 THEN now() + t.deadline_us * interval '1 microsecond' END,
         now()
  FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::int[], $5::uuid[], $6::uuid[], $7::text[], $8::bigint[])
       AS t(tenant, workspace, saga, version, trigger, corr, ctx, deadline_us)
  ON CONFLICT (saga_name, saga_version, trigger_event_id) DO NOTHING
  RETURNING saga_name)
SELECT saga_name, count(*)::int FROM ins GROUP BY saga_name`

// sqlReplies delivers replies to instances waiting on the correlation id. The
// inbox row goes in first (ON CONFLICT DO NOTHING): only an event that was not
// in the inbox is delivered, so a replayed reply is a no-op. Delivery revokes
// the lease, so a worker still holding one cannot commit over the reply, and
// journals a reply_received event. It returns (delivered, late).
const sqlReplies = `
WITH ev AS (
  SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[]) AS e(event_id, corr, payload)
),
target AS (
  SELECT DISTINCT ON (ev.event_id) ev.event_id, ev.corr, ev.payload, si.id AS instance_id
  FROM ev LEFT JOIN saga_instances si
    ON si.awaiting_correlation_id = ev.corr AND si.status = 'RUNNING'
  ORDER BY ev.event_id
),
inbox AS (
  INSERT INTO relay_inbox (consumer, event_id, instance_id, outcome)
  SELECT $4, event_id, instance_id, CASE WHEN instance_id IS NULL THEN 'late' ELSE 'delivered' END
  FROM target
  ON CONFLICT (consumer, event_id) DO NOTHING
  RETURNING event_id, instance_id, outcome
),
delivered AS (
  UPDATE saga_instances si
  SET reply = t.payload::jsonb, awaiting_correlation_id = NULL, awaiting_until = NULL,
      next_attempt_at = now(), lease_id = NULL, lease_expires_at = NULL,
      current_version = si.current_version + 1, updated_at = now()
  FROM inbox i JOIN target t ON t.event_id = i.event_id
  WHERE i.outcome = 'delivered' AND si.id = i.instance_id AND si.awaiting_correlation_id = t.corr
  RETURNING si.id, si.current_version, si.current_step, t.event_id, t.payload
),
journaled AS (
  INSERT INTO saga_events (instance_id, version, kind, step, payload)
  SELECT d.id, d.current_version, 'reply_received', d.current_step,
         jsonb_build_object('kind', 'reply_received', 'step', d.current_step,
                            'output', d.payload::jsonb, 'reason', 'reply event ' || d.event_id::text)
  FROM delivered d
  RETURNING 1
)
SELECT (SELECT count(*) FROM journaled), (SELECT count(*) FROM inbox WHERE outcome = 'late')`

// sqlPark parks unusable events with their reason. It returns how many rows
// it added (a replayed part of a large transaction adds none).
const sqlPark = `
WITH ins AS (
  INSERT INTO relay_dead_letters (event_id, event_type, lsn, reason, raw)
  SELECT t.event_id, t.event_type, t.lsn::pg_lsn, t.reason, t.raw::jsonb
  FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[]) AS t(event_id, event_type, lsn, reason, raw)
  ON CONFLICT (lsn, event_id, event_type) DO NOTHING
  RETURNING 1)
SELECT count(*) FROM ins`
