// Package outbox owns the outbox row: the Message producers write inside their
// own transactions (Write), the Event the relay decodes from the WAL, and the
// mapping from our field names to the columns of an existing outbox table. It
// knows nothing about sagas or replication. Write carries the caller's W3C
// trace context (OpenTelemetry) in each row's headers as traceparent and
// tracestate.
package outbox
