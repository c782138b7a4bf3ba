// Package memjournal is the in-memory reference implementation of
// saga.Journal: the behaviour the PostgreSQL journal is checked against
// (saga/journaltest runs one suite over both, and a model test drives both
// with the same random operations).
//
// It owns nothing durable. It promises exactly the contract of saga.Journal:
// every change goes through saga.Advance, fenced writes use saga.HoldsLease
// against one injected clock (at exact expiry a lease is still held), errors
// carry the same kinds in the same precedence (the instance, then the lease,
// then what the caller sent), and times are truncated to the microsecond as
// PostgreSQL stores them. Every call is atomic under one mutex; there are no
// transactions, so a context carrying one (saga.ContextWithTx) is ignored.
// Commit order is call order, so LoadSince returns events in GlobalSeq order.
package memjournal
