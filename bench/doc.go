// Package bench measures the relay side by side with PostgreSQL's own
// ceilings, in one run on one database, for `relay-bench` (cmd/relay-bench) and BENCHMARKS.md.
//
// It owns the scenarios (stream throughput, with outbox rows and with
// events written as logical decoding messages, and what each costs its
// producer; latency under a fixed rate, step
// throughput, resources and the cost curve; and, only when named, the soak:
// a million sagas at 75 % of the sustainable rate with and without
// retention, plotted over time), the data loaders, the
// pg_recvlogical and pgbench baselines and the measurement helpers (latency
// percentiles from sorted samples, peak RSS, CPU seconds).
//
// What it promises: every relay figure is measured in the same run, on the
// same database and the same write-ahead log as the PostgreSQL baseline it is
// compared with, so that the ratios mean something on a shared machine where
// absolute figures drift. Each consumer of a stream scenario reads from its own
// replication slot, created before the rows are written, so all of them decode
// exactly the same WAL. The producer is never what is measured: rows are loaded
// before the consumers start (except in the latency scenario, whose producer
// commits at a fixed rate while the relay runs, and the producer cost, which
// measures nothing else).
//
// The bench works in a database of its own (compensa_bench_<pid>), created on
// the server it is given and dropped at the end, so it never touches an
// application's tables.
package bench
