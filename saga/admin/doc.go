// Package admin is the one implementation of what an operator may do to saga
// instances: list them (with the stuck ones told apart and why), show one
// (instance, steps, journal), retry one and cancel one. The HTTP API
// (internal/httpapi) and the `relay sagas` CLI both call it, so the two
// cannot disagree.
//
// It promises:
//
//   - Retry resumes exactly where an instance stands. It appends a
//     retry_requested event through the journal (which validates it with
//     saga.Advance): a FAILED instance goes back to COMPENSATING at the
//     compensation that failed, a stuck RUNNING or COMPENSATING instance
//     becomes due now at its current step, with that step's attempt count
//     reset. It never marks a step done and never moves current_step, so no
//     step is skipped; the runner does the work. The reason, the time and the
//     caller are journaled.
//   - Retry and Cancel are idempotent: asking again while the first request
//     is still pending (journaled, not yet picked up by a runner) changes
//     nothing and answers with the same state (Result.AlreadyRequested).
//   - Check and action happen in one transaction holding the instance's row
//     lock, so two operators (or an operator and the correlator) cannot
//     interleave between them.
//   - Listing is keyset-paginated on (created_at, id), newest first, with an
//     opaque cursor bound to the filters: rows inserted while someone pages
//     never make an existing row appear twice or go missing.
//   - Every time comparison uses the database clock (now()), the clock the
//     leases are fenced on.
//
// Stuck means (StuckReason): FAILED (a compensation exhausted its attempts);
// RUNNING or COMPENSATING whose next attempt is overdue by more than
// StuckAfter with no live lease (no runner is picking it up); or an instance
// whose (saga_name, saga_version) is not in the registry (no runner here can
// advance it: it is reported, never guessed at).
//
// A scope (ForTenant) restricts every read and write to one tenant; another
// tenant's instance is ErrNotFound, indistinguishable from a missing one.
package admin
