-- Compensa base schema: the default outbox table, saga instances and steps, the
-- append-only saga journal, relay checkpoints, dead letters and the reply inbox.
-- Forward-only: never edit this file after release, add a new numbered file.

-- The default outbox table. Producers write it inside their own transactions
-- (outbox.Write); the relay streams its inserts out of the WAL.
CREATE TABLE IF NOT EXISTS outbox (
    id             uuid PRIMARY KEY,
    tenant_id      uuid,
    aggregate_type text,
    aggregate_id   text,
    event_type     text NOT NULL,
    payload        jsonb NOT NULL,
    headers        jsonb NOT NULL DEFAULT '{}'::jsonb,
    correlation_id uuid,
    causation_id   uuid,
    created_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS outbox_created_at_idx ON outbox (created_at);

DO $$ BEGIN
    CREATE TYPE saga_status AS ENUM
        ('RUNNING','COMPLETED','COMPENSATING','COMPENSATED','FAILED','TIMED_OUT');
EXCEPTION WHEN duplicate_object THEN NULL; END $$;

DO $$ BEGIN
    CREATE TYPE saga_step_status AS ENUM
        ('PENDING','RUNNING','COMPLETED','FAILED','COMPENSATED','SKIPPED');
EXCEPTION WHEN duplicate_object THEN NULL; END $$;

-- saga_instances is the mutable projection of the journal: one row per saga
-- instance, its status, where it stands and who holds its lease.
CREATE TABLE IF NOT EXISTS saga_instances (
    id                     uuid PRIMARY KEY DEFAULT gen_random_uuid() NOT NULL,
    tenant_id              uuid NOT NULL,
    workspace_id           uuid,
    saga_name              text NOT NULL,
    saga_version           integer NOT NULL,
    status                 saga_status DEFAULT 'RUNNING' NOT NULL,
    current_step           integer DEFAULT 0 NOT NULL,
    trigger_event_id       uuid NOT NULL,
    correlation_id         uuid,
    context                jsonb DEFAULT '{}'::jsonb NOT NULL,
    attempt                integer DEFAULT 0 NOT NULL,
    next_attempt_at        timestamptz DEFAULT now() NOT NULL,
    timeout_at             timestamptz,
    last_error             text,
    locked_until           timestamptz,
    created_at             timestamptz DEFAULT now() NOT NULL,
    updated_at             timestamptz DEFAULT now() NOT NULL,
    completed_at           timestamptz,
    -- Lease fencing: a fresh UUID per claim; every fenced write matches
    -- (id, lease_id, lease_expires_at >= now()).
    lease_id               uuid,
    lease_expires_at       timestamptz,
    -- Version of the newest saga_events row of this instance.
    current_version        bigint DEFAULT 0 NOT NULL,
    -- Set while a step waits for a reply correlated by this id.
    awaiting_correlation_id uuid,
    awaiting_until          timestamptz,
    -- A reply delivered to the waiting step, not yet consumed by the runner.
    reply                   jsonb,
    -- Why compensation started: a step failure, the deadline, a cancel.
    compensation_reason     text
);

-- One event starts a single instance of a given saga: this constraint, not a
-- check in code, is what makes a start idempotent.
CREATE UNIQUE INDEX IF NOT EXISTS saga_trigger_uq
    ON saga_instances (saga_name, saga_version, trigger_event_id);
-- New triggers start the newest version only, so one trigger event starts a
-- saga once across its versions too: a transaction replayed after a new
-- version was deployed must not start it again.
CREATE UNIQUE INDEX IF NOT EXISTS saga_trigger_any_version_uq
    ON saga_instances (saga_name, trigger_event_id);
CREATE INDEX IF NOT EXISTS saga_due_idx
    ON saga_instances (status, next_attempt_at);
-- The runner's claim reads due instances in (next_attempt_at, id) order;
-- this index returns them in that order without sorting the whole due set.
CREATE INDEX IF NOT EXISTS saga_claim_idx
    ON saga_instances (next_attempt_at, id) WHERE status IN ('RUNNING', 'COMPENSATING');
CREATE INDEX IF NOT EXISTS saga_tenant_idx
    ON saga_instances (tenant_id, created_at);
-- The monitor lists instances newest first, keyset-paginated on (created_at, id).
CREATE INDEX IF NOT EXISTS saga_created_idx
    ON saga_instances (created_at, id);
CREATE INDEX IF NOT EXISTS saga_awaiting_idx
    ON saga_instances (awaiting_correlation_id) WHERE awaiting_correlation_id IS NOT NULL;

CREATE TABLE IF NOT EXISTS saga_steps (
    id                     uuid PRIMARY KEY DEFAULT gen_random_uuid() NOT NULL,
    saga_instance_id       uuid NOT NULL REFERENCES saga_instances (id) ON DELETE CASCADE,
    step_name              text NOT NULL,
    sequence               integer NOT NULL,
    status                 saga_step_status DEFAULT 'PENDING' NOT NULL,
    attempts               integer DEFAULT 0 NOT NULL,
    compensation_attempts  integer DEFAULT 0 NOT NULL,
    output                 jsonb,
    last_error             text,
    started_at             timestamptz,
    completed_at           timestamptz,
    compensated_at         timestamptz
);

-- A step appears once per instance: the basis of idempotent advancing.
CREATE UNIQUE INDEX IF NOT EXISTS saga_step_uq
    ON saga_steps (saga_instance_id, sequence);

-- saga_events is the append-only journal. (instance_id, version) makes versions
-- monotonic per instance; global_seq numbers events. Tailers read in
-- (xid, global_seq) order and only below the oldest running transaction
-- (pg_snapshot_xmin), so that they never skip an event whose transaction
-- commits late: every event a later commit can still add has a higher xid.
CREATE TABLE IF NOT EXISTS saga_events (
    instance_id  uuid NOT NULL REFERENCES saga_instances (id) ON DELETE CASCADE,
    version      bigint NOT NULL,
    global_seq   bigint GENERATED ALWAYS AS IDENTITY,
    xid          xid8 NOT NULL DEFAULT pg_current_xact_id(),
    kind         text NOT NULL,
    step         integer,
    payload      jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (instance_id, version)
);
CREATE UNIQUE INDEX IF NOT EXISTS saga_events_global_seq_uq ON saga_events (global_seq);
CREATE INDEX IF NOT EXISTS saga_events_xid_idx ON saga_events (xid, global_seq);

-- An event's xid is its writer's transaction id, raised to the xid of the
-- instance's previous event when that is higher (a transaction that got its id
-- before the previous event's transaction did). Tailers then see each
-- instance's events in version order, and an event still never passes below
-- pg_snapshot_xmin before its own transaction ends, since its xid is at least
-- its writer's. A trigger, so that every writer (the journal, the correlator's
-- batch SQL) keeps the rule.
CREATE OR REPLACE FUNCTION saga_events_order_key() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.xid := GREATEST(pg_current_xact_id(),
        (SELECT e.xid FROM saga_events e
          WHERE e.instance_id = NEW.instance_id AND e.version = NEW.version - 1));
    RETURN NEW;
