-- 0002: a producer writing plain SQL needs no id of its own, and a dead letter
-- is one row per event. Forward-only: never edit after release.

-- The default outbox table gets DEFAULT gen_random_uuid() on its id, so that
--   INSERT INTO outbox (tenant_id, aggregate_type, aggregate_id, event_type, payload) VALUES (...)
-- works from psql, JDBC, psycopg or node-postgres. Only the table 0001 created
-- is touched: the migrator says (compensa.custom_outbox = 'on') when the
-- application's outbox is a table of its own (--outbox-table, --outbox-columns),
-- and a table named outbox that 0001 did not create (no outbox_created_at_idx,
-- an id that is not uuid or already has a default) is left as its owner made it.
DO $$
BEGIN
    IF coalesce(current_setting('compensa.custom_outbox', true), '') <> 'on'
       AND EXISTS (
           SELECT 1 FROM pg_attribute a
            WHERE a.attrelid = to_regclass('outbox') AND a.attname = 'id'
              AND a.atttypid = 'uuid'::regtype AND NOT a.atthasdef AND NOT a.attisdropped)
       AND EXISTS (
           SELECT 1 FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid
            WHERE i.indrelid = to_regclass('outbox') AND ic.relname = 'outbox_created_at_idx')
    THEN
        ALTER TABLE outbox ALTER COLUMN id SET DEFAULT gen_random_uuid();
    END IF;
END $$;

-- A dead letter is unique by its event id, not only by (lsn, event id, type):
-- a replay after `relay run --recreate-slot` reads the same outbox rows at new
-- LSNs and must not park them a second time. Rows without an id keep their
-- per-transaction key "(no id) #n", which only the LSN tells apart.
-- Duplicates parked by the previous release are folded into the oldest row.
DELETE FROM relay_dead_letters d
 USING relay_dead_letters older
 WHERE d.event_id = older.event_id AND older.id < d.id
   AND d.event_id <> '' AND d.event_id NOT LIKE '(no id)%';
CREATE UNIQUE INDEX IF NOT EXISTS relay_dead_letters_event_id_uq
    ON relay_dead_letters (event_id)
 WHERE event_id <> '' AND event_id NOT LIKE '(no id)%';
