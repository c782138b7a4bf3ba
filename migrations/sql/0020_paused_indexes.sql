-- 0020: what a PAUSED instance still holds. Forward-only: never edit after
-- release.
--
-- A paused instance has not finished: it keeps its place under its
-- concurrency key (the instances behind it wait, as they would behind a
-- running one), so the claim's look for older unfinished instances of a key
-- includes PAUSED and so does its index. When an instance with a key
-- finishes, the next one may run: the wake fires when a keyed instance
-- leaves the unfinished statuses, which now include PAUSED.
DROP INDEX IF EXISTS saga_concurrency_idx;
CREATE INDEX IF NOT EXISTS saga_concurrency_idx
    ON saga_instances (saga_name, concurrency_key, concurrency_lsn, concurrency_ord)
    WHERE concurrency_key IS NOT NULL AND status IN ('RUNNING', 'COMPENSATING', 'PAUSED');

DROP TRIGGER IF EXISTS saga_concurrency_wake ON saga_instances;
CREATE TRIGGER saga_concurrency_wake
    AFTER UPDATE OF status ON saga_instances
    FOR EACH ROW
    WHEN (OLD.concurrency_key IS NOT NULL
          AND OLD.status IN ('RUNNING', 'COMPENSATING', 'PAUSED')
          AND NEW.status NOT IN ('RUNNING', 'COMPENSATING', 'PAUSED'))
    EXECUTE FUNCTION saga_concurrency_wake();

-- Paused instances are few and looked up by the monitor and by the
-- declared-saga loader's unfinished versions (beside saga_claim_idx and
-- saga_failed_idx, in a bitmap OR): without an index of their own, those
-- reads would scan the whole instance table.
CREATE INDEX IF NOT EXISTS saga_paused_idx ON saga_instances (saga_name, saga_version) WHERE status = 'PAUSED';
