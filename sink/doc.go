// Package sink delivers committed outbox events to brokers and webhooks
// (NATS JetStream, Kafka, RabbitMQ, Redis Streams, HTTP) next to the saga
// correlator, and promises:
//
//   - Nothing is lost. The stream's position passes an event only when every
//     sink whose match selects it holds it durably: the broker acknowledged
//     it, or it was written to relay_sink_parked in the correlator's batch
//     transaction, together with the checkpoint (see Fanout).
//   - Order per aggregate. Events of one (aggregate_type, aggregate_id) are
//     first delivered in commit order. A parked event holds back the later
//     events of its aggregate in that sink only; the Drainer delivers parked
//     events in order per aggregate with capped backoff.
//   - One dedupe id. Every sink sends the outbox row's id (Nats-Msg-Id, the
//     Kafka header "id", webhook-id, AMQP message_id, the Redis entry's id
//     field), the same on every retry and replay;
//     with a cloudevents format it is also the CloudEvent's id (see
//     Event.CloudEvent), and webhooks are signed over the body sent.
//   - A sink's own choice is no failure. An event its filter rejects is
//     dropped for that sink only, counted, never parked; an expression
//     (filter, transform, ${ … } in a template) that fails for one event
//     refuses that event in that sink, parked with the reason. An
//     expression's result in a subject or topic is cleaned like a
//     placeholder's value: event data cannot leave the template's names.
//   - Never dropped. A sink known to be down parks without trying and is
//     probed; a sink at max_parked slows the stream down; a webhook answering
//     410 is disabled (loudly) and keeps parking until `relay sinks retry`.
//     A row the relay cannot decode (a dead letter for the sagas) is still
//     delivered with what could be read (Event.Poison, RawPayload); one whose
//     match or id cannot be known is held for the operator (routePoison).
//     A refused logical decoding message (outbox.Event.Message and Poison:
//     non-transactional, not JSON, no event_type) is the exception: it is
//     a dead letter only, never delivered.
//   - Given up only by an operator, never silently. ListParked shows what
//     waits and why; Skip moves one parked event to relay_sink_skipped with
//     who, when and why in one transaction, and its aggregate flows again.
//     Refusals are logged once per status and interval, not per event.
//   - No row fails a batch. Whatever PostgreSQL accepted is delivered,
//     parked or held: encoding an envelope (Event.Envelope) and parking
//     (encodeParked, storedKey) cannot fail on what a row holds, and an
//     event a broker cannot take (too large, a subject or topic it refuses)
//     is refused for that event, never taken for an outage.
//
// Wiring: the correlator's Config.InBatchTx is Fanout.WriteParked, the
// stream's sink is Fanout.Sink(correlator), the stream's LoadCheckpoint
// calls Fanout.Resync first (a new session may follow another replica's
// parking), and Fanout.Run drains in the background. relay.New does all of
// it for `relay run --sinks`.
//
// The package knows nothing of sagas: it wraps the stream's next cdc.Sink
// (the correlator) and writes its parked rows through a hook the correlator
// calls inside its transaction. Each broker lives in a sub-package
// implementing Sink; sink/sinktest is the conformance suite they all pass,
// and sink/dial builds them from a sinks file (Load).
package sink
