// Package sinkspan traces sink deliveries: one span per delivered event,
// whose trace context the delivered message carries onward.
package sinkspan

import (
	"context"
	"net/url"
	"strconv"

	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/compensa/compensa/internal/tracing"
	"github.com/compensa/compensa/sink"
)

// Wrap returns d's sink with one span per delivered event: a producer
// span (messaging conventions) for NATS and Kafka, a client span (HTTP
// conventions) for a webhook, each child of the trace context the event's
// row carries. The event the sink sends carries the delivery span's
// traceparent in its headers, so that a consumer continues the trace. tr
// nil (off) returns the sink itself.
func Wrap(d sink.Destination, tr trace.Tracer) sink.Sink {
	if tr == nil {
		return d.Sink
	}
	return &tracedSink{Sink: d.Sink, tr: tr, spec: d.Spec}
}

type tracedSink struct {
	sink.Sink
	tr   trace.Tracer
	spec sink.Spec
}

// Unwrap returns the sink that delivers.
func (s *tracedSink) Unwrap() sink.Sink { return s.Sink }

func (s *tracedSink) Deliver(ctx context.Context, evs []*sink.Event) []error {
	spans := make([]trace.Span, len(evs))
	sent := make([]*sink.Event, len(evs))
	for i, ev := range evs {
		sctx, span := s.start(ctx, ev)
		cp := *ev // the fan-out hands the same event to every sink
		cp.Headers = tracing.ReplaceInHeaders(sctx, ev.Headers)
		sent[i], spans[i] = &cp, span
	}
	errs := s.Sink.Deliver(ctx, sent)
	for i, span := range spans {
		var err error
		if i < len(errs) {
			err = errs[i]
		}
		tracing.End(span, err)
	}
	return errs
}

func (s *tracedSink) start(ctx context.Context, ev *sink.Event) (context.Context, trace.Span) {
	pctx := tracing.FromHeaders(ctx, ev.Headers)
	attrs := []trace.SpanStartOption{trace.WithAttributes(tracing.AttrSink.String(s.spec.Name), tracing.AttrEventType.String(ev.EventType))}
	switch {
	case s.spec.Webhook != nil:
		u, _ := url.Parse(s.spec.Webhook.URL)
		kv := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(semconv.HTTPRequestMethodPost)}
		if u != nil {
			u.User, u.RawQuery = nil, ""
			kv = append(kv, trace.WithAttributes(semconv.URLFull(u.String()), semconv.ServerAddress(u.Hostname())))
			if p, err := strconv.Atoi(u.Port()); err == nil {
				kv = append(kv, trace.WithAttributes(semconv.ServerPort(p)))
			}
		}
		return s.tr.Start(pctx, "POST", append(attrs, kv...)...)
	case s.spec.NATS != nil:
		dest := s.spec.NATS.Stream
		if sub, ok := s.Sink.(interface{ Subject(*sink.Event) string }); ok {
			dest = sub.Subject(ev)
		}
		return s.tr.Start(pctx, "send "+dest, append(attrs, trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(
			semconv.MessagingSystemKey.String("nats"), semconv.MessagingOperationTypeSend, semconv.MessagingOperationName("publish"),
			semconv.MessagingDestinationName(dest), semconv.MessagingMessageID(ev.ID)))...)
	case s.spec.Kafka != nil:
		dest := s.spec.Kafka.Topic.String()
		if t, ok := s.Sink.(interface{ Topic(*sink.Event) string }); ok {
			dest = t.Topic(ev)
		}
		return s.tr.Start(pctx, "send "+dest, append(attrs, trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(
			semconv.MessagingSystemKafka, semconv.MessagingOperationTypeSend, semconv.MessagingOperationName("send"),
			semconv.MessagingDestinationName(dest), semconv.MessagingMessageID(ev.ID)))...)
	case s.spec.RabbitMQ != nil:
		dest := s.spec.RabbitMQ.Exchange
		kv := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(
			semconv.MessagingSystemRabbitMQ, semconv.MessagingOperationTypeSend, semconv.MessagingOperationName("publish"),
			semconv.MessagingDestinationName(dest), semconv.MessagingMessageID(ev.ID))}
		if rk, ok := s.Sink.(interface{ RoutingKey(*sink.Event) string }); ok {
			kv = append(kv, trace.WithAttributes(semconv.MessagingRabbitMQDestinationRoutingKey(rk.RoutingKey(ev))))
		}
		return s.tr.Start(pctx, "publish "+dest, append(attrs, kv...)...)
	case s.spec.Redis != nil:
		dest := s.spec.Redis.Stream.String()
		if st, ok := s.Sink.(interface{ Stream(*sink.Event) string }); ok {
			dest = st.Stream(ev)
		}
		return s.tr.Start(pctx, "send "+dest, append(attrs, trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(
			semconv.MessagingSystemKey.String("redis"), semconv.MessagingOperationTypeSend, semconv.MessagingOperationName("xadd"),
			semconv.MessagingDestinationName(dest), semconv.MessagingMessageID(ev.ID)))...)
	}
	return s.tr.Start(pctx, "deliver "+s.spec.Name, attrs...)
}
