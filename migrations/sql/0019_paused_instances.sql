-- 0019: an operator can pause a RUNNING or COMPENSATING instance and resume
-- it later. Forward-only: never edit after release.
--
-- PAUSED is a status of its own, so that the claim (which takes RUNNING and
-- COMPENSATING only), the status counts, the monitor and the API all see it
-- without a second flag to keep in step. paused_from is the status the
-- instance returns to when resumed. Nullable without a default: adding it
-- rewrites no row, and a step's write that leaves it NULL stays a HOT
-- update. The new enum value cannot be used in the transaction that adds
-- it: the indexes that name it are in the next migration.
ALTER TYPE saga_status ADD VALUE IF NOT EXISTS 'PAUSED' AFTER 'RUNNING';
ALTER TABLE saga_instances ADD COLUMN IF NOT EXISTS paused_from saga_status;
