// Package tracing owns the relay's OpenTelemetry traces: the TracerProvider
// built from the standard OTEL_* variables (none when tracing is off), W3C
// trace context carried in outbox headers (traceparent, tracestate), the
// spans of the correlator, the step runner, http steps and sink deliveries,
// and a slog handler that adds trace_id and span_id to log lines written
// with a traced context.
//
// Off costs nothing: every helper takes a trace.Tracer that is nil when
// tracing is off and returns at once without allocating.
package tracing
