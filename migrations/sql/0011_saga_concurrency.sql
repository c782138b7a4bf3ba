-- 0011: concurrency limits per key.
--
-- A saga declared with a concurrency key (e.g. the trigger's aggregate id)
-- and a limit runs at most that many of its instances sharing a key at a
-- time, in trigger commit order. The correlator stores the key, the limit
-- and the trigger's place in the stream (its commit LSN, then its position
-- in the batch) when it starts the instance; the runner's claim takes an
-- instance with a key only while fewer than its limit of older instances
-- with the same saga name and key are RUNNING or COMPENSATING. An instance
-- without a key (every saga without a concurrency limit) is claimed as
-- before, at no extra cost.
ALTER TABLE saga_instances
    ADD COLUMN IF NOT EXISTS concurrency_key   text,
    ADD COLUMN IF NOT EXISTS concurrency_limit integer,
    ADD COLUMN IF NOT EXISTS concurrency_lsn   pg_lsn,
    ADD COLUMN IF NOT EXISTS concurrency_ord   integer;

-- The claim's look for older unfinished instances of a key: only keyed,
-- unfinished instances are in it.
CREATE INDEX IF NOT EXISTS saga_concurrency_idx
    ON saga_instances (saga_name, concurrency_key, concurrency_lsn, concurrency_ord)
    WHERE concurrency_key IS NOT NULL AND status IN ('RUNNING', 'COMPENSATING');

-- When an instance with a key ends, the next one of its key may run: wake
-- every runner listening (saga.WakeChannel) instead of leaving it to their
-- next poll. Instances without a key never fire it.
CREATE OR REPLACE FUNCTION saga_concurrency_wake() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('compensa_runner_wake', '');
    RETURN NULL;
END;
$$;

DROP TRIGGER IF EXISTS saga_concurrency_wake ON saga_instances;
CREATE TRIGGER saga_concurrency_wake
    AFTER UPDATE OF status ON saga_instances
    FOR EACH ROW
    WHEN (OLD.concurrency_key IS NOT NULL
          AND OLD.status IN ('RUNNING', 'COMPENSATING')
          AND NEW.status NOT IN ('RUNNING', 'COMPENSATING'))
    EXECUTE FUNCTION saga_concurrency_wake();

-- A step's rate limit (rate: 50/s), shared by every relay: per saga and
-- step, the earliest time the next start may be taken. A start takes it
-- and moves it one spacing (the period over the count) later.
CREATE TABLE IF NOT EXISTS saga_step_rates (
    rate_key  text        PRIMARY KEY,
    next_at   timestamptz NOT NULL
);
