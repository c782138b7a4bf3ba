-- 0006: what the monitor's operations need: search by the ids an
-- operator holds, and an overview that stays fast with millions of
-- instances.

-- The trigger's aggregate id, kept on the instance: the outbox row it came
-- from may be gone (retention), and operators search by it.
ALTER TABLE saga_instances ADD COLUMN IF NOT EXISTS trigger_aggregate_id text;

-- Search: trigger event id, correlation id, aggregate id, and the command id
-- a waiting step sent (journaled on its step_awaiting event).
CREATE INDEX IF NOT EXISTS saga_trigger_event_idx ON saga_instances (trigger_event_id);
CREATE INDEX IF NOT EXISTS saga_correlation_idx ON saga_instances (correlation_id)
    WHERE correlation_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS saga_aggregate_idx ON saga_instances (trigger_aggregate_id)
    WHERE trigger_aggregate_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS saga_events_command_idx ON saga_events ((payload->>'correlation_id'))
    WHERE kind = 'step_awaiting';

-- The overview's last hour: instances that ended (completed_at is set on
-- every terminal status), by time.
CREATE INDEX IF NOT EXISTS saga_ended_idx ON saga_instances (completed_at, status)
    WHERE completed_at IS NOT NULL;

-- The overview's top errors: only the instances that can still move and
-- carry an error (a small part of all of them). current_step is not in the
-- key: a step changes it, and an indexed column that changes on every step
-- would turn the step's projection update into a non-HOT one (see 0005).
CREATE INDEX IF NOT EXISTS saga_erroring_idx ON saga_instances (tenant_id, saga_name, saga_version)
    WHERE status IN ('FAILED', 'RUNNING', 'COMPENSATING') AND last_error <> '';

-- Instances by tenant, saga, version and status, without counting millions
-- of rows: saga_status_counts holds compacted totals; triggers append
-- changes to saga_status_deltas (append-only, so concurrent writers never
-- wait on a shared counter row); the monitor folds deltas into the totals
-- (one DELETE ... RETURNING and an upsert in one transaction, so a delta is
-- in exactly one of the two tables in any snapshot). A total is the sum of
-- both tables.
CREATE TABLE IF NOT EXISTS saga_status_counts (
    tenant_id    uuid NOT NULL,
    saga_name    text NOT NULL,
    saga_version integer NOT NULL,
    status       saga_status NOT NULL,
    n            bigint NOT NULL,
    PRIMARY KEY (tenant_id, saga_name, saga_version, status)
);
CREATE TABLE IF NOT EXISTS saga_status_deltas (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id    uuid NOT NULL,
    saga_name    text NOT NULL,
    saga_version integer NOT NULL,
    status       saga_status NOT NULL,
    delta        bigint NOT NULL
);

-- Inserts and deletes count per statement (one row per group, however many
-- instances the correlator starts in a batch); status changes per row, and
-- only when the status actually changes (a step that does not end the
-- instance pays the WHEN test only).
CREATE OR REPLACE FUNCTION saga_status_count_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO saga_status_deltas (tenant_id, saga_name, saga_version, status, delta)
    SELECT tenant_id, saga_name, saga_version, status, count(*) FROM saga_status_new GROUP BY 1, 2, 3, 4;
    RETURN NULL;
END $$;
CREATE OR REPLACE FUNCTION saga_status_count_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO saga_status_deltas (tenant_id, saga_name, saga_version, status, delta)
    SELECT tenant_id, saga_name, saga_version, status, -count(*) FROM saga_status_old GROUP BY 1, 2, 3, 4;
    RETURN NULL;
END $$;
CREATE OR REPLACE FUNCTION saga_status_count_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO saga_status_deltas (tenant_id, saga_name, saga_version, status, delta)
    VALUES (OLD.tenant_id, OLD.saga_name, OLD.saga_version, OLD.status, -1),
           (NEW.tenant_id, NEW.saga_name, NEW.saga_version, NEW.status, 1);
    RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS saga_status_count_insert ON saga_instances;
CREATE TRIGGER saga_status_count_insert AFTER INSERT ON saga_instances
    REFERENCING NEW TABLE AS saga_status_new
    FOR EACH STATEMENT EXECUTE FUNCTION saga_status_count_insert();
DROP TRIGGER IF EXISTS saga_status_count_delete ON saga_instances;
CREATE TRIGGER saga_status_count_delete AFTER DELETE ON saga_instances
    REFERENCING OLD TABLE AS saga_status_old
    FOR EACH STATEMENT EXECUTE FUNCTION saga_status_count_delete();
DROP TRIGGER IF EXISTS saga_status_count_update ON saga_instances;
CREATE TRIGGER saga_status_count_update AFTER UPDATE ON saga_instances
    FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status OR OLD.tenant_id IS DISTINCT FROM NEW.tenant_id
          OR OLD.saga_name IS DISTINCT FROM NEW.saga_name OR OLD.saga_version IS DISTINCT FROM NEW.saga_version)
    EXECUTE FUNCTION saga_status_count_update();

-- The totals of the rows that exist now (the triggers above hold the lock
-- that keeps writers out until this transaction commits).
TRUNCATE saga_status_counts, saga_status_deltas;
INSERT INTO saga_status_counts (tenant_id, saga_name, saga_version, status, n)
SELECT tenant_id, saga_name, saga_version, status, count(*) FROM saga_instances GROUP BY 1, 2, 3, 4;
