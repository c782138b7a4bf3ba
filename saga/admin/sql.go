package admin

// The package's SQL, in one place. Statements are assembled only from the
// constant fragments below (which filters are present picks the fragments);
// every value is a bind parameter.
//
// Clocks: the stuck classification uses now() (a threshold of minutes does
// not care about the statement's age). lease_live and due use
// clock_timestamp(), the journal's clock: a transaction that waited for the
// row lock behind another operator's retry must compare with the instants
// that retry wrote, which are later than its own now().
//
// $1..$4 are the same in every statement that classifies: $1 the two
// thresholds (interval[]: StuckAfter, HoldAfter), $2 and $3 the registered (name, version) pairs as parallel
// arrays, $4 whether a registry is known at all.

// sqlStuckReason classifies one saga_instances row s. The order matters: an
// instance of an unregistered version is reported as such even when FAILED,
// since no retry here can help it. A lease is live while lease_expires_at >=
// now() (the same rule the fence uses), so an instance a runner is working on
// is never called overdue, nor one waiting for its turn behind older
// instances of its concurrency key (those are reported if they are stuck).
const sqlStuckReason = `
CASE
  WHEN $4::bool AND s.status IN ('RUNNING','COMPENSATING','FAILED')
       AND NOT EXISTS (SELECT 1 FROM unnest($2::text[], $3::int[]) AS r(name, version)
                       WHERE r.name = s.saga_name AND r.version = s.saga_version)
    THEN 'unregistered_version'
  WHEN s.status = 'FAILED' AND s.history_deleted_at IS NULL THEN 'failed'
  WHEN s.status IN ('RUNNING','COMPENSATING') AND s.held_since < now() - ($1::interval[])[2]
    THEN 'held'
  WHEN s.status IN ('RUNNING','COMPENSATING')
       AND s.next_attempt_at < now() - ($1::interval[])[1]
       AND NOT (s.lease_id IS NOT NULL AND s.lease_expires_at >= now())
       AND (s.concurrency_key IS NULL OR (
         SELECT count(*) FROM (
           SELECT 1 FROM saga_instances o
           WHERE o.saga_name = s.saga_name AND o.concurrency_key = s.concurrency_key
             AND o.status IN ('RUNNING', 'COMPENSATING', 'PAUSED')
             AND (o.concurrency_lsn, o.concurrency_ord) < (s.concurrency_lsn, s.concurrency_ord)
           LIMIT s.concurrency_limit) older) < s.concurrency_limit)
    THEN 'overdue'
  ELSE ''
END`

// sqlItemColumns is what a list item reads, in the order scanItem expects.
const sqlItemColumns = `
s.id, s.tenant_id, s.saga_name, s.saga_version, s.status::text, s.current_step, s.attempt,
s.next_attempt_at, s.timeout_at, coalesce(s.last_error, ''), s.lease_expires_at,
(s.lease_id IS NOT NULL AND s.lease_expires_at >= clock_timestamp()) AS lease_live,
s.created_at, s.updated_at, now() AS db_now, ` + sqlStuckReason + ` AS stuck_reason,
coalesce(s.compensation_reason, '') AS item_compensation_reason, s.awaiting_correlation_id IS NOT NULL AS item_awaiting,
s.history_deleted_at AS item_history_deleted_at, s.held_since AS item_held_since`

// sqlListHead starts the list query; where clauses and the order follow.
// The inner query classifies; the outer one filters on the classification
// so that the keyset order and limit apply to stuck rows only.
const sqlListHead = `SELECT * FROM (SELECT ` + sqlItemColumns + ` FROM saga_instances s WHERE true`

