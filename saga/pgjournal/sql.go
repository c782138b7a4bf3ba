package pgjournal

// The journal's SQL, in one place. $-parameters only; nothing is built from
// input. Every statement that needs the time takes it as one parameter,
// COALESCE($n::timestamptz, clock_timestamp()): the injected clock when set,
// else the statement's own clock. clock_timestamp(), not now(): now() is
// frozen at the start of the transaction, so a step transaction that began
// before its lease expired would pass a now() fence long after it.

// instanceCols are the saga_instances columns in scanInstance's order.
const instanceCols = `i.id, i.tenant_id, i.workspace_id, i.saga_name, i.saga_version, i.status::text,
	i.current_step, i.trigger_event_id, i.correlation_id, i.context, i.attempt, i.next_attempt_at,
	i.timeout_at, COALESCE(i.last_error, ''), i.lease_id, i.lease_expires_at, i.current_version,
	i.awaiting_correlation_id, i.awaiting_until, i.reply, COALESCE(i.compensation_reason, ''),
	i.created_at, i.updated_at, i.completed_at, COALESCE(i.traceparent, ''), i.held_since,
	COALESCE(i.paused_from::text, ''), i.open_step`

// stepCols are the saga_steps columns in scanStep's order (NULL throughout
// when a LEFT JOIN found no step).
const stepCols = `s.sequence, s.step_name, s.status::text, s.attempts, s.compensation_attempts,
	s.output, s.last_error, s.started_at, s.completed_at, s.compensated_at`

const eventCols = `e.instance_id, e.version, e.global_seq, e.kind, e.step, e.payload, e.created_at`

const sqlEnqueue = `
INSERT INTO saga_instances (id, tenant_id, workspace_id, saga_name, saga_version, status, current_step,
	trigger_event_id, correlation_id, context, attempt, next_attempt_at, timeout_at, created_at, updated_at, traceparent)
SELECT $1, $2, $3, $4, $5, 'RUNNING', 0, $6, $7, $8, 0, COALESCE($9, c.now), $10, c.now, c.now, NULLIF($12, '')
FROM (SELECT COALESCE($11::timestamptz, clock_timestamp()) AS now) c
ON CONFLICT DO NOTHING
RETURNING true`

// sqlEnqueueConflict says which uniqueness an enqueue ran into. (ON CONFLICT
// DO NOTHING, not a unique violation, so that a caller's transaction
// survives the conflict.)
const sqlEnqueueConflict = `SELECT EXISTS (SELECT 1 FROM saga_instances WHERE id = $1)`

// sqlClaim leases up to $2 due instances in one statement: each row gets its
// own fresh lease id. SKIP LOCKED lets concurrent claimers (and fenced
// writers holding a row) pass each other instead of queueing. A live lease
// (expiry >= now) is never taken over. An instance with a concurrency key
// is taken only while fewer than its limit of older instances (trigger
// commit order) of its saga and key are unfinished (a PAUSED one too): the
// limit and the order hold whichever relay claims, since they are read from
// committed rows (saga_concurrency_idx); an instance without a key skips
// the check.
const sqlClaim = `
WITH clock AS MATERIALIZED (SELECT COALESCE($1::timestamptz, clock_timestamp()) AS now),
due AS (
	SELECT i.id, i.open_step FROM saga_instances i, clock c
	WHERE ` + sqlClaimable + `
	ORDER BY i.next_attempt_at, i.id
	LIMIT $2
	FOR UPDATE OF i SKIP LOCKED
),
` + sqlClaimed

// sqlClaimable is what makes instance i (at clock c) claimable: RUNNING or
// COMPENSATING, due, no live lease, and fewer than its limit of older
// unfinished instances under its concurrency key.
const sqlClaimable = `i.status IN ('RUNNING', 'COMPENSATING')
	  AND i.next_attempt_at <= c.now
	  AND (i.lease_id IS NULL OR i.lease_expires_at IS NULL OR i.lease_expires_at < c.now)
	  AND (i.concurrency_key IS NULL OR (
		SELECT count(*) FROM (
			SELECT 1 FROM saga_instances o
			WHERE o.saga_name = i.saga_name AND o.concurrency_key = i.concurrency_key
			  AND o.status IN ('RUNNING', 'COMPENSATING', 'PAUSED')
			  AND (o.concurrency_lsn, o.concurrency_ord) < (i.concurrency_lsn, i.concurrency_ord)
			LIMIT i.concurrency_limit) older) < i.concurrency_limit)`

