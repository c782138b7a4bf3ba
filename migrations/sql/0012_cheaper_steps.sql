-- 0012: less server work per saga step.
--
-- A step writes the instance's new row version (a HOT update), its step
-- record and its journal event. Before this migration the step record
-- carried a surrogate key of its own (a random uuid: one more index entry
-- on a random page per step), each of the two child rows checked its
-- instance through a foreign key (a locking lookup per row, although every
-- writer inserts them only from the instance row it has just updated under
-- its lock, in the same statement), and each event ran a plpgsql trigger
-- that looked up the previous event's xid.

-- The step record is keyed by what identifies it, (saga_instance_id,
-- sequence): the unique index that already existed becomes the primary key
-- (no rebuild) and the surrogate id goes (no rewrite: a dropped column is
-- only marked so).
DO $$ BEGIN
    IF EXISTS (SELECT 1 FROM pg_attribute
               WHERE attrelid = 'saga_steps'::regclass AND attname = 'id' AND NOT attisdropped) THEN
        ALTER TABLE saga_steps DROP CONSTRAINT saga_steps_pkey;
        ALTER TABLE saga_steps ADD CONSTRAINT saga_step_uq PRIMARY KEY USING INDEX saga_step_uq;
        ALTER TABLE saga_steps DROP COLUMN id;
    END IF;
END $$;

-- No foreign keys from the step records and the journal to the instances.
-- What they guaranteed stays: every statement that writes a step record or
-- an event takes the instance id from its own UPDATE of that instance row
-- (so the instance exists and is locked), and deleting instances deletes
-- their step records and events (the triggers below, for DELETE and
-- TRUNCATE alike), as ON DELETE CASCADE did.
DO $$
DECLARE c record;
BEGIN
    FOR c IN SELECT conrelid::regclass AS tbl, conname FROM pg_constraint
             WHERE contype = 'f' AND confrelid = 'saga_instances'::regclass
               AND conrelid IN ('saga_steps'::regclass, 'saga_events'::regclass)
    LOOP
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', c.tbl, c.conname);
    END LOOP;
END $$;

CREATE OR REPLACE FUNCTION saga_instances_delete_children() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM saga_steps WHERE saga_instance_id IN (SELECT id FROM saga_deleted);
    DELETE FROM saga_events WHERE instance_id IN (SELECT id FROM saga_deleted);
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS saga_instances_delete_children ON saga_instances;
CREATE TRIGGER saga_instances_delete_children AFTER DELETE ON saga_instances
    REFERENCING OLD TABLE AS saga_deleted
    FOR EACH STATEMENT EXECUTE FUNCTION saga_instances_delete_children();

-- DELETE, not TRUNCATE: a TRUNCATE that names the children too (and so is
-- using them while the trigger runs) finds them empty.
CREATE OR REPLACE FUNCTION saga_instances_truncate_children() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM saga_steps;
    DELETE FROM saga_events;
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS saga_instances_truncate_children ON saga_instances;
CREATE TRIGGER saga_instances_truncate_children AFTER TRUNCATE ON saga_instances
    FOR EACH STATEMENT EXECUTE FUNCTION saga_instances_truncate_children();

-- An event's xid (its order key for tailers: its writer's transaction id,
-- raised to the instance's previous event's xid when that is higher) is
-- computed by the INSERT that writes the event, from the previous event it
-- looks up by primary key, instead of by a plpgsql trigger per row. The
-- column loses its default, and the trigger fires only for a row that comes
-- without an xid, so that a writer that does not compute it (a relay of an
-- earlier release, during a rolling update) still keeps the rule.
ALTER TABLE saga_events ALTER COLUMN xid DROP DEFAULT;
DROP TRIGGER IF EXISTS saga_events_order_key ON saga_events;
CREATE TRIGGER saga_events_order_key BEFORE INSERT ON saga_events
    FOR EACH ROW WHEN (NEW.xid IS NULL) EXECUTE FUNCTION saga_events_order_key();