// The filters. Each takes the next bind parameter (written as %d and
// numbered when the statement is assembled).
const (
	sqlWhereStatus  = ` AND s.status = $%d::saga_status`
	sqlWhereSaga    = ` AND s.saga_name = $%d`
	sqlWhereTenant  = ` AND s.tenant_id = $%d`
	sqlWhereVersion = ` AND s.saga_version = $%d`
	// The step an instance stands at, named by the registered definitions
	// (parallel arrays of saga, version, index) or by its step record.
	sqlWhereStep = ` AND (EXISTS (SELECT 1 FROM unnest($%d::text[], $%d::int[], $%d::int[]) AS r(name, version, seq)
	                        WHERE r.name = s.saga_name AND r.version = s.saga_version AND r.seq = s.current_step)
	     OR EXISTS (SELECT 1 FROM saga_steps st WHERE st.saga_instance_id = s.id AND st.sequence = s.current_step AND st.step_name = $%d))`
	sqlWhereErrorContains = ` AND strpos(lower(coalesce(s.last_error, '')), lower($%d::text)) > 0`
	sqlWhereCreatedAfter  = ` AND s.created_at > $%d::timestamptz`
	sqlWhereCreatedBefore = ` AND s.created_at < $%d::timestamptz`
	// The keyset: strictly older than the last row of the previous page.
	sqlWhereBefore = ` AND (s.created_at, s.id) < ($%d::timestamptz, $%d::uuid)`
	// Only these statuses can be stuck. Written as an OR so that PostgreSQL
	// can serve it with two partial indexes (saga_claim_idx, saga_failed_idx:
	// migration 0007), which no finished instance has an entry in.
	sqlWhereMaybeStuck = ` AND (s.status IN ('RUNNING','COMPENSATING') OR s.status = 'FAILED')`
	sqlListStuckOnly   = `) q WHERE q.stuck_reason <> ''`
	// What a bulk action can act on, after the filter: a retry an instance
	// that can still move, is not held by a runner and whose version is
	// registered; a cancel a RUNNING instance (retryRule and cancelRule say
	// the same under the row lock).
	sqlRetryable   = ` AND q.status IN ('RUNNING','COMPENSATING','FAILED') AND q.stuck_reason <> 'unregistered_version' AND NOT q.lease_live`
	sqlCancellable = ` AND q.status = 'RUNNING'`
	// A pause takes a RUNNING or COMPENSATING instance, a resume a PAUSED
	// one (pauseRule and resumeRule).
	sqlPausable  = ` AND q.status IN ('RUNNING','COMPENSATING')`
	sqlResumable = ` AND q.status = 'PAUSED'`
	sqlListAll   = `) q WHERE true`
	sqlListTail  = ` ORDER BY q.created_at DESC, q.id DESC LIMIT $%d`
	// A bulk action's selection: one instance (re-checked under its lock),
	// and batches oldest first after the last one taken.
	sqlWhereID     = ` AND s.id = $%d`
	sqlAfterKey    = ` AND (q.created_at, q.id) > ($%d::timestamptz, $%d::uuid)`
	sqlOldestFirst = ` ORDER BY q.created_at, q.id LIMIT $%d`
	sqlLimit       = ` LIMIT $%d`
)

// sqlItemEnds reads, for the instances of a page, what their step column
// says: how many steps they recorded, the recorded name of the step they
// stand at, and the step (index and recorded name) the forward run ended at before their newest compensation started:
// that of the newest step event before it (the failed attempt, the step a
// deadline or a cancel found, an attempt whose lease was lost), -1 when
// there is none. Each lookup walks one
// instance's journal backwards by its primary key.
const sqlItemEnds = `
SELECT i.id, n.steps, coalesce(l.step, -1), coalesce(st.step_name, ''), coalesce(cur.step_name, '')
FROM unnest($1::uuid[]) AS i(id)
JOIN saga_instances s ON s.id = i.id
LEFT JOIN saga_steps cur ON cur.saga_instance_id = i.id AND cur.sequence = s.current_step
CROSS JOIN LATERAL (SELECT count(*)::int AS steps FROM saga_steps WHERE saga_instance_id = i.id) n
LEFT JOIN LATERAL (SELECT e.version FROM saga_events e WHERE e.instance_id = i.id AND e.kind = 'compensation_started'
                   ORDER BY e.version DESC LIMIT 1) c ON true
LEFT JOIN LATERAL (SELECT f.step FROM saga_events f WHERE f.instance_id = i.id AND f.version < c.version
                     AND f.kind IN ('step_failed', 'step_awaiting', 'step_completed', 'reply_received', 'step_interrupted')
                   ORDER BY f.version DESC LIMIT 1) l ON true
LEFT JOIN saga_steps st ON st.saga_instance_id = i.id AND st.sequence = l.step`

