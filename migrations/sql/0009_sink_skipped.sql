-- 0009: what an operator does about parked sink deliveries.

-- relay_sink_skipped keeps every parked event an operator gave up on
-- (`relay sinks skip`, POST /v1/sinks/{name}/parked/{id}/skip): the parked
-- row as it was, who skipped it, when and why. A row moves here from
-- relay_sink_parked in one transaction, so a skipped event is never simply
-- gone, and the later events of its aggregate flow again.
CREATE TABLE IF NOT EXISTS relay_sink_skipped (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    sink            text        NOT NULL,
    event_id        text        NOT NULL,
    aggregate_key   text        NOT NULL,
    event           jsonb       NOT NULL,
    -- The whole event when jsonb could not hold it (see 0008): every byte kept.
    event_raw       bytea,
    lsn             pg_lsn,
    -- The parked row's last delivery failure, its attempts and when it was parked.
    reason          text        NOT NULL,
    attempts        integer     NOT NULL,
    parked_at       timestamptz NOT NULL,
    -- Who: the API token's name, or the CLI's --actor (default cli:<OS user>);
    -- skipped_role is the database role that ran the statement.
    skipped_by      text        NOT NULL,
    skipped_role    text        NOT NULL DEFAULT current_user,
    skipped_at      timestamptz NOT NULL DEFAULT now(),
    skip_reason     text        NOT NULL
);
CREATE INDEX IF NOT EXISTS relay_sink_skipped_sink_idx ON relay_sink_skipped (sink, skipped_at);

-- The reason of the sink's most recent failed delivery (a refusal by the
-- destination included, which leaves the sink up): `relay sinks list` shows
-- it after the sink has recovered.
ALTER TABLE relay_sinks ADD COLUMN IF NOT EXISTS last_reason text;
