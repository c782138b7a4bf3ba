// Package saga owns saga definitions and their registry, the status model and
// its one transition check, the journal contract (an append-only event log plus
// a mutable projection, fenced by leases on one clock), and the step runner.
//
// It promises: a status change that CheckTransition refuses is never stored;
// a writer whose lease is stale changes nothing; a step's writes, its outbox
// rows and its journal entry commit together or not at all; compensations run
// in reverse order of the steps that completed or may have acted.
//
// # Definitions
//
// A Definition is one version of a saga, declared in code: triggers, an
// optional deadline, ordered steps. Define builds one from a TypedDefinition
// whose state is a Go type S (carried between steps as JSON). Several
// versions of one saga may be registered; an instance stays on the version
// that started it, and an instance whose version is not registered is left
// alone and reported (Hooks.OnStuck), never run with another version.
//
// A Step has Do, an optional Compensate, a Retry and a CompensationRetry
// policy (zero fields take DefaultStepRetry: 10 attempts, 1s ×2 capped at
// 5 minutes; DefaultCompensationRetry: 20 attempts, 1s ×2 capped at 10
// minutes; 20% jitter, which only shortens a delay) and an optional Timeout.
//
// # The runner
//
// A Runner claims due instances in batches (one query per batch, never more
// than its idle workers) and advances each one transaction at a time:
//
//	begin → Do(ctx, state, tx, emitter) → Append(step_completed, new state) → commit
//
// The journal joins the transaction (ContextWithTx) and checks the lease in
// it, so a worker whose lease was taken over cannot commit: its writes and the
// outbox rows it emitted vanish with the rollback. A worker heartbeats every
// third of the lease while it works on an instance; a refused heartbeat
// cancels the instance's work.
//
// The transaction begins on the step's first use of StepTx.Tx (or Emit): a
// step that writes nothing of its own hands its entry to the journal alone,
// which fences, writes and commits it in two round trips (pgjournal sends
// BEGIN with its locking read and COMMIT with its write).
//
// # Group commit
//
// When a claim returns more instances than there are idle workers, they go
// out in groups of up to RunnerConfig.GroupCommit (default 8), as few and as
// even as that allows, and a worker advances a group in rounds: one step of
// each per transaction, so that one commit and one WAL flush serve the
// round. Every promise of a single step holds per instance: a step that
// used the database runs inside a savepoint of its own (created on its
// first statement) with its journal entry, and rolls back to it alone
// when it fails or its lease is gone; the entries of the steps that wrote
// nothing go to the journal together (GroupAppender: pgjournal locks the
// round's instances in id order and writes them in two round trips), each
// fenced by its own lease, a refused one writing nothing of its instance. A
// failure is recorded after the round's commit, in a transaction of its own,
// as a single step's is. Waits, replies, deadlines and compensations run one
// per transaction; a runner with an idle worker for each claimed instance
// runs every step in its own, so that it keeps the latency of one step per
// transaction. saga/grouptest kills a grouping runner with SIGKILL mid-round
// and checks that nothing is lost or doubled.
//
// An error from Do rolls the step back and counts as a failed attempt: the
// next one comes after the policy's backoff (step_failed, in a transaction of
// its own). A permanent error (Permanent, ErrPermanent) or the last attempt
// starts compensation, in the same transaction as that last step_failed.
//
// # Which steps are compensated
//
// Compensation runs from the newest step that completed or may have acted
// down to step 0, one compensation per transaction, each with its own retry.
// A step "may have acted" when it was not seen to commit but something of it
// may exist: an attempt that ran out of its Timeout (it may have called out
// before it was stopped), a step that sent a command and waited for a
// reply (the command was committed), and an attempt whose lease was lost
// while it may have been running (step_interrupted: the runner that claims
// the instance next finds the step its holder left open, and records it
// before anything else). A step whose Do returned an error did not act,
// since its transaction was rolled back: it is not compensated, unless an
// earlier attempt of it may have acted.
// Steps therefore keep effects outside the database behind the outbox, or
// make them idempotent and give them a Compensate that tolerates finding
// nothing to undo. Whether a step acted is read from the journal (its
// step_completed, step_awaiting, reply and step_interrupted events, and
// step_failed events whose Reason is FailureTimeout, FailureReplyTimeout,
// FailureReplyError or FailureMayHaveActed; a step_skipped after them says
// it did not), so every runner decides alike.
//
// A step without Compensate, or that did not act, gets compensation_skipped
// (its step record keeps its status: nothing is marked compensated that did
// not run). A compensation that exhausts its policy ends the instance FAILED
// with the error as last_error; the compensations below it are not run, and
// the instance waits for a person (Journal.RequestRetry resumes it).
// Compensations run under a context that Stop does not cancel: only their
// own timeout (the step's Timeout, else RunnerConfig.CompensationTimeout) and
// a lost lease end them.
//
// # Deadline
//
// Past an instance's timeout_at no forward step starts: the runner
// compensates (reason ReasonDeadline) and ends the instance TIMED_OUT. Retry
// delays and reply waits are shortened to end at the deadline, so an
// instance is not left waiting an hour past it.
//
// # Commands and replies
//
// A step with a ReplyTimeout sends one command per attempt with
// StepTx.EmitCommand and waits. The command's outbox id is the step's
// CommandID; the service that handles it replies with an event whose
// correlation_id is that id (the request–reply convention of message
// brokers: a reply is correlated by the id of the request). The correlator
// delivers it (Journal.DeliverReply); the next claim reads it:
//
//   - the payload is a JSON object; it is a failure when it has a non-empty
//     "error" string or "ok": false, and a success otherwise, e.g.
//     {"ok":true,"document_id":"…"} or {"error":"quota exceeded"};
//   - "permanent": true on a failure asks that the step not be retried;
//   - a payload that is not a JSON object is a permanent failure.
//
// A success completes the step (OnReply may read the reply into the state;
// the payload becomes the step's output). A failure, or no reply within
// ReplyTimeout, is a failed attempt of a step that may have acted: a retry
// runs Do again with a new CommandID, so a late reply to the old command is
// not taken for the new one. OnReplyTimeout changes what no reply does:
// compensate at once, or end the instance FAILED for a person.
//
// # Skips, timers, limits
//
// Do may return Skip(reason): the step is journaled step_skipped, the saga
// goes on, and the step is never compensated. Do may return WaitUntil(t):
// the step is journaled step_waiting with t, the instance is due at t and no
// worker holds it meanwhile; at t the step completes without Do running
// again (a timer that survives restarts). Whatever Do wrote is rolled back in
// both cases. A step's Rate spaces its starts across every runner
// (RateTaker), and a Definition's Concurrency runs at most Limit instances
// per key at a time, in trigger commit order (enforced by pgjournal's claim).
//
// # Waking up
//
// Idle polling backs off from PollInterval to MaxPollInterval. Whoever starts
// instances or delivers replies wakes the runners: Runner.Wake in the same
// process, NotifyRunners (pg_notify on WakeChannel, delivered at commit) for
// runners elsewhere, so a new saga's first step starts within milliseconds.
// An idle runner also sleeps no longer than the next instance falls due
// (DueReporter), so timers, retries and reply timeouts fire on time.
package saga