// sqlClaimed leases the due rows (the CTE due, which read each one's
// open_step under its row lock) and returns them, oldest first, each with
// the open_step it had: a step its previous holder left open, which the
// claim keeps until the new holder records it (step_interrupted). Else the
// claim opens the current step of a RUNNING instance that neither waits
// nor holds a reply. saga.ClaimOpenStep says the same in Go.
const sqlClaimed = `claimed AS (
	UPDATE saga_instances i
	SET lease_id = gen_random_uuid(), lease_expires_at = c.now + $3 * interval '1 microsecond',
		open_step = COALESCE(i.open_step, CASE WHEN i.status = 'RUNNING' AND i.awaiting_correlation_id IS NULL
			AND i.awaiting_until IS NULL AND i.reply IS NULL THEN i.current_step END)
	FROM due, clock c
	WHERE i.id = due.id
	RETURNING i.*, due.open_step AS interrupted_step
)
SELECT ` + instanceCols + `, i.interrupted_step FROM claimed i ORDER BY i.next_attempt_at, i.id`

// sqlDueTenants lists up to $4 tenants that have due work, in tenant id
// order from $2 on: a skip scan of saga_tenant_due_idx (one index descent
// per tenant with unfinished instances, at most $3 of them, then one to
// find a due instance no runner holds), so that its cost depends on the
// tenants it passes, not on how many instances they have.
//
// The look for a due instance is a LATERAL LIMIT 1 ordered as
// saga_tenant_due_idx is, with the tenant bounded by a range rather than
// an equality. As an EXISTS, the planner, expecting more tenants than the
// skip scan finds, joined them to a sort of every unfinished instance
// (400 ms at 1,000,000 due); with the equality, it may walk saga_claim_idx
// and filter the tenant, which passes over the whole backlog of an older
// tenant before reaching a newer one. The range leaves only the ordered
// descent into the tenant's own entries.
//
// The skip scan's descents are ordered as saga_tenant_due_idx is too
// (tenant, then next_attempt_at): ordered by tenant alone, saga_tenant_idx
// serves them as well, and the planner takes it when the statistics were
// read while most instances were unfinished; each descent then passes
// every finished instance of the tenant, its whole history (20 ms a look
// at 25,000 finished, growing with the days the relay has run).
const sqlDueTenants = `
WITH RECURSIVE clock AS MATERIALIZED (SELECT COALESCE($1::timestamptz, clock_timestamp()) AS now),
t(tenant_id, n) AS (
	SELECT (SELECT i.tenant_id FROM saga_instances i
		WHERE i.status IN ('RUNNING', 'COMPENSATING') AND i.tenant_id >= $2
		ORDER BY i.tenant_id, i.next_attempt_at LIMIT 1), 1
	UNION ALL
	SELECT (SELECT i.tenant_id FROM saga_instances i
		WHERE i.status IN ('RUNNING', 'COMPENSATING') AND i.tenant_id > t.tenant_id
		ORDER BY i.tenant_id, i.next_attempt_at LIMIT 1), t.n + 1
	FROM t WHERE t.tenant_id IS NOT NULL AND t.n < $3
)
SELECT t.tenant_id, (SELECT max(n) FROM t) FROM t, clock c
CROSS JOIN LATERAL (
	SELECT 1 FROM saga_instances d
	WHERE d.tenant_id >= t.tenant_id AND d.tenant_id <= t.tenant_id
	  AND d.status IN ('RUNNING', 'COMPENSATING') AND d.next_attempt_at <= c.now
	  AND (d.lease_id IS NULL OR d.lease_expires_at IS NULL OR d.lease_expires_at < c.now)
	ORDER BY d.tenant_id, d.next_attempt_at
	LIMIT 1) due
WHERE t.tenant_id IS NOT NULL
ORDER BY t.n
LIMIT $4`

// sqlClaimTenants is sqlClaim shared between tenants: up to $5[k] due
// instances of tenant $4[k] each, oldest first within a tenant, read from
// saga_tenant_due_idx; of those, the $2 oldest (the shares add up to about
// the batch: what the rounding adds is locked for the claim's transaction
// only).
const sqlClaimTenants = `
WITH clock AS MATERIALIZED (SELECT COALESCE($1::timestamptz, clock_timestamp()) AS now),
want AS (SELECT * FROM unnest($4::uuid[], $5::int[]) AS w (tenant_id, quota)),
due AS (
	SELECT d.id, d.open_step FROM want w CROSS JOIN LATERAL (
		SELECT i.id, i.next_attempt_at, i.open_step FROM saga_instances i, clock c
		WHERE i.tenant_id = w.tenant_id AND ` + sqlClaimable + `
		ORDER BY i.next_attempt_at, i.id
		LIMIT w.quota
		FOR UPDATE OF i SKIP LOCKED
	) d
	ORDER BY d.next_attempt_at, d.id
	LIMIT $2
),
` + sqlClaimed