// sqlSearchSuffix finds the instances whose id ends with $5 (lower-case
// hex, no dashes), at most $6 of them: a scan, bounded by the limit that
// tells one match from several.
const sqlSearchSuffix = `
SELECT ` + sqlItemColumns + `, 'instance_id_suffix' FROM saga_instances s
WHERE right(replace(s.id::text, '-', ''), length($5::text)) = $5::text AND ($7::uuid IS NULL OR s.tenant_id = $7)
LIMIT $6`

// sqlGetItem reads one instance; $5 is the id and $6 the tenant scope (NULL
// for none). FOR UPDATE is appended when acting.
const sqlGetItem = `SELECT ` + sqlItemColumns + `,
  coalesce((SELECT e.kind FROM saga_events e WHERE e.instance_id = s.id ORDER BY e.version DESC LIMIT 1), '') AS last_kind,
  s.next_attempt_at <= clock_timestamp() AS due,
  s.trigger_event_id, s.correlation_id, s.workspace_id, s.context, s.current_version,
  s.awaiting_correlation_id, s.awaiting_until, coalesce(s.compensation_reason, ''), s.completed_at
FROM saga_instances s
WHERE s.id = $5 AND ($6::uuid IS NULL OR s.tenant_id = $6)`

// sqlLock takes the instance's row lock before sqlGetItem reads it. Two
// statements, not one SELECT ... FOR UPDATE: under READ COMMITTED a statement
// that waited for the lock re-reads the locked row but not the journal
// subquery, which would still miss the event the other operator's retry
// just committed. The read that follows the lock gets a fresh snapshot.
const sqlLock = `SELECT 1 FROM saga_instances WHERE id = $1 AND ($2::uuid IS NULL OR tenant_id = $2) FOR UPDATE`

// sqlSteps reads an instance's step records.
const sqlSteps = `
SELECT sequence, step_name, status::text, attempts, compensation_attempts, output,
       coalesce(last_error, ''), started_at, completed_at, compensated_at
FROM saga_steps WHERE saga_instance_id = $1 ORDER BY sequence`

// sqlEvents reads the newest $2 journal events of an instance, oldest first.
const sqlEvents = `
SELECT version, global_seq, kind, step, payload, created_at FROM (
  SELECT version, global_seq, kind, step, payload, created_at
  FROM saga_events WHERE instance_id = $1 ORDER BY version DESC LIMIT $2
) e ORDER BY version`

// sqlStuckCounts counts stuck instances by saga and reason, for the
// metrics. It reads only the statuses that can be stuck (a bitmap OR of
// saga_claim_idx and saga_failed_idx, as sqlWhereMaybeStuck).
const sqlStuckCounts = `
SELECT saga_name, stuck_reason, count(*) FROM (
  SELECT s.saga_name, ` + sqlStuckReason + ` AS stuck_reason
  FROM saga_instances s WHERE (s.status IN ('RUNNING','COMPENSATING') OR s.status = 'FAILED')
) q WHERE stuck_reason <> '' GROUP BY 1, 2 ORDER BY 1, 2`

// sqlParkedCount counts dead letters nobody has re-driven yet
// (relay_dead_letters_parked_idx).
const sqlParkedCount = `SELECT count(*) FROM relay_dead_letters WHERE retried_at IS NULL`

