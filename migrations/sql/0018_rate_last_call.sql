-- 0018: when each rate key last let a step run. Forward-only: never edit
-- after release.
--
-- A turn is reserved ahead of time; a worker may claim it late (a busy
-- machine, a long poll), and late turns claimed together would reach the
-- participant together. last_at is the time the key last let a step run:
-- a turn that has come runs only when at least one spacing has passed
-- since then, otherwise its instance takes the next free turn.
-- Nullable without a default: adding it rewrites no row.
ALTER TABLE saga_step_rates ADD COLUMN IF NOT EXISTS last_at timestamptz;
