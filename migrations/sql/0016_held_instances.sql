-- 0016: instances held by an error that is not the step's answer (a missing
-- privilege, table or column, a connection failure, a serialization
-- failure): held_since is when the current run of such failures began; the
-- runner retries them without counting attempts and never compensates
-- because of them. Nullable without a default: adding it rewrites no row,
-- and a step's write that leaves it NULL stays a HOT update.
ALTER TABLE saga_instances ADD COLUMN IF NOT EXISTS held_since timestamptz;