// The overview's statements; $1 is the tenant scope (NULL for none). Each
// is bounded: the counts read the maintained totals (migration 0006), the
// series and durations the last hour's rows through saga_created_idx,
// saga_tenant_idx and saga_ended_idx, the errors at most $2 instances that
// can still move and carry an error (saga_erroring_idx).
const (
	sqlOverviewCounts = `
SELECT saga_name, saga_version, status::text, sum(n)::bigint FROM (
  SELECT tenant_id, saga_name, saga_version, status, n FROM saga_status_counts
  UNION ALL
  SELECT tenant_id, saga_name, saga_version, status, delta FROM saga_status_deltas
) x WHERE ($1::uuid IS NULL OR tenant_id = $1)
GROUP BY 1, 2, 3 HAVING sum(n) <> 0 ORDER BY 1, 2, 3`

	// The bounds are written out in each WHERE (not joined from a CTE) so
	// that the planner sees a range on the index, not a join.
	// Ended: completed_at is set on every terminal status. TIMED_OUT
	// instances were compensated (their deadline passed), so they count as
	// compensated.
	sqlOverviewPerMinute = `
WITH minutes AS (
  SELECT generate_series(date_trunc('minute', now()) - interval '59 minutes', date_trunc('minute', now()), interval '1 minute') AS m
),
started AS (
  SELECT date_trunc('minute', s.created_at) AS m, count(*) AS n
  FROM saga_instances s
  WHERE s.created_at >= date_trunc('minute', now()) - interval '59 minutes' AND ($1::uuid IS NULL OR s.tenant_id = $1) GROUP BY 1
),
ended AS (
  SELECT date_trunc('minute', s.completed_at) AS m,
         count(*) FILTER (WHERE s.status = 'COMPLETED') AS completed,
         count(*) FILTER (WHERE s.status IN ('COMPENSATED', 'TIMED_OUT')) AS compensated,
         count(*) FILTER (WHERE s.status = 'FAILED') AS failed
  FROM saga_instances s
  WHERE s.completed_at >= date_trunc('minute', now()) - interval '59 minutes' AND ($1::uuid IS NULL OR s.tenant_id = $1) GROUP BY 1
)
SELECT minutes.m, coalesce(started.n, 0), coalesce(ended.completed, 0), coalesce(ended.compensated, 0), coalesce(ended.failed, 0)
FROM minutes LEFT JOIN started USING (m) LEFT JOIN ended USING (m) ORDER BY 1`

	sqlOverviewDurations = `
SELECT saga_name, saga_version, count(*),
  percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM completed_at - created_at))::float8,
  percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM completed_at - created_at))::float8
FROM saga_instances
WHERE completed_at >= now() - interval '1 hour' AND status = 'COMPLETED' AND ($1::uuid IS NULL OR tenant_id = $1)
GROUP BY 1, 2 ORDER BY 1, 2`

	// The erroring instances' last errors (cut at 300 characters), at most
	// $2 of them; Overview masks and groups them (in Go: a byte scanner is
	// many times cheaper than two regular expressions per row).
	sqlOverviewErrors = `
SELECT saga_name, saga_version, current_step, left(last_error, 300) FROM saga_instances
WHERE status IN ('FAILED', 'RUNNING', 'COMPENSATING') AND last_error <> ''
  AND ($1::uuid IS NULL OR tenant_id = $1)
LIMIT $2`

	// sqlCompactCounts folds every visible delta into the totals in one
	// statement: a delta is in exactly one of the two tables in any
	// snapshot. Run under sqlCompactLock so that compactors do not queue
	// behind each other's row locks.
	sqlCompactCounts = `
WITH moved AS (
  DELETE FROM saga_status_deltas RETURNING tenant_id, saga_name, saga_version, status, delta
), folded AS (
  SELECT tenant_id, saga_name, saga_version, status, sum(delta)::bigint AS d FROM moved GROUP BY 1, 2, 3, 4
)
INSERT INTO saga_status_counts AS c (tenant_id, saga_name, saga_version, status, n)
SELECT tenant_id, saga_name, saga_version, status, d FROM folded
ON CONFLICT (tenant_id, saga_name, saga_version, status) DO UPDATE SET n = c.n + EXCLUDED.n`
	sqlCompactLock = `SELECT pg_try_advisory_xact_lock(hashtext('compensa: saga_status_counts'))`

	// sqlSearch finds instances by id; $5 is the query as a UUID (NULL when
	// it is not one), $6 as text, $7 the scope, $8 the limit. Every branch
	// is an index lookup (migration 0006).
	sqlSearch = `
SELECT ` + sqlItemColumns + `, m.matched_by FROM (
  SELECT id, 'instance_id' AS matched_by FROM saga_instances WHERE id = $5::uuid
  UNION ALL SELECT id, 'trigger_event_id' FROM saga_instances WHERE trigger_event_id = $5::uuid
  UNION ALL SELECT id, 'correlation_id' FROM saga_instances WHERE correlation_id = $5::uuid
  UNION ALL SELECT id, 'aggregate_id' FROM saga_instances WHERE trigger_aggregate_id = $6::text
  UNION ALL SELECT DISTINCT instance_id, 'command_id' FROM saga_events
            WHERE kind = 'step_awaiting' AND payload->>'correlation_id' = $6::text
) m JOIN saga_instances s ON s.id = m.id
WHERE ($7::uuid IS NULL OR s.tenant_id = $7)
ORDER BY s.created_at DESC, s.id LIMIT $8`
)