// sqlClaimPlan makes sqlClaim read the due instances in order from
// saga_claim_idx and stop after the batch (and the leased or locked rows it
// skips), whatever the statistics say. With statistics older than a backlog
// (the table analyzed while few instances were due, as after a burst, or
// never analyzed yet), the planner expects a handful of due rows and reads
// them all through a bitmap scan and sorts them: a claim then costs time in
// proportion to the backlog (36 ms on average, 100 ms and more at 80,000
// due with the sort spilling to disk), and the runner, which claims one
// batch at a time, slows down as the backlog grows. Without sorts the
// ordered index scan is the only plan left. The penalty the planner adds to
// a disabled node (the claimed batch is still sorted, 64 rows at most)
// would also push the statement past the JIT thresholds, and compiling it
// costs 300 ms a claim: JIT is off for the claim too. And the claim is
// planned for its batch size: the generic plan of the prepared statement,
// not knowing the LIMIT, expects hundreds of rows and joins the lease's
// update to a seq scan of every instance. The settings last for the
// claim's transaction only.
const sqlClaimPlan = `SELECT set_config('enable_sort', 'off', true), set_config('jit', 'off', true),
	set_config('plan_cache_mode', 'force_custom_plan', true)`

const sqlHeartbeat = `
WITH clock AS MATERIALIZED (SELECT COALESCE($4::timestamptz, clock_timestamp()) AS now)
UPDATE saga_instances i SET lease_expires_at = c.now + $3 * interval '1 microsecond'
FROM clock c
WHERE i.id = $1 AND i.lease_id = $2 AND i.lease_expires_at >= c.now`

// sqlHeartbeatGroup extends the live leases of $1/$2 (instance and lease
// id arrays) without waiting for a row lock (SKIP LOCKED), and says per
// lease whether it was extended and whether it is held as last committed:
// not extended but held means the row is locked (LeaseBusy).
const sqlHeartbeatGroup = `
WITH clock AS MATERIALIZED (SELECT COALESCE($4::timestamptz, clock_timestamp()) AS now),
want AS (SELECT w.id, w.lease_id FROM unnest($1::uuid[], $2::uuid[]) AS w (id, lease_id)),
free AS (
	SELECT i.id FROM saga_instances i
	JOIN want w ON w.id = i.id AND w.lease_id = i.lease_id, clock c
	WHERE i.lease_expires_at >= c.now
	FOR UPDATE OF i SKIP LOCKED
),
ext AS (
	UPDATE saga_instances i SET lease_expires_at = c.now + $3 * interval '1 microsecond'
	FROM free f, clock c
	WHERE i.id = f.id
	RETURNING i.id
)
SELECT w.id, EXISTS (SELECT 1 FROM ext WHERE ext.id = w.id),
	EXISTS (SELECT 1 FROM saga_instances i, clock c
		WHERE i.id = w.id AND i.lease_id = w.lease_id AND i.lease_expires_at >= c.now)
FROM want w`

// sqlRelease gives a lease back: the holder runs no attempt, so the open
// step is cleared with it.
const sqlRelease = `
WITH clock AS MATERIALIZED (SELECT COALESCE($3::timestamptz, clock_timestamp()) AS now)
UPDATE saga_instances i SET lease_id = NULL, lease_expires_at = NULL, open_step = NULL
FROM clock c
WHERE i.id = $1 AND i.lease_id = $2 AND i.lease_expires_at >= c.now`

const sqlHoldsLease = `
SELECT EXISTS (SELECT 1 FROM saga_instances i
	WHERE i.id = $1 AND i.lease_id = $2 AND i.lease_expires_at >= COALESCE($3::timestamptz, clock_timestamp()))`

// stepOf, in the locking reads, is the current step's record as a LATERAL
// lookup with LIMIT 1: a subquery the planner cannot turn into a join, so
// that the record is always read through saga_step_uq. As a plain LEFT JOIN,
// a generic plan cached on a connection while saga_steps was small kept
// sorting and merging the whole table (79 ms a read at 30,000 steps).

