// Package relay runs Compensa inside a Go program: the same relay as the
// `relay run` command, assembled from a Config instead of flags, with the
// application's own sagas.
//
// # What it runs
//
// A Relay streams committed inserts of the outbox table out of PostgreSQL's
// write-ahead log (logical replication, pgoutput), starts one saga instance per
// trigger event exactly once, delivers replies to waiting steps, and runs the
// steps of due instances, one transaction per step, compensating in reverse
// order when a step fails for good. It serves a monitor (web page, /v1 API,
// /metrics, /healthz, /readyz) on Config.HTTPAddr, or through ServeHTTP when the
// application mounts it on its own server.
//
//	reg := saga.NewRegistry()
//	if err := reg.Register(myOrderSaga); err != nil { ... }
//	r, err := relay.New(ctx, relay.Config{
//		DatabaseURL: os.Getenv("DATABASE_URL"),
//		Registry:    reg,
//		HTTPAddr:    "127.0.0.1:8080",
//		Logger:      slog.Default(),
//	})
//	if err != nil { ... } // a configuration or preflight error: nothing started
//	if err := r.Run(ctx, 30*time.Second); err != nil { ... }
//
// The schema comes first: migrations.Apply (or `relay migrate`) creates the
// outbox and the relay's tables.
//
// # How to stop it
//
// Run blocks until its context is cancelled or the stream stops on a fatal
// error, then stops within the given timeout. With Start, the application
// calls Stop(ctx) itself: the stream stops first, so that nothing more is
// acknowledged; in-flight steps finish within ctx or are abandoned
// uncommitted, and their leases expire for another worker to take over. Done
// closes when the stream stops on its own; Err says why.
//
// # What it promises
//
//   - The replication slot is acknowledged only past transactions whose
//     effects (instances started, replies delivered, events parked, the
//     checkpoint) are committed: a crash replays, and a replay is recognised.
//   - One instance per (saga, version, trigger event), however often an event
//     is delivered.
//   - A step's writes, the outbox rows it emits and its journal entry commit
//     together, fenced by the instance's lease: a worker past its lease
//     writes nothing.
//   - A bad event is parked with its reason; the stream goes on.
//   - A lost slot stops the relay with ErrSlotLost; it is never re-created
//     unless Config.RecreateSlot says so.
//
// Several processes may run a Relay on the same database and slot: one holds
// the slot and streams, the others wait to take over, and all of them run
// steps.
package relay
