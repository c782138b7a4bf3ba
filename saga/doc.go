// Package saga owns saga definitions and their registry, the status model and
// its one transition check, the journal contract (an append-only event log plus
// a mutable projection, fenced by leases on one clock), and the step runner.
//
// It promises: a status change that CheckTransition refuses is never stored;
// a writer whose lease is stale changes nothing; a step's writes, its outbox
// rows and its journal entry commit together or not at all; compensations run
// in reverse order of the steps that completed or may have acted.
package saga
