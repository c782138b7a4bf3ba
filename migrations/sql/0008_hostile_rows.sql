-- A parked delivery must never fail on what its outbox row holds. jsonb
-- refuses some JSON every consumer accepts (\u0000, a lone surrogate escape,
-- numbers beyond numeric), a row may nest deeper than the relay's JSON
-- encoder goes, hold text that is not UTF-8 (a SQL_ASCII database) or
-- hundreds of megabytes. Such an event is kept whole in event_raw (JSON
-- whose values are base64: every byte of the row), and event then holds a
-- readable summary of it ("in_event_raw": true, payload null).
-- Forward-only: never edit after release.
ALTER TABLE relay_sink_parked ADD COLUMN IF NOT EXISTS event_raw bytea;