END $$;

DO $$ BEGIN
    CREATE TRIGGER saga_events_order_key BEFORE INSERT ON saga_events
        FOR EACH ROW EXECUTE FUNCTION saga_events_order_key();
EXCEPTION WHEN duplicate_object THEN NULL; END $$;

-- One row per replication slot: the end LSN of the newest source transaction
-- whose effects are committed here. Written in the same transaction as those
-- effects, so a replayed batch is recognised.
CREATE TABLE IF NOT EXISTS relay_checkpoints (
    slot_name  text PRIMARY KEY,
    lsn        pg_lsn NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- Events the relay could not use, parked with their reason so that the stream
-- goes on. retried_at is set when an operator re-drives one.
CREATE TABLE IF NOT EXISTS relay_dead_letters (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id    text NOT NULL DEFAULT '',
    event_type  text NOT NULL DEFAULT '',
    lsn         pg_lsn NOT NULL,
    reason      text NOT NULL,
    raw         jsonb NOT NULL,
    parked_at   timestamptz NOT NULL DEFAULT now(),
    retried_at  timestamptz,
    retry_count integer NOT NULL DEFAULT 0
);
-- A replayed part of a large transaction parks the same row again: the index
-- makes that a no-op.
CREATE UNIQUE INDEX IF NOT EXISTS relay_dead_letters_event_uq ON relay_dead_letters (lsn, event_id, event_type);
CREATE INDEX IF NOT EXISTS relay_dead_letters_parked_idx ON relay_dead_letters (parked_at) WHERE retried_at IS NULL;

-- The inbox makes a replayed reply a no-op: (consumer, event id) is delivered
-- at most once.
CREATE TABLE IF NOT EXISTS relay_inbox (
    consumer    text NOT NULL,
    event_id    uuid NOT NULL,
    instance_id uuid,
    outcome     text NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);