// sqlLockPlan makes the locking reads of the journal's own transactions
// run one plan made once per connection (plan_cache_mode), which reads every
// table through an index (enable_seqscan): the reads' plans cost more than
// the reads themselves (0.13 ms of planning against 0.08 ms of execution
// for a group of eight), and PostgreSQL plans them anew for each call left
// to itself (their generic plan is estimated for ten ids and costed above
// the custom one). Without sequential scans the plan made once stays an
// index lookup of each instance and of its step record whatever the tables
// held when it was made (the step records' table may be empty then). Both
// settings last for the transaction only; its writes are by primary key.
const sqlLockPlan = `SELECT set_config('plan_cache_mode', 'force_generic_plan', true), set_config('enable_seqscan', 'off', true)`

// sqlLockByID reads an instance, the record of its current step and the
// clock, locking the instance row until the transaction ends. The fence is
// checked in Go (saga.HoldsLease) against this statement's clock, read after
// the lock is granted; every later write of the transaction happens under the
// lock, so no claimer can take the row between the check and the commit.
const sqlLockByID = `
SELECT ` + instanceCols + `, ` + stepCols + `, COALESCE($2::timestamptz, clock_timestamp())
FROM saga_instances i
LEFT JOIN LATERAL (SELECT * FROM saga_steps s WHERE s.saga_instance_id = i.id AND s.sequence = i.current_step LIMIT 1) s ON true
WHERE i.id = $1
FOR UPDATE OF i`

// sqlLockByIDs is sqlLockByID for several instances ($1, an array), locked
// in id order: every statement that locks several instances takes them in
// that order, so that two never wait for each other.
const sqlLockByIDs = `
SELECT ` + instanceCols + `, ` + stepCols + `, COALESCE($2::timestamptz, clock_timestamp())
FROM saga_instances i
LEFT JOIN LATERAL (SELECT * FROM saga_steps s WHERE s.saga_instance_id = i.id AND s.sequence = i.current_step LIMIT 1) s ON true
WHERE i.id = ANY($1::uuid[])
ORDER BY i.id
FOR UPDATE OF i`

// sqlLockByCorrelation is sqlLockByID for the instances waiting on a
// correlation id (at most two are read: one is expected). A PAUSED instance
// paused while it waited takes its reply too, and stays paused.
const sqlLockByCorrelation = `
SELECT ` + instanceCols + `, ` + stepCols + `, COALESCE($2::timestamptz, clock_timestamp())
FROM saga_instances i
LEFT JOIN LATERAL (SELECT * FROM saga_steps s WHERE s.saga_instance_id = i.id AND s.sequence = i.current_step LIMIT 1) s ON true
WHERE i.awaiting_correlation_id = $1 AND i.status IN ('RUNNING', 'PAUSED')
ORDER BY i.id
LIMIT 2
FOR UPDATE OF i`

// sqlWriteProjection is the part sqlWrite and sqlWritePair share: the
// projection update fenced by the version read ($17), held_since ($18),
// paused_from ($19), open_step ($20), and the step record (when $22 is
// true); each statement then inserts its event(s) from u.
const sqlWriteProjection = `
WITH u AS (
	UPDATE saga_instances SET status = $2::text::saga_status, current_step = $3, context = $4,
		attempt = $5, next_attempt_at = $6, last_error = NULLIF($7, ''), lease_id = $8,
		lease_expires_at = $9, current_version = $10, awaiting_correlation_id = $11,
		awaiting_until = $12, reply = $13, compensation_reason = NULLIF($14, ''),
		updated_at = $15, completed_at = $16, held_since = $18,
		paused_from = NULLIF($19, '')::saga_status, open_step = $20
	WHERE id = $1 AND current_version = $17
	RETURNING id
),
st AS (
	INSERT INTO saga_steps AS s (saga_instance_id, sequence, step_name, status, attempts,
		compensation_attempts, output, last_error, started_at, completed_at, compensated_at)
	SELECT u.id, $21, $23, $24::text::saga_step_status, $25, $26, $27, NULLIF($28, ''), $29, $30, $31
	FROM u WHERE $22::boolean
` + sqlStepUpsert + `
	RETURNING 1
)
`

