-- 0017: rate turns held by instances, not by workers; a secret for the ids
-- of hand-started sagas. Forward-only: never edit after release.
--
-- A step with a rate takes the next free turn of its rate key
-- (saga_step_rates). When that turn is in the future, the instance is given
-- back due at it (next_attempt_at) with the turn written here, and the
-- worker goes on with other instances; the claim at the turn runs the step
-- without taking another one, and clears it.
-- Nullable without a default: adding it rewrites no row, and it is in no
-- index, so a step's write stays a HOT update.
ALTER TABLE saga_instances ADD COLUMN IF NOT EXISTS rate_turn_at timestamptz;

-- Secrets the relays share, made once here and never sent anywhere.
-- start_id keys the trigger event ids of sagas started by hand with an
-- idempotency key (POST /v1/sagas, relay sagas start): the id is a UUIDv5
-- whose name begins with this secret, so a producer cannot compute the id
-- of another tenant's start and write an event under it first. Every relay
-- reads the same row, so replicas agree on every key's id.
CREATE TABLE IF NOT EXISTS relay_secrets (
    name   text  PRIMARY KEY,
    secret bytea NOT NULL CHECK (length(secret) >= 32)
);
-- gen_random_uuid() draws from the server's strong random source: two of
-- them are 244 random bits.
INSERT INTO relay_secrets (name, secret)
VALUES ('start_id', decode(replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''), 'hex'))
ON CONFLICT (name) DO NOTHING;
