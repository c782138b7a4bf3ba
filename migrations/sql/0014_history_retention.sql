-- 0014: history retention (relay run --saga-retention, --failed-retention,
-- --dedupe-window). Forward-only: never edit after release.
--
-- The history of a finished instance (its step records, journal events and
-- inbox rows) is deleted once it ended longer ago than the retention; its
-- instance row stays as a tombstone (status, ids, saga name and version,
-- tenant, trigger event id, times; context, reply, errors and trace
-- cleared) with history_deleted_at set, so that saga_trigger_once_uq still
-- recognises a re-read trigger. Tombstones are deleted once they ended
-- longer ago than the dedupe window. Nullable without a default: adding it
-- rewrites no row.
ALTER TABLE saga_instances ADD COLUMN IF NOT EXISTS history_deleted_at timestamptz;

-- The janitor's two queues, oldest end first: ended instances whose history
-- is still kept, and tombstones. Each holds only its own rows, so neither
-- scan walks over the other's (a month of tombstones in front of the
-- history to delete).
CREATE INDEX IF NOT EXISTS saga_history_kept_idx ON saga_instances (completed_at)
    WHERE completed_at IS NOT NULL AND history_deleted_at IS NULL;
CREATE INDEX IF NOT EXISTS saga_tombstone_idx ON saga_instances (completed_at)
    WHERE history_deleted_at IS NOT NULL;

-- Inbox rows go with their instance's history; rows no instance took (a
-- late or foreign reply) go by age.
CREATE INDEX IF NOT EXISTS relay_inbox_instance_idx ON relay_inbox (instance_id)
    WHERE instance_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS relay_inbox_unmatched_idx ON relay_inbox (received_at)
    WHERE instance_id IS NULL;

-- Re-driven dead letters go by the time they were re-driven.
CREATE INDEX IF NOT EXISTS relay_dead_letters_retried_idx ON relay_dead_letters (retried_at)
    WHERE retried_at IS NOT NULL;