// sqlStepUpsert makes a step record's INSERT replace the record of the same
// step when there is one (a step's later attempt, its compensation).
const sqlStepUpsert = `ON CONFLICT (saga_instance_id, sequence) DO UPDATE SET
		step_name = EXCLUDED.step_name, status = EXCLUDED.status, attempts = EXCLUDED.attempts,
		compensation_attempts = EXCLUDED.compensation_attempts, output = EXCLUDED.output,
		last_error = EXCLUDED.last_error, started_at = EXCLUDED.started_at,
		completed_at = EXCLUDED.completed_at, compensated_at = EXCLUDED.compensated_at`

// sqlEventXid is the xid (the tailers' order key) of the event(s) a write
// appends after the version read ($17): the transaction's own id, raised to
// the xid of the event at that version when that is higher (see Tailers
// below). The event is found by primary key; the first event of an instance
// has no predecessor, and GREATEST skips the NULL.
const sqlEventXid = `GREATEST(pg_current_xact_id(),
	(SELECT p.xid FROM saga_events p WHERE p.instance_id = $1 AND p.version = $17))`

// sqlWrite stores a saga.Transition in one statement: the projection, the
// step record (when $22 is true) and the event, whose global_seq it returns.
// The step and event rows are written only if the projection row still has
// the version that was read ($17): under the row lock it always has, and if
// it ever did not, nothing at all would be written.
const sqlWrite = sqlWriteProjection + `
INSERT INTO saga_events (instance_id, version, kind, step, payload, created_at, xid)
SELECT u.id, $10, $32, $33, $34, $15, ` + sqlEventXid + ` FROM u
RETURNING global_seq`

// sqlWritePair is sqlWrite for two events applied one after the other (a
// saga's last step and its terminal event, AppendTerminal): the projection
// is updated once, to the second event's result, from the version read
// before the first ($17); the step record is the first event's; both events
// are inserted, in version order ($10 - 1, then $10), with one xid: the
// first's is at least the transaction's own, so the second's, the greater
// of the two, is the same.
const sqlWritePair = sqlWriteProjection + `
INSERT INTO saga_events (instance_id, version, kind, step, payload, created_at, xid)
SELECT u.id, v.version, v.kind, v.step, v.payload, $15, ` + sqlEventXid + `
FROM u, (VALUES ($10::bigint - 1, $32::text, $33::integer, $34::jsonb), ($10::bigint, $35::text, $36::integer, $37::jsonb))
	AS v (version, kind, step, payload)
ORDER BY v.version
RETURNING global_seq`

// sqlWriteGroup is sqlWrite and sqlWritePair for several instances in one
// statement: per instance ($1, an array like every parameter here) its
// projection, fenced by the version read ($17) as each single write is; the
// step records ($21 on, one per instance that has one); the events ($32 on,
// one or two per instance, in version order). Step records and events are
// joined to the rows the UPDATE returned, so an instance whose version was
// not the one read gets nothing written, and the caller, counting the
// returned events, reports the write failed (which cannot happen under the
// row lock the locking read took). One statement for a group of N
// instances costs its executor's start and end once instead of N times.
// The events are inserted in the order of $37 (the position the separate
// statements had), so their global_seq keeps that order. The UPDATE names
// its rows by id = ANY($1) as well as by the join: the journal's
// transaction plans it once per connection (force_generic_plan), and the
// plan made while saga_instances is nearly empty would otherwise join the
// group to a walk of the table's whole primary key, and keep doing so as
// the table grows.
const sqlWriteGroup = `
WITH v AS (
	SELECT * FROM unnest($1::uuid[], $2::text[], $3::int[], $4::jsonb[], $5::int[], $6::timestamptz[],
		$7::text[], $8::uuid[], $9::timestamptz[], $10::bigint[], $11::uuid[], $12::timestamptz[],
		$13::jsonb[], $14::text[], $15::timestamptz[], $16::timestamptz[], $17::bigint[],
		$18::timestamptz[], $19::text[], $20::int[])
	AS v (id, status, current_step, context, attempt, next_attempt_at, last_error, lease_id,
		lease_expires_at, current_version, awaiting_correlation_id, awaiting_until, reply,
		compensation_reason, updated_at, completed_at, read, held_since, paused_from, open_step)
),
u AS (
	UPDATE saga_instances i SET status = v.status::saga_status, current_step = v.current_step,
		context = v.context, attempt = v.attempt, next_attempt_at = v.next_attempt_at,
		last_error = NULLIF(v.last_error, ''), lease_id = v.lease_id, lease_expires_at = v.lease_expires_at,
		current_version = v.current_version, awaiting_correlation_id = v.awaiting_correlation_id,
		awaiting_until = v.awaiting_until, reply = v.reply, compensation_reason = NULLIF(v.compensation_reason, ''),
		updated_at = v.updated_at, completed_at = v.completed_at, held_since = v.held_since,
		paused_from = NULLIF(v.paused_from, '')::saga_status, open_step = v.open_step
	FROM v
	WHERE i.id = ANY($1::uuid[]) AND i.id = v.id AND i.current_version = v.read
	RETURNING i.id, v.read, v.updated_at
),
st AS (
	INSERT INTO saga_steps AS s (saga_instance_id, sequence, step_name, status, attempts,
		compensation_attempts, output, last_error, started_at, completed_at, compensated_at)
	SELECT u.id, w.sequence, w.step_name, w.status::saga_step_status, w.attempts, w.compensation_attempts,
		w.output, NULLIF(w.last_error, ''), w.started_at, w.completed_at, w.compensated_at
	FROM u JOIN unnest($21::uuid[], $22::int[], $23::text[], $24::text[], $25::int[], $26::int[],
		$27::jsonb[], $28::text[], $29::timestamptz[], $30::timestamptz[], $31::timestamptz[])
		AS w (id, sequence, step_name, status, attempts, compensation_attempts, output, last_error,
			started_at, completed_at, compensated_at) ON w.id = u.id
` + sqlStepUpsert + `
	RETURNING 1
)
INSERT INTO saga_events (instance_id, version, kind, step, payload, created_at, xid)
SELECT u.id, e.version, e.kind, e.step, e.payload, u.updated_at, GREATEST(pg_current_xact_id(),
	(SELECT p.xid FROM saga_events p WHERE p.instance_id = u.id AND p.version = u.read))
FROM u JOIN unnest($32::uuid[], $33::bigint[], $34::text[], $35::int[], $36::jsonb[], $37::int[])
	AS e (id, version, kind, step, payload, ord) ON e.id = u.id
ORDER BY e.ord
RETURNING instance_id`

