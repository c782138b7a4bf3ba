package tracing

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// ScopeName is the instrumentation scope of every span the relay makes.
const ScopeName = "github.com/compensa/compensa"

// Header names of W3C trace context, as outbox headers carry them.
const (
	HeaderTraceparent = "traceparent"
	HeaderTracestate  = "tracestate"
)

// Propagator is the propagator of trace context in outbox headers, HTTP
// requests and broker messages: W3C Trace Context.
var Propagator propagation.TextMapPropagator = propagation.TraceContext{}

// Tracer returns the relay's tracer from tp, or nil when tp is nil or a
// no-op provider: nil tells every helper here that tracing is off.
func Tracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		return nil
	}
	if _, ok := tp.(noop.TracerProvider); ok {
		return nil
	}
	if _, ok := tp.(*noop.TracerProvider); ok {
		return nil
	}
	return tp.Tracer(ScopeName)
}

// Inject adds the trace context of ctx to headers as traceparent (and
// tracestate) when ctx carries a valid span context. Headers the caller set
// are kept: a traceparent already present is not overwritten. It returns
// headers, allocated when it was nil and something was added.
func Inject(ctx context.Context, headers map[string]string) map[string]string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return headers
	}
	if _, set := headers[HeaderTraceparent]; set {
		return headers
	}
	carrier := propagation.MapCarrier{}
	Propagator.Inject(ctx, carrier)
	if len(carrier) == 0 {
		return headers
	}
	if headers == nil {
		headers = make(map[string]string, len(carrier))
	}
	for k, v := range carrier {
		if _, set := headers[k]; !set {
			headers[k] = v
		}
	}
	return headers
}

// Traceparent is the traceparent header of ctx's span, or "" when ctx
// carries none.
func Traceparent(ctx context.Context) string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ""
	}
	carrier := propagation.MapCarrier{}
	Propagator.Inject(ctx, carrier)
	return carrier[HeaderTraceparent]
}

// WithTraceparent returns ctx with the remote span context of a traceparent
// (and tracestate) value; ctx itself when tp is empty or not valid.
func WithTraceparent(ctx context.Context, tp, ts string) context.Context {
	if tp == "" {
		return ctx
	}
	carrier := propagation.MapCarrier{HeaderTraceparent: tp}
	if ts != "" {
		carrier[HeaderTracestate] = ts
	}
	return Propagator.Extract(ctx, carrier)
}

// FromHeaders returns ctx with the remote span context an outbox row's
// headers (a JSON object) carry in traceparent/tracestate; ctx itself when
// they carry none or not a valid one. Headers without the word traceparent
// are not parsed.
func FromHeaders(ctx context.Context, headers json.RawMessage) context.Context {
	if !bytes.Contains(headers, []byte(HeaderTraceparent)) {
		return ctx
	}
	var h map[string]any
	if json.Unmarshal(headers, &h) != nil {
		return ctx
	}
	tp, _ := h[HeaderTraceparent].(string)
	ts, _ := h[HeaderTracestate].(string)
	return WithTraceparent(ctx, tp, ts)
}

// ReplaceInHeaders returns an outbox row's headers (a JSON object) with
// traceparent and tracestate set to ctx's span context, the other members
// kept; headers unchanged when ctx carries no valid span or headers is not
// a JSON object.
func ReplaceInHeaders(ctx context.Context, headers json.RawMessage) json.RawMessage {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return headers
	}
	h := map[string]json.RawMessage{}
	if len(bytes.TrimSpace(headers)) > 0 && json.Unmarshal(headers, &h) != nil {
		return headers
	}
	carrier := propagation.MapCarrier{}
	Propagator.Inject(ctx, carrier)
	delete(h, HeaderTracestate)
	for k, v := range carrier {
		b, _ := json.Marshal(v)
		h[k] = b
	}
	out, err := json.Marshal(h)
	if err != nil {
		return headers
	}
	return out
}

// propagationHeader adapts http.Header to a TextMapCarrier.
func propagationHeader(h http.Header) propagation.HeaderCarrier { return propagation.HeaderCarrier(h) }

// FromRequest is r's context with the trace context of r's traceparent and
// tracestate headers, if any.
func FromRequest(r *http.Request) context.Context {
	if r.Header.Get(HeaderTraceparent) == "" {
		return r.Context()
	}
	return Propagator.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
}
