// Package sim is a deterministic simulation of the saga core: a seeded
// scheduler on one goroutine, one simulated clock, several simulated relays
// sharing one journal, and faults injected at every boundary. It is a lab
// package: nothing outside test/ imports it, and the relay binary never
// links it.
//
// # What it promises
//
// Run(Config) is a pure function of its Config: the same seed gives the same
// history, event for event, and the same digest (sha256 over a canonical text
// of every scheduler action, every journal event in commit order and every
// participant effect). Every run checks the invariants of invariants.go and
// reports each violation with a message naming the instance and the step;
// Shrink finds a shorter failing configuration of the same seed.
//
// # What is real
//
//   - the journal: saga/memjournal, the reference implementation, built
//     with the simulated clock (memjournal.New(clock)). Its lease fence
//     (saga.DecideAppend, saga.HoldsLease), its claim (saga.Claimable, and
//     saga.ClaimOpenStep for the step a claim hands over or reports left
//     open), its idempotent start (one instance per trigger per saga) and
//     every event's effect (saga.Advance) are the code the relay runs.
//   - the decisions around a step that live in package saga and are
//     exported: saga.Advance for the relay's local projection,
//     saga.Classify for a failed attempt's error, saga.ParseReply,
//     saga.RetryPolicy.Delay (with jitter off), saga.RoundDelay,
//     saga.IsPermanent and the reasons that mark a step that may have acted.
//
// # What is simulated
//
//   - the runner. saga.Runner needs PostgreSQL transactions, so simRelay
//     (relay.go) mirrors its protocol as saga/runner_*.go implements it:
//     claim a batch under a lease; step_interrupted first for a step the
//     claim reports left open (in a transaction of its own); per instance
//     one unit of work (forward: reply, reply timeout, one attempt of Do;
//     compensating: the current step's compensation, or its skip when the
//     history shows it never acted); step_completed or step_awaiting with
//     the step's effect;
//     step_failed with a retry delay, or, for a permanent error or the last
//     attempt, step_failed + compensation_started in one transaction,
//     starting at the newest step that completed or may have acted;
//     step_compensated in reverse order; AppendTerminal for the write that
//     ends the saga; Release of the lease when an instance yields (which
//     closes its open step). Choices made
//     here, not in the runner: a unit is split in two scheduler turns (run
//     the step, then commit), so that a crash or a pause can fall between
//     them; a relay advances the instances of its claim one after the
//     other, where the runner gives them to concurrent workers; the
//     heartbeat runs at each of the relay's turns instead of on a timer; a held failure (an error saga.Classify gives to an operator,
//     here PostgreSQL's 42501 for a revoked grant) retries after
//     min(max(held, Base), Max) without the runner's jitter; rate limits,
//     deadlines, wait steps, compensation holds and OnReplyTimeout other
//     than retry are not modelled.
//   - transactions. A step's transaction is its participant effects plus its
//     journal writes: the journal writes run first, back to back with no
//     scheduling point between them (the clock does not move), and the
//     effects are recorded only when every write succeeded. That is the
//     atomicity PostgreSQL gives the runner; a write refused halfway is
//     reported as a violation, since memjournal cannot roll back.
//   - the correlator and the stream. Triggers are a list with positions; the
//     correlator reads a batch, starts each (trigger, saga) with a
//     deterministic instance id, then acknowledges the batch's end
//     position; after a crash it reads again from the last acknowledged
//     position. Duplicated and replayed batches are deliveries of an older
//     batch again (the stream does not reorder within a slot, so reordering
//     is modelled as an older batch arriving after newer ones). Replies are
//     matched by correlation id; a reply from another tenant is parked as
//     the correlator does (ReasonForeignReply), others go to DeliverReply.
//   - participants. A step's effect is a row in a ledger keyed by
//     (instance, step, attempt), written in the step's transaction. A step
//     that times out may have acted outside the transaction (an "acted" row
//     that no rollback removes). Command steps get a reply from a simulated
//     participant, sometimes late, twice, or from another tenant.
//
// # What it cannot find
//
// Anything in SQL (pgjournal's statements, the claim's SKIP LOCKED, the
// correlator's set-based reply delivery), in the stream (pgoutput, LSN
// acknowledgement), in goroutine interleavings of the real runner (its
// heartbeat goroutine, its group commit), and any divergence between the
// real runner and its mirror here: the mirror is only as faithful as it was
// written. The conformance suite (saga/journaltest) and the PostgreSQL
// suites cover those.
package sim