// The replay's and the upgrade's statements (replay.go).

// sqlReplaySelect picks the instances to replay: of the sagas $1, of
// version $2 (0: any), in scope $3, newest first, at most $4; the
// tombstones retention left have no journal to read.
const sqlReplaySelect = `
SELECT id, saga_name, saga_version, status::text FROM saga_instances
WHERE saga_name = ANY ($1::text[]) AND ($2::int = 0 OR saga_version = $2)
  AND history_deleted_at IS NULL AND ($3::uuid IS NULL OR tenant_id = $3)
ORDER BY created_at DESC, id DESC
LIMIT $4`

// sqlReplayHistory is an instance's journal in version order.
const sqlReplayHistory = `SELECT version, global_seq, payload, created_at FROM saga_events WHERE instance_id = $1 ORDER BY version`

// sqlUpgradeSelect picks the RUNNING and PAUSED instances of saga $1
// version $2 in scope $3, oldest first, at most $4. Written so that the
// partial indexes of the unfinished statuses serve it (saga_claim_idx,
// saga_paused_idx): finished instances are not read.
const sqlUpgradeSelect = `
SELECT id FROM saga_instances
WHERE (status IN ('RUNNING', 'COMPENSATING') OR status = 'PAUSED') AND status <> 'COMPENSATING'
  AND saga_name = $1 AND saga_version = $2 AND ($3::uuid IS NULL OR tenant_id = $3)
ORDER BY created_at, id
LIMIT $4`

// sqlUpgradeLock locks one instance and reads what an upgrade decides on.
const sqlUpgradeLock = `
SELECT status::text, saga_version, (lease_id IS NOT NULL AND lease_expires_at >= clock_timestamp())
FROM saga_instances WHERE id = $1 AND history_deleted_at IS NULL
FOR UPDATE`

// sqlUpgrade moves instance $1 from version $2 to $3 and journals the
// upgraded event $4, after the instance's last event (its xid at least that
// event's, as every write of the journal does, so that tailers keep an
// instance's events in order).
const sqlUpgrade = `
WITH u AS (
	UPDATE saga_instances SET saga_version = $3, current_version = current_version + 1, updated_at = now()
	WHERE id = $1 AND saga_version = $2
	RETURNING id, current_version
)
INSERT INTO saga_events (instance_id, version, kind, step, payload, created_at, xid)
SELECT u.id, u.current_version, 'upgraded', -1, $4::jsonb, now(),
	GREATEST(pg_current_xact_id(), (SELECT p.xid FROM saga_events p WHERE p.instance_id = u.id AND p.version = u.current_version - 1))
FROM u`
