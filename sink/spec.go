package sink

import (
	"encoding/json"
	"slices"
)

// fieldSpec describes one key of a sinks file. The same tree drives the
// loader (unknown and required keys), the JSON Schema (Schema) and the
// docs/sinks.md's reference, so that the three cannot disagree.
type fieldSpec struct {
	Key      string
	Type     string // string, duration, integer, boolean, list, object, expression, any
	Required bool
	Doc      string
	Example  string
	Fields   []*fieldSpec // for object, and for a list of objects
	Pattern  string
	OneOf    [][]string // for object: exactly one of these key sets
	Enum     []string   // for string: the values allowed
	// ZeroOK: an integer that may be 0 (it means "off").
	ZeroOK bool
}

func (s *fieldSpec) field(key string) *fieldSpec {
	for _, f := range s.Fields {
		if f.Key == key {
			return f
		}
	}
	return nil
}

func (s *fieldSpec) keys() []string {
	out := make([]string, len(s.Fields))
	for i, f := range s.Fields {
		out[i] = f.Key
	}
	return out
}

var (
	matchSpec = &fieldSpec{Key: "match", Type: "object", Doc: "globs selecting events; omitted = everything", Fields: []*fieldSpec{
		{Key: "event_types", Type: "list", Doc: "globs on event_type (*, ?, [a-z])", Example: `["payment.*"]`},
		{Key: "aggregate_types", Type: "list", Doc: "globs on aggregate_type", Example: `["order"]`},
	}}
	webhookSpec = &fieldSpec{Key: "webhook", Type: "object", Doc: "an HTTP endpoint receiving one signed POST per event", Fields: []*fieldSpec{
		{Key: "url", Type: "string", Required: true, Doc: "http(s) URL", Example: "http://127.0.0.1:8099/events"},
		{Key: "secret_env", Type: "string", Doc: "environment variable holding the whsec_ secret (Standard Webhooks signature)", Example: "RELAY_WEBHOOK_SECRET", Pattern: `^[A-Za-z_][A-Za-z0-9_]*$`},
		{Key: "timeout", Type: "duration", Doc: "per request (default 10s)", Example: "10s"},
		{Key: "concurrency", Type: "integer", Doc: "aggregates delivered at once (default 16)", Example: "16"},
		{Key: "legacy_underscore_headers", Type: "boolean", Doc: "send the metadata headers under their former names (Event_type, Aggregate_type, Aggregate_id, Tenant_id, Correlation_id, Causation_id, Poison) instead of Event-Type, Aggregate-Type, Aggregate-Id, Tenant-Id, Correlation-Id, Causation-Id, Poison; deprecated, removed in the next release (default false)", Example: "false"},
	}}
	natsSpec = &fieldSpec{Key: "nats", Type: "object", Doc: "a NATS JetStream stream", Fields: []*fieldSpec{
		{Key: "url", Type: "string", Required: true, Doc: "server URL(s), comma separated", Example: "nats://127.0.0.1:4222"},
		{Key: "stream", Type: "string", Required: true, Doc: "stream, created if missing", Example: "OUTBOX", Pattern: `^[A-Za-z0-9_-]+$`},
		{Key: "subject", Type: "string", Doc: "subject template (default outbox.{aggregate_type}.{raw(event_type)}); each {placeholder} fills one token (its dots, wildcards and spaces become _), {raw(placeholder)} keeps its dots as token separators; a ${ … } CEL expression over event fills one token, cleaned exactly like a placeholder", Example: "outbox.{aggregate_type}.{raw(event_type)}"},
		{Key: "duplicate_window", Type: "duration", Doc: "stream's duplicate window when created (at least 2m, default 2m)", Example: "2m"},
		{Key: "timeout", Type: "duration", Doc: "wait for acknowledgements (default 10s)", Example: "10s"},
	}}
	kafkaSpec = &fieldSpec{Key: "kafka", Type: "object", Doc: "a Kafka topic (idempotent producer, key = aggregate_id)", Fields: []*fieldSpec{
		{Key: "brokers", Type: "list", Required: true, Doc: "seed brokers, host:port", Example: `["127.0.0.1:9092"]`},
		{Key: "topic", Type: "string", Doc: "topic template (default outbox.event.{aggregate_type}); each {placeholder} fills one dot-separated part (its dots and characters Kafka refuses become _), {raw(placeholder)} keeps its dots; a ${ … } CEL expression over event fills one part, cleaned exactly like a placeholder", Example: "outbox.event.{aggregate_type}"},
		{Key: "timeout", Type: "duration", Doc: "wait for acknowledgements (default 10s)", Example: "10s"},
		{Key: "max_message_bytes", Type: "integer", Doc: "the topics' max.message.bytes (default 1000012, Kafka's); a larger record is parked, never sent", Example: "1000012"},
	}}
	rabbitSpec = &fieldSpec{Key: "rabbitmq", Type: "object", Doc: "a RabbitMQ exchange the operator declared (persistent messages, mandatory, publisher confirms awaited)", Fields: []*fieldSpec{
		{Key: "url", Type: "string", Required: true, Doc: "amqp:// or amqps:// (TLS) URL, with a user but no password", Example: "amqp://relay@127.0.0.1:5672/"},
		{Key: "password_env", Type: "string", Doc: "environment variable holding the user's password", Example: "RELAY_RABBITMQ_PASSWORD", Pattern: `^[A-Za-z_][A-Za-z0-9_]*$`},
		{Key: "exchange", Type: "string", Required: true, Doc: "exchange to publish to; the operator declares it (durable) and binds the queues, the relay never does", Example: "outbox", Pattern: `^[A-Za-z0-9_.:-]+$`},
		{Key: "routing_key", Type: "string", Doc: "routing key template (default outbox.{aggregate_type}.{event_type}); each {placeholder} fills one word (its dots, '*', '#' and spaces become _), {raw(placeholder)} keeps its dots as word separators", Example: "outbox.{aggregate_type}.{event_type}"},
		{Key: "timeout", Type: "duration", Doc: "wait for the broker's confirms (default 10s)", Example: "10s"},
		{Key: "max_message_bytes", Type: "integer", Doc: "the broker's max_message_size (default 134217728, RabbitMQ 3's; RabbitMQ 4.0's is 16777216); a larger message is parked, never sent", Example: "134217728"},
	}}
	redisSpec = &fieldSpec{Key: "redis", Type: "object", Doc: "a Redis stream (XADD, idempotent on replay within dedupe_window)", Fields: []*fieldSpec{
		{Key: "url", Type: "string", Required: true, Doc: "redis:// or rediss:// (TLS) URL, with a user but no password", Example: "redis://127.0.0.1:6379/0"},
		{Key: "password_env", Type: "string", Doc: "environment variable holding the password", Example: "RELAY_REDIS_PASSWORD", Pattern: `^[A-Za-z_][A-Za-z0-9_]*$`},
		{Key: "stream", Type: "string", Doc: "stream key template (default outbox.{aggregate_type}); each {placeholder} fills one part (its dots, ':', braces and spaces become _)", Example: "outbox.{aggregate_type}"},
		{Key: "maxlen", Type: "integer", ZeroOK: true, Doc: "approximate trimming, XADD MAXLEN ~ n (default 0: no trimming)", Example: "1000000"},
		{Key: "dedupe_window", Type: "duration", Doc: "how long an added id is remembered, so that a replay adds no second entry (at least 2m, default 24h)", Example: "24h"},
		{Key: "timeout", Type: "duration", Doc: "per round trip (default 10s)", Example: "10s"},
	}}
	sinkSpec = &fieldSpec{Key: "sink", Type: "object", OneOf: [][]string{{"webhook"}, {"nats"}, {"kafka"}, {"rabbitmq"}, {"redis"}}, Fields: []*fieldSpec{
		{Key: "name", Type: "string", Required: true, Doc: "unique; names the sink in metrics, commands and the parked table", Example: "payments", Pattern: `^[a-z0-9][a-z0-9_-]{0,62}$`},
		matchSpec,
		{Key: "max_parked", Type: "integer", Doc: "cap on parked events; at the cap the stream waits (default 1000000)", Example: "1000000"},
		{Key: "format", Type: "string", Enum: []string{FormatEnvelope, FormatCloudEvents, FormatCloudEventsStructured}, Doc: "how events are encoded: envelope (default; the JSON envelope for webhooks, the payload as the body for NATS and Kafka), cloudevents (CloudEvents 1.0 binary content mode: attributes as ce- headers, ce_ for Kafka; data as the body) or cloudevents-structured (the whole event as an application/cloudevents+json body)", Example: "cloudevents"},
		{Key: "source", Type: "string", Doc: "CloudEvents source attribute, a URI reference (default /compensa/<database>/<schema>.<table>); only with a cloudevents format", Example: "/billing/orders"},
		{Key: "filter", Type: "expression", Doc: "one ${ … } CEL expression over event giving true or false; the events it rejects are dropped for this sink (counted in compensa_sink_filtered_total), never parked; an expression that fails parks the event with the reason", Example: `"${ event.payload.amount > 100 }"`},
		{Key: "transform", Type: "any", Doc: "the delivered payload (envelope payload, CloudEvents data): a YAML value whose strings may hold ${ … } CEL expressions over event; a string that is one expression keeps the expression's type", Example: `{ order: "${ event.aggregate_id }", total: "${ event.payload.amount }" }`},
		webhookSpec, natsSpec, kafkaSpec, rabbitSpec, redisSpec,
	}}
	fileSpec = &fieldSpec{Key: "", Type: "object", Fields: []*fieldSpec{
		{Key: "sinks", Type: "list", Required: true, Doc: "the sinks", Fields: []*fieldSpec{sinkSpec}},
	}}
)

