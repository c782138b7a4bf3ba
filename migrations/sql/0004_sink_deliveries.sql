-- Sinks: deliveries to brokers and webhooks that could not be made
-- at once, and each sink's state. Forward-only: never edit, add a new file.

-- relay_sink_parked holds events a sink has not acknowledged yet. A row is
-- written in the correlator's batch transaction, with the checkpoint, so the
-- slot never passes an event that is neither delivered nor parked. The
-- background drainer delivers rows in seq order per (sink, aggregate_key)
-- and deletes them once the destination has them.
CREATE TABLE IF NOT EXISTS relay_sink_parked (
    sink            text        NOT NULL,
    event_id        text        NOT NULL,
    seq             bigserial   NOT NULL,
    aggregate_key   text        NOT NULL,
    event           jsonb       NOT NULL,
    lsn             pg_lsn,
    reason          text        NOT NULL,
    attempts        integer     NOT NULL DEFAULT 0,
    parked_at       timestamptz NOT NULL DEFAULT now(),
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (sink, event_id)
);
-- The drainer reads each aggregate's head in order; the fan-out asks whether
-- an aggregate has parked rows (then its new events queue behind them).
CREATE INDEX IF NOT EXISTS relay_sink_parked_order_idx
    ON relay_sink_parked (sink, aggregate_key, seq);

-- relay_sinks is one row per configured sink: what `relay sinks list` and
-- /v1/sinks show across processes.
CREATE TABLE IF NOT EXISTS relay_sinks (
    name            text PRIMARY KEY,
    kind            text        NOT NULL,
    state           text        NOT NULL DEFAULT 'up',
    reason          text,
    delivered       bigint      NOT NULL DEFAULT 0,
    changed_at      timestamptz NOT NULL DEFAULT now(),
    -- Set by `relay sinks retry`: the running relay re-drives parked rows
    -- and probes a sink it believed down or disabled.
    retry_requested_at timestamptz
);