const sqlGet = `SELECT ` + instanceCols + ` FROM saga_instances i WHERE i.id = $1`

const sqlSteps = `
SELECT i.id, ` + stepCols + `
FROM saga_instances i LEFT JOIN saga_steps s ON s.saga_instance_id = i.id
WHERE i.id = $1
ORDER BY s.sequence`

const sqlLoad = `
SELECT i.id, e.version, e.global_seq, e.kind, e.step, e.payload, e.created_at
FROM saga_instances i LEFT JOIN saga_events e ON e.instance_id = i.id
WHERE i.id = $1
ORDER BY e.version`

// Tailers read in (xid, global_seq) order, and only events whose xid is
// below pg_snapshot_xmin of the statement's snapshot: those transactions have
// all ended, and every event a running or future transaction can still add
// has an xid at or above it, so nothing can appear behind a tailer's cursor.
// (global_seq alone is not enough: a transaction that drew a lower global_seq
// can commit after one that drew a higher, even with its own lower xid.)
// Every INSERT into saga_events raises the event's xid to its predecessor's
// (sqlEventXid here, the correlator's reply delivery there; a trigger does it
// for a row inserted without an xid), so that an instance's events keep
// version order in this order too.

// sqlLoadFirst reads from the start of the journal.
const sqlLoadFirst = `
SELECT true, ` + eventCols + `
FROM saga_events e
WHERE e.xid < pg_snapshot_xmin(pg_current_snapshot())
ORDER BY e.xid, e.global_seq
LIMIT $1`

// sqlLoadAfter reads after the event numbered $1. The first column says
// whether that event exists; one row with NULL event columns is returned
// when nothing follows, so that "caught up" and "no such cursor" differ.
const sqlLoadAfter = `
WITH cur AS (SELECT c.xid FROM saga_events c WHERE c.global_seq = $1)
SELECT EXISTS (SELECT 1 FROM cur),
	p.instance_id, p.version, p.global_seq, p.kind, p.step, p.payload, p.created_at
FROM (SELECT 1) one
LEFT JOIN LATERAL (
	SELECT e.xid, ` + eventCols + `
	FROM saga_events e
	WHERE e.xid < pg_snapshot_xmin(pg_current_snapshot())
	  AND (e.xid, e.global_seq) > ((SELECT xid FROM cur), $1)
	ORDER BY e.xid, e.global_seq
	LIMIT $2
) p ON true
ORDER BY p.xid, p.global_seq`