// Schema returns the JSON Schema of a sinks file (sink/sinks.schema.json is
// this output; a test keeps them equal).
func Schema() []byte {
	root := schemaOf(fileSpec)
	root["$schema"] = "https://json-schema.org/draft/2020-12/schema"
	root["$id"] = "https://github.com/compensa/compensa/sink/sinks.schema.json"
	root["title"] = "Compensa sinks file (relay run --sinks)"
	b, err := json.MarshalIndent(root, "", "  ")
	if err != nil {
		panic(err)
	}
	return append(b, '\n')
}

func schemaOf(f *fieldSpec) map[string]any {
	out := map[string]any{}
	if f.Doc != "" {
		out["description"] = f.Doc
	}
	switch f.Type {
	case "string":
		out["type"] = "string"
		out["minLength"] = 1
		if f.Pattern != "" {
			out["pattern"] = f.Pattern
		}
		if len(f.Enum) > 0 {
			out["enum"] = f.Enum
		}
	case "expression":
		out["type"] = "string"
		out["pattern"] = `^\s*\$\{[\s\S]*\}\s*$`
	case "any":
		// Any YAML value: no "type" constrains it.
	case "duration":
		out["type"] = "string"
		out["pattern"] = `^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	case "boolean":
		out["type"] = "boolean"
	case "integer":
		out["type"] = []string{"integer", "string"}
		out["pattern"] = `^[0-9_]+$`
		out["minimum"] = 1
		if f.ZeroOK {
			out["minimum"] = 0
		}
	case "list":
		out["type"] = "array"
		if len(f.Fields) == 1 {
			out["items"] = schemaOf(f.Fields[0])
			out["minItems"] = 1
		} else {
			out["items"] = map[string]any{"type": "string", "minLength": 1}
		}
	case "object":
		out["type"] = "object"
		out["additionalProperties"] = false
		props := map[string]any{}
		var req []string
		for _, c := range f.Fields {
			props[c.Key] = schemaOf(c)
			if c.Required {
				req = append(req, c.Key)
			}
		}
		out["properties"] = props
		if len(req) > 0 {
			slices.Sort(req)
			out["required"] = req
		}
		if len(f.OneOf) > 0 {
			var one []any
			for _, keys := range f.OneOf {
				one = append(one, map[string]any{"required": keys})
			}
			out["oneOf"] = one
		}
	}
	return out
}
