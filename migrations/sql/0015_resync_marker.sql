-- 0015: the resync marker (relay run --on-slot-lost=resync). Forward-only:
-- never edit after release.
--
-- A resync in progress (--on-slot-lost=resync), recorded before the lost slot
-- is replaced and cleared once the outbox rows of its window were re-read.
-- A relay killed in between finds a new slot at its next start and would
-- stream from it, skipping the window; the marker makes it re-read the window
-- first. resync_checkpoint is the checkpoint's LSN when the resync began
-- (NOT NULL: a resync is in progress); resync_since is where the window
-- starts (NULL: the whole outbox table). The re-read's last batch moves the
-- checkpoint past resync_checkpoint, which tells a finished re-read whose
-- marker was not yet cleared from an unfinished one.
ALTER TABLE relay_checkpoints
    ADD COLUMN IF NOT EXISTS resync_since timestamptz,
    ADD COLUMN IF NOT EXISTS resync_checkpoint pg_lsn;
