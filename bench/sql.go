package bench

// The bench's SQL, in one place. Names are fixed: the bench works in a
// database of its own.

// benchEventType triggers the bench saga; benchIgnoredType triggers nothing.
const (
	benchEventType = "bench.order_placed"
	benchSaga      = "bench_order"
)

// benchTenant is the tenant of every bench event.
const benchTenant = "6b1c0a5e-0000-4000-8000-00000000beef"

// sqlLoadProcedure commits total outbox rows, per_tx rows per transaction,
// from inside the server: the producer must not be what a stream scenario
// measures, and a PL/pgSQL loop with COMMIT writes exactly the WAL that as
// many application transactions would, far faster than a client could.
// Each payload carries its sequence number ("seq"), about 110 bytes in all,
// the size of a small domain event.
const sqlLoadProcedure = `
CREATE OR REPLACE PROCEDURE compensa_bench_load(total bigint, per_tx int, ev_type text, first_seq bigint)
LANGUAGE plpgsql AS $$
DECLARE
    done bigint := 0;
BEGIN
    WHILE done < total LOOP
        INSERT INTO outbox (id, tenant_id, aggregate_type, aggregate_id, event_type, payload, created_at)
        SELECT gen_random_uuid(), '` + benchTenant + `'::uuid, 'order', (first_seq + done + g)::text, ev_type,
               jsonb_build_object('seq', first_seq + done + g, 'order_id', gen_random_uuid(),
                                  'amount_cents', 4200, 'currency', 'EUR'),
               clock_timestamp()
        FROM generate_series(0, least(per_tx, total - done) - 1) AS g;
        COMMIT;
        done := done + per_tx;
    END LOOP;
END $$`

// sqlEmitProcedure is sqlLoadProcedure for the table-less outbox: each
// event is a transactional logical decoding message (prefix "outbox") whose
// content carries the same fields and payload as a loaded row.
const sqlEmitProcedure = `
CREATE OR REPLACE PROCEDURE compensa_bench_emit(total bigint, per_tx int, ev_type text, first_seq bigint)
LANGUAGE plpgsql AS $$
DECLARE
    done bigint := 0;
BEGIN
    WHILE done < total LOOP
        PERFORM pg_logical_emit_message(true, 'outbox', json_build_object(
                    'id', gen_random_uuid(), 'tenant_id', '` + benchTenant + `', 'aggregate_type', 'order',
                    'aggregate_id', (first_seq + done + g)::text, 'event_type', ev_type,
                    'payload', json_build_object('seq', first_seq + done + g, 'order_id', gen_random_uuid(),
                                                 'amount_cents', 4200, 'currency', 'EUR'))::text)
        FROM generate_series(0, least(per_tx, total - done) - 1) AS g;
        COMMIT;
        done := done + per_tx;
    END LOOP;
END $$`

// The producer-cost measurement's transactions: one event each, as an
// application writes it, from the client.
const (
	sqlProduceRow = `INSERT INTO outbox (id, tenant_id, aggregate_type, aggregate_id, event_type, payload)
VALUES (gen_random_uuid(), '` + benchTenant + `'::uuid, 'order', ($1::bigint)::text, $2,
        jsonb_build_object('seq', $1::bigint, 'order_id', gen_random_uuid(), 'amount_cents', 4200, 'currency', 'EUR'))`
	sqlProduceMessage = `SELECT pg_logical_emit_message(true, 'outbox', json_build_object(
        'id', gen_random_uuid(), 'tenant_id', '` + benchTenant + `', 'aggregate_type', 'order',
        'aggregate_id', ($1::bigint)::text, 'event_type', $2::text,
        'payload', json_build_object('seq', $1::bigint, 'order_id', gen_random_uuid(), 'amount_cents', 4200, 'currency', 'EUR'))::text)`
)

// sqlProduceOne is the latency scenario's producer: one outbox row per
// transaction (autocommit), created_at from clock_timestamp() so that it is
// the statement's time, not the transaction's start.
const sqlProduceOne = `
INSERT INTO outbox (id, tenant_id, aggregate_type, aggregate_id, event_type, payload, created_at)
VALUES (gen_random_uuid(), '` + benchTenant + `'::uuid, 'order', ($1::bigint)::text, $2,
        jsonb_build_object('seq', $1::bigint, 'order_id', gen_random_uuid(), 'amount_cents', 4200, 'currency', 'EUR'),
        clock_timestamp())`

// sqlPgbenchTables are the tables of the step-shaped pgbench baseline: a
// state row updated by primary key and a log row inserted, as one saga step
// updates its instance and appends to its journal.
const sqlPgbenchTables = `
CREATE TABLE IF NOT EXISTS bench_pgbench_state (
    id         integer PRIMARY KEY,
    counter    integer NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS bench_pgbench_log (
    id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    state_id integer NOT NULL,
    at       timestamptz NOT NULL DEFAULT now()
)`

// pgbenchStepScript is one INSERT plus one UPDATE by primary key per
// transaction: the shape of one saga step.
const pgbenchStepScript = `\set id random(1, :rows)
BEGIN;
INSERT INTO bench_pgbench_log (state_id) VALUES (:id);
UPDATE bench_pgbench_state SET counter = counter + 1, updated_at = now() WHERE id = :id;
END;
`

// sqlReset empties what a scenario fills, so that each starts from the same
// table sizes.
const sqlReset = `TRUNCATE outbox, saga_events, saga_steps, saga_instances, relay_checkpoints, relay_inbox, relay_dead_letters`
