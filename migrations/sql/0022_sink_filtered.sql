-- 0022: how many events each sink's filter rejected. Forward-only: never
-- edit after release.
--
-- A sink's filter drops an event for that sink only, never parking it; the
-- count is added in the batch's own transaction, beside delivered, so that
-- `relay sinks list` and /v1/sinks show it across processes and a batch
-- replayed after a crash counts once.
ALTER TABLE relay_sinks ADD COLUMN IF NOT EXISTS filtered bigint NOT NULL DEFAULT 0;