const sqlHeadSeq = `
SELECT COALESCE((
	SELECT e.global_seq FROM saga_events e
	WHERE e.xid < pg_snapshot_xmin(pg_current_snapshot())
	ORDER BY e.xid DESC, e.global_seq DESC
	LIMIT 1), 0)`

// sqlNextDue is how long until the earliest future next_attempt_at of an
// instance the runner advances (saga_claim_idx, read from now onward).
const sqlNextDue = `
WITH clock AS MATERIALIZED (SELECT COALESCE($1::timestamptz, clock_timestamp()) AS now)
SELECT EXTRACT(EPOCH FROM (i.next_attempt_at - c.now)) * 1000000
FROM saga_instances i, clock c
WHERE i.status IN ('RUNNING', 'COMPENSATING') AND i.next_attempt_at > c.now
ORDER BY i.next_attempt_at
LIMIT 1`

// The rate turn's statements (TakeRateTurn), in one transaction: the
// instance under its lease (locked), then its rate key's row (created on
// first use, locked, so that turns are taken one at a time), then what
// saga.NextRateTurn decided.

// sqlRateTurnInstance reads instance $1's reserved turn under lease $2, and
// the clock ($3, or the server's).
const sqlRateTurnInstance = `
SELECT i.rate_turn_at, c.now
FROM saga_instances i, (SELECT COALESCE($3::timestamptz, clock_timestamp()) AS now) c
WHERE i.id = $1 AND i.lease_id = $2 AND i.lease_expires_at >= c.now
FOR NO KEY UPDATE OF i`

// sqlRateTurnKey reads (creating it) and locks rate key $1: its next free
// turn and when it last let a step run.
const sqlRateTurnKey = `
WITH made AS (
	INSERT INTO saga_step_rates (rate_key, next_at) VALUES ($1, $2)
	ON CONFLICT (rate_key) DO UPDATE SET next_at = saga_step_rates.next_at
	RETURNING next_at, last_at
)
SELECT next_at, last_at FROM made`

const sqlRateTurnKeyUpdate = `UPDATE saga_step_rates SET next_at = $2, last_at = $3 WHERE rate_key = $1`

// sqlRateTurnUsed clears a reserved turn the step now uses.
const sqlRateTurnUsed = `UPDATE saga_instances SET rate_turn_at = NULL WHERE id = $1`

// sqlRateTurnGiveBack gives the instance back, due at its turn $2, which it
// keeps; its lease is released so that nobody holds it meanwhile, and the
// step it was given back before is not open.
const sqlRateTurnGiveBack = `
UPDATE saga_instances
SET rate_turn_at = $2, next_attempt_at = $2, lease_id = NULL, lease_expires_at = NULL, open_step = NULL
WHERE id = $1`

// The retention janitor's statements (retention.go). Durations are
// microseconds ($n * interval '1 microsecond'); each statement touches at
// most one batch of rows, so each transaction is short.

// sqlTombstone deletes the history (step records, journal events, inbox
// rows) of up to $3 instances of the statuses $2 that ended longer than $1
// ago, oldest first, and turns their rows into tombstones: status, ids, saga
// name and version, tenant, trigger and times stay; context, reply, errors,
// trace and lease go. SKIP LOCKED: an instance an operator or a runner holds
// is taken at the next round, and nobody waits on the janitor for a row it
// has not touched yet. The status does not change, so the status counts do
// not either (their trigger fires on a change of status only).
const sqlTombstone = `
WITH picked AS (
	SELECT id FROM saga_instances
	WHERE completed_at IS NOT NULL AND history_deleted_at IS NULL
	  AND completed_at < now() - $1 * interval '1 microsecond'
	  AND status = ANY ($2::saga_status[])
	ORDER BY completed_at
	LIMIT $3
	FOR UPDATE SKIP LOCKED
), steps AS (
	DELETE FROM saga_steps WHERE saga_instance_id IN (SELECT id FROM picked) RETURNING 1
), events AS (
	DELETE FROM saga_events WHERE instance_id IN (SELECT id FROM picked) RETURNING 1
), inbox AS (
	DELETE FROM relay_inbox WHERE instance_id IN (SELECT id FROM picked) RETURNING 1
), stones AS (
	UPDATE saga_instances s
	SET history_deleted_at = now(), context = '{}'::jsonb, reply = NULL, last_error = NULL,
	    compensation_reason = NULL, traceparent = NULL, awaiting_correlation_id = NULL,
	    awaiting_until = NULL, lease_id = NULL, lease_expires_at = NULL, locked_until = NULL
	FROM picked p WHERE s.id = p.id
	RETURNING 1
)
SELECT (SELECT count(*) FROM stones), (SELECT count(*) FROM steps), (SELECT count(*) FROM events), (SELECT count(*) FROM inbox)`

