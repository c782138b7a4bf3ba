package sink

// The package's SQL, in one place.
const (
	sqlRegister = `INSERT INTO relay_sinks (name, kind) VALUES ($1, $2)
		ON CONFLICT (name) DO UPDATE SET kind = EXCLUDED.kind
		RETURNING state, reason, retry_requested_at`

	sqlHeld = `SELECT DISTINCT p.sink, p.aggregate_key
		FROM unnest($1::text[], $2::text[]) AS q(sink, aggregate_key)
		JOIN relay_sink_parked p ON p.sink = q.sink AND p.aggregate_key = q.aggregate_key`

	// Rows are numbered in the order given, so seq keeps commit order. A
	// held row is never due until `relay sinks retry` makes it due.
	sqlPark = `INSERT INTO relay_sink_parked (sink, event_id, aggregate_key, event, reason, next_attempt_at, event_raw)
		SELECT s, i, k, e::jsonb, r, CASE WHEN h THEN 'infinity'::timestamptz ELSE now() END, b
		FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bool[], $7::bytea[]) WITH ORDINALITY AS x(s, i, k, e, r, h, b, n)
		ORDER BY n
		ON CONFLICT (sink, event_id) DO NOTHING`

	sqlCountDelivered = `UPDATE relay_sinks SET delivered = relay_sinks.delivered + d.n
		FROM unnest($1::text[], $2::bigint[]) AS d(name, n) WHERE relay_sinks.name = d.name`

	sqlCountFiltered = `UPDATE relay_sinks SET filtered = relay_sinks.filtered + d.n
		FROM unnest($1::text[], $2::bigint[]) AS d(name, n) WHERE relay_sinks.name = d.name`

	// The first rows of each aggregate whose head is due, in seq order.
	sqlDue = `SELECT event_id, aggregate_key, event::text, event_raw, attempts FROM (
			SELECT event_id, aggregate_key, event, event_raw, attempts, seq,
				row_number() OVER w AS rn, first_value(next_attempt_at) OVER w AS head_due
			FROM relay_sink_parked WHERE sink = $1
			WINDOW w AS (PARTITION BY aggregate_key ORDER BY seq)) x
		WHERE rn <= $2 AND head_due <= now()
		ORDER BY seq LIMIT $3`

	sqlDrained = `WITH gone AS (DELETE FROM relay_sink_parked WHERE sink = $1 AND event_id = ANY($2::text[]) RETURNING 1)
		UPDATE relay_sinks SET delivered = delivered + (SELECT count(*) FROM gone) WHERE name = $1`

	// Each failed head gets its own reason and wait (its attempts drive its
	// backoff); the rows behind a head are left as they are.
	sqlDeferred = `UPDATE relay_sink_parked p SET attempts = p.attempts + 1, reason = d.reason,
		next_attempt_at = now() + d.wait_ms * interval '1 millisecond'
		FROM unnest($2::text[], $3::text[], $4::bigint[]) AS d(event_id, reason, wait_ms)
		WHERE p.sink = $1 AND p.event_id = d.event_id`

	sqlSetState = `UPDATE relay_sinks SET state = $2, reason = NULLIF($3, ''), changed_at = now() WHERE name = $1`

	sqlRetryRequested = `SELECT retry_requested_at FROM relay_sinks WHERE name = $1`

	sqlDrainLock   = `SELECT pg_try_advisory_lock(hashtextextended('compensa.sink.' || $1, 0))`
	sqlDrainUnlock = `SELECT pg_advisory_unlock(hashtextextended('compensa.sink.' || $1, 0))`

	sqlList = `SELECT s.name, s.kind, s.state, coalesce(s.reason, ''), s.delivered, s.filtered,
			coalesce(p.n, 0), extract(epoch FROM now() - p.oldest)::float8, coalesce(s.last_reason, '')
		FROM relay_sinks s
		LEFT JOIN (SELECT sink, count(*) AS n, min(parked_at) AS oldest FROM relay_sink_parked GROUP BY sink) p
			ON p.sink = s.name
		ORDER BY s.name`

	sqlRequestRetry = `WITH s AS (UPDATE relay_sinks SET retry_requested_at = clock_timestamp(),
			state = CASE WHEN state = 'disabled' THEN 'up' ELSE state END, changed_at = now()
			WHERE name = $1 RETURNING name),
		p AS (UPDATE relay_sink_parked SET next_attempt_at = now() WHERE sink IN (SELECT name FROM s) RETURNING 1)
		SELECT (SELECT count(*) FROM s), (SELECT count(*) FROM p)`
)

// Parked events seen and skipped by an operator, and the sinks' last failure.
const (
	sqlSinkExists = `SELECT EXISTS (SELECT 1 FROM relay_sinks WHERE name = $1)`

	// The page is cut in commit order first; whether a row is the head of
	// its aggregate is then looked up for the page's rows only.
	sqlListParked = `SELECT p.event_id, coalesce(p.event->>'tenant_id', ''), coalesce(p.event->>'aggregate_type', ''),
			coalesce(p.event->>'aggregate_id', ''), coalesce(p.event->>'event_type', ''), p.reason, p.attempts,
			NOT EXISTS (SELECT 1 FROM relay_sink_parked q WHERE q.sink = p.sink AND q.aggregate_key = p.aggregate_key AND q.seq < p.seq),
			p.parked_at, extract(epoch FROM now() - p.parked_at)::float8,
			CASE WHEN p.next_attempt_at = 'infinity' THEN NULL ELSE p.next_attempt_at END
		FROM (SELECT * FROM relay_sink_parked WHERE sink = $1 AND ($2::text IS NULL OR event->>'tenant_id' = $2)
			ORDER BY seq LIMIT $3) p
		ORDER BY p.seq`

	// The drainer's lock (sqlDrainLock), for the skip's transaction: a skip
	// waits for a drain round in progress.
	sqlSkipLock = `SELECT pg_advisory_xact_lock(hashtextextended('compensa.sink.' || $1, 0))`

	sqlSkipFind = `SELECT coalesce(event->>'tenant_id', '') FROM relay_sink_parked WHERE sink = $1 AND event_id = $2 FOR UPDATE`

	sqlParkedElsewhere = `SELECT coalesce(array_agg(sink ORDER BY sink), '{}') FROM relay_sink_parked WHERE event_id = $1`

	// One statement moves the row: it is in exactly one of the two tables
	// in every snapshot.
	sqlSkip = `WITH gone AS (DELETE FROM relay_sink_parked WHERE sink = $1 AND event_id = $2
			RETURNING sink, event_id, aggregate_key, event, event_raw, lsn, reason, attempts, parked_at)
		INSERT INTO relay_sink_skipped (sink, event_id, aggregate_key, event, event_raw, lsn, reason, attempts, parked_at, skipped_by, skip_reason)
		SELECT sink, event_id, aggregate_key, event, event_raw, lsn, reason, attempts, parked_at, $3, $4 FROM gone
		RETURNING sink, event_id, coalesce(event->>'aggregate_type', ''), coalesce(event->>'aggregate_id', ''),
			coalesce(event->>'event_type', ''), reason, attempts, parked_at, skipped_by, skipped_role, skipped_at, skip_reason`

	sqlSetLastReason = `UPDATE relay_sinks SET last_reason = $2 WHERE name = $1`
)
