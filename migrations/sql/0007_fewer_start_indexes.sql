-- 0007: fewer index entries per saga start (the correlator's insert cost).
--
-- Every instance the correlator starts wrote a heap row and nine index
-- entries; the start's INSERT is most of a batch's cost. Three of those
-- entries duplicate what another index already gives:
--
-- * The trigger: saga_trigger_any_version_uq (saga_name, trigger_event_id)
--   is the uniqueness that makes a start happen once, across versions too.
--   saga_trigger_uq (saga_name, saga_version, trigger_event_id) is implied
--   by it (a pair that is unique stays unique with a column added), and the
--   operator's search by trigger event id had an index of its own
--   (saga_trigger_event_idx, 0006) because the unique ones lead with the
--   saga's name. One unique index leading with the trigger event id does
--   all three jobs: the same uniqueness, and the search's lookup.
-- * saga_due_idx (status, next_attempt_at) held an entry for every instance
--   ever started. The runner claims through the partial saga_claim_idx;
--   what read saga_due_idx were the monitor's "can be stuck" filters
--   (RUNNING, COMPENSATING, FAILED) and the declared-saga loader's
--   unfinished versions. They now say (status IN ('RUNNING','COMPENSATING')
--   OR status = 'FAILED'), which PostgreSQL serves with saga_claim_idx and
--   the partial saga_failed_idx below (a bitmap OR): FAILED instances are
--   few, and no start writes an entry into it.
--
-- The new unique index is built before the old ones go, inside the
-- migration's transaction, so that no moment lacks the guard.

CREATE UNIQUE INDEX IF NOT EXISTS saga_trigger_once_uq
    ON saga_instances (trigger_event_id, saga_name);
CREATE INDEX IF NOT EXISTS saga_failed_idx
    ON saga_instances (created_at, id) WHERE status = 'FAILED';

DROP INDEX IF EXISTS saga_trigger_uq;
DROP INDEX IF EXISTS saga_trigger_any_version_uq;
DROP INDEX IF EXISTS saga_trigger_event_idx;
DROP INDEX IF EXISTS saga_due_idx;