// sqlResyncGuard is the earliest creation time of an instance whose trigger
// a resync of slot $1 could still re-read (its checkpoint's time minus the
// margin $2): tombstones created since then are kept whatever their age.
// No checkpoint: the year 1 (nothing is known to be safe).
const sqlResyncGuard = `
SELECT coalesce((SELECT updated_at - $2 * interval '1 microsecond' FROM relay_checkpoints WHERE slot_name = $1), '0001-01-01 00:00:00+00'::timestamptz)`

// sqlDeleteTombstones deletes up to $3 tombstones that ended longer than $1
// ago and were created before $2. Deleting fires the instance table's
// triggers: the status counts go down by what is deleted.
const sqlDeleteTombstones = `
WITH picked AS (
	SELECT id FROM saga_instances
	WHERE history_deleted_at IS NOT NULL
	  AND completed_at < now() - $1 * interval '1 microsecond'
	  AND created_at < $2
	ORDER BY completed_at
	LIMIT $3
	FOR UPDATE SKIP LOCKED
)
DELETE FROM saga_instances s USING picked p WHERE s.id = p.id`

// sqlDeleteUnmatchedInbox deletes up to $2 inbox rows no instance took (a
// late or a foreign reply) received longer than $1 ago.
const sqlDeleteUnmatchedInbox = `
DELETE FROM relay_inbox WHERE ctid = ANY (ARRAY(
	SELECT ctid FROM relay_inbox
	WHERE instance_id IS NULL AND received_at < now() - $1 * interval '1 microsecond'
	LIMIT $2))`

// sqlDeleteRedriven deletes up to $2 dead letters re-driven longer than $1 ago.
const sqlDeleteRedriven = `
DELETE FROM relay_dead_letters WHERE id IN (
	SELECT id FROM relay_dead_letters
	WHERE retried_at IS NOT NULL AND retried_at < now() - $1 * interval '1 microsecond'
	LIMIT $2)`

// sqlDeleteParked deletes up to $2 dead letters never re-driven, parked
// longer than $1 ago.
const sqlDeleteParked = `
DELETE FROM relay_dead_letters WHERE id IN (
	SELECT id FROM relay_dead_letters
	WHERE retried_at IS NULL AND parked_at < now() - $1 * interval '1 microsecond'
	LIMIT $2)`

// sqlDeleteSkipped deletes up to $2 skipped deliveries skipped longer than
// $1 ago.
const sqlDeleteSkipped = `
DELETE FROM relay_sink_skipped WHERE id IN (
	SELECT id FROM relay_sink_skipped
	WHERE skipped_at < now() - $1 * interval '1 microsecond'
	LIMIT $2)`

// sqlOldestKept is the age in seconds (0 when none) of the oldest row kept
// in each table the janitor deletes from: for the history tables, the
// oldest ended instance of the statuses $1 whose history is kept; for
// saga_instances the oldest tombstone (by its end); the others by their own
// time column.
const sqlOldestKept = `
SELECT coalesce(extract(epoch FROM now() - (
	SELECT min(completed_at) FROM saga_instances
	WHERE completed_at IS NOT NULL AND history_deleted_at IS NULL AND status = ANY ($1::saga_status[]))), 0)::float8,
  coalesce(extract(epoch FROM now() - (
	SELECT min(completed_at) FROM saga_instances WHERE history_deleted_at IS NOT NULL)), 0)::float8,
  coalesce(extract(epoch FROM now() - (SELECT min(parked_at) FROM relay_dead_letters)), 0)::float8,
  coalesce(extract(epoch FROM now() - (SELECT min(skipped_at) FROM relay_sink_skipped)), 0)::float8`

// sqlRetentionLock is the session advisory lock that elects the one relay
// that runs the janitor (the key is fixed forever).
const sqlRetentionLock = `SELECT pg_try_advisory_lock(-9063219440015961814)`

// sqlRetentionSession names the janitor's session ($1) for the session's
// life, as pg_stat_activity shows it.
const sqlRetentionSession = `SELECT set_config('application_name', $1, false)`
