package sink

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"cel.dev/cel-go/common/types"
	"go.yaml.in/yaml/v3"

	"github.com/compensa/compensa/internal/expr"
	"github.com/compensa/compensa/internal/suggest"
)

// DefaultMaxParked is a sink's cap on parked events when max_parked is not set.
const DefaultMaxParked = 1_000_000

// DefaultWebhookConcurrency is how many aggregates a webhook sink delivers
// at once when webhook.concurrency is not set.
const DefaultWebhookConcurrency = 16

// MinDuplicateWindow is the shortest JetStream duplicate window a NATS sink
// accepts: a replay after a crash must still be recognised by Nats-Msg-Id.
const MinDuplicateWindow = 2 * time.Minute

// Config is a parsed and validated sinks file.
type Config struct {
	// File is the path the config was read from (for messages).
	File  string
	Sinks []Spec
}

// Spec is one sink as configured. Exactly one of Webhook, NATS, Kafka,
// RabbitMQ and Redis is set.
type Spec struct {
	Name  string
	Match Match
	// MaxParked caps the events parked for this sink; at the cap the stream
	// waits (backpressure) instead of dropping.
	MaxParked int
	Webhook   *WebhookSpec
	NATS      *NATSSpec
	Kafka     *KafkaSpec
	// Format is how an event is encoded: FormatEnvelope (the default, the
	// row as JSON or its payload as the body), FormatCloudEvents (binary
	// content mode) or FormatCloudEventsStructured.
	Format string
	// Source is the CloudEvents source attribute; empty until
	// Config.SetDefaultSource names the database and outbox table.
	Source string
	// Filter, when set, selects the events this sink delivers (an
	// expression giving true or false); the others are dropped for this
	// sink and counted, never parked.
	Filter *Expr
	// Transform, when set, is the delivered payload (the envelope's
	// payload, CloudEvents data), rendered from each event.
	Transform *Value
	RabbitMQ  *RabbitMQSpec
	Redis     *RedisSpec
	// Line is where the sink is declared, for messages.
	Line int
}

// The formats a sink encodes events in (Spec.Format).
const (
	FormatEnvelope              = "envelope"
	FormatCloudEvents           = "cloudevents"
	FormatCloudEventsStructured = "cloudevents-structured"
)

// SetDefaultSource gives every sink without a source: the CloudEvents
// source naming the relay's database and outbox table (DefaultSource).
func (c *Config) SetDefaultSource(source string) {
	for i := range c.Sinks {
		if c.Sinks[i].Source == "" {
			c.Sinks[i].Source = source
		}
	}
}

// DefaultSource is a sink's CloudEvents source when its file sets none:
// /compensa/<database>/<schema>.<table>, each part path-escaped. Consumers
// tell relays of different databases apart by it, and it stays the same
// across restarts and replicas, as a source must for (source, id) to stay
// unique.
func DefaultSource(database, schema, table string) string {
	return "/compensa/" + url.PathEscape(cmpOr(database, "postgres")) + "/" + url.PathEscape(cmpOr(schema, "public")) + "." + url.PathEscape(table)
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// Kind names the sink's broker: "webhook", "nats", "kafka", "rabbitmq" or
// "redis".
func (s *Spec) Kind() string {
	switch {
	case s.Webhook != nil:
		return "webhook"
	case s.NATS != nil:
		return "nats"
	case s.RabbitMQ != nil:
		return "rabbitmq"
	case s.Redis != nil:
		return "redis"
	default:
		return "kafka"
	}
}

// WebhookSpec configures an HTTP endpoint.
type WebhookSpec struct {
	URL string
	// SecretEnv names the environment variable holding the whsec_ secret
	// that signs each request (Standard Webhooks). Empty: unsigned.
	SecretEnv string
	Timeout   time.Duration
	// Concurrency is how many aggregates are delivered at once.
	Concurrency int
	// LegacyUnderscoreHeaders sends the metadata headers under their former
	// names (Event_type, Tenant_id, ...) instead of Event-Type, Tenant-Id,
	// ...; deprecated: it is removed in the next release.
	LegacyUnderscoreHeaders bool
}

// NATSSpec configures a JetStream stream.
type NATSSpec struct {
	URL             string
	Stream          string
	Subject         Template
	DuplicateWindow time.Duration
	Timeout         time.Duration
}

// KafkaSpec configures a Kafka topic.
type KafkaSpec struct {
	Brokers []string
	Topic   Template
	Timeout time.Duration
	// MaxMessageBytes is the largest record batch the topics accept (their
	// max.message.bytes); 0 means Kafka's default, 1,000,012. A larger
	// record is parked with the reason and never sent.
	MaxMessageBytes int
}

// DefaultRabbitMQMaxMessageBytes is RabbitMQ's default max_message_size.
const DefaultRabbitMQMaxMessageBytes = 128 << 20

// RabbitMQSpec configures a RabbitMQ exchange. The relay declares nothing:
// the operator declares the exchange and binds the queues, and a message
// no queue takes is returned by the broker (mandatory) and parked.
type RabbitMQSpec struct {
	// URL is amqp:// or amqps:// with a user but never a password.
	URL string
	// PasswordEnv names the environment variable holding the password.
	PasswordEnv string
	Exchange    string
	RoutingKey  Template
	Timeout     time.Duration
	// MaxMessageBytes is the broker's max_message_size: a larger message is
	// refused for its event before publishing (the broker would close the
	// channel, which would look like an outage).
	MaxMessageBytes int
}

// DefaultDedupeWindow is how long a Redis sink remembers an added id when
// redis.dedupe_window is not set.
const DefaultDedupeWindow = 24 * time.Hour

// RedisSpec configures a Redis stream.
type RedisSpec struct {
	// URL is redis:// or rediss:// with a user but never a password.
	URL         string
	PasswordEnv string
	Stream      Template
	// MaxLen trims each stream approximately (MAXLEN ~); 0: no trimming.
	MaxLen int
	// DedupeWindow is how long an added outbox id is remembered, so that a
	// replay within it adds no second entry.
	DedupeWindow time.Duration
	Timeout      time.Duration
}

// Problem is one mistake in a sinks file.
type Problem struct {
	File      string
	Line, Col int
	What, Fix string
}

func (p Problem) String() string {
	return fmt.Sprintf("%s:%d:%d: %s; %s", p.File, p.Line, p.Col, p.What, p.Fix)
}

// ConfigError lists every problem of a sinks file, one per line.
type ConfigError struct{ Problems []Problem }

func (e *ConfigError) Error() string {
	lines := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		lines[i] = p.String()
	}
	return strings.Join(lines, "\n")
}

// ErrConfig is what every ConfigError matches with errors.Is.
var ErrConfig = errors.New("invalid sinks file")

// Is makes errors.Is(err, ErrConfig) true.
func (e *ConfigError) Is(target error) bool { return target == ErrConfig }

// LoadFile reads and validates a sinks file.
func LoadFile(file string) (*Config, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("read sinks file: %w", err)
	}
	return Parse(file, data)
}

// Parse validates a sinks file's contents; file names it in messages. Every
// problem is reported at once (a *ConfigError).
func Parse(file string, data []byte) (*Config, error) {
	p := &parser{file: file}
	cfg := &Config{File: file}
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil {
		line, col := 1, 1
		var te *yaml.TypeError
		msg := err.Error()
		if m := yamlLine.FindStringSubmatch(msg); m != nil {
			line, _ = strconv.Atoi(m[1])
		}
		if !errors.As(err, &te) && msg == "EOF" {
			msg = "the file is empty"
		}
		p.add(line, col, "not valid YAML: "+strings.TrimPrefix(msg, "yaml: "), "fix the syntax (indentation with spaces, quotes around values holding ': ')")
		return nil, p.err()
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	if !p.expect(root, yaml.MappingNode, "the file", "start with 'sinks:' and a list of sinks") {
		return nil, p.err()
	}
	fields := p.fields(root, fileSpec, "the file")
	list, ok := fields["sinks"]
	if !ok {
		p.add(root.Line, root.Column, "no 'sinks' list", "add 'sinks:' with at least one sink (see sink/sinks.schema.json)")
		return nil, p.err()
	}
	if p.expect(list, yaml.SequenceNode, "sinks", "write a list: each sink starts with '- name: …'") {
		if len(list.Content) == 0 {
			p.add(list.Line, list.Column, "sinks is empty", "declare at least one sink, or run without --sinks")
		}
		seen := map[string]int{}
		for _, n := range list.Content {
			s, ok := p.sink(n)
			if prev, dup := seen[s.Name]; dup && s.Name != "" {
				p.add(n.Line, n.Column, fmt.Sprintf("sink name %q is declared twice (first at line %d)", s.Name, prev), "give each sink a unique name")
				continue
			}
			if s.Name != "" {
				seen[s.Name] = n.Line
			}
			if ok {
				cfg.Sinks = append(cfg.Sinks, s)
			}
		}
	}
	if err := p.err(); err != nil {
		return nil, err
	}
	return cfg, nil
}

var (
	yamlLine   = regexp.MustCompile(`line (\d+)`)
	sinkName   = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)
	envName    = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	streamName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,255}$`)
)

type parser struct {
	file     string
	problems []Problem
}

func (p *parser) add(line, col int, what, fix string) {
	p.problems = append(p.problems, Problem{File: p.file, Line: line, Col: col, What: what, Fix: fix})
}

func (p *parser) err() error {
	if len(p.problems) == 0 {
		return nil
	}
	return &ConfigError{Problems: p.problems}
}

func kindName(k yaml.Kind) string {
	switch k {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		return "a value"
	case yaml.AliasNode:
		return "an alias"
	}
	return "nothing"
}

func (p *parser) expect(n *yaml.Node, k yaml.Kind, what, fix string) bool {
	if n.Kind == yaml.AliasNode {
		p.add(n.Line, n.Column, what+" is a YAML alias", "write the value out: aliases are not supported in sinks files")
		return false
	}
	if n.Kind != k {
		p.add(n.Line, n.Column, fmt.Sprintf("%s is %s, want %s", what, kindName(n.Kind), kindName(k)), fix)
		return false
	}
	return true
}

// fields checks a mapping's keys against spec (unknown and duplicate keys)
// and returns the value nodes by key.
func (p *parser) fields(m *yaml.Node, spec *fieldSpec, where string) map[string]*yaml.Node {
	out := map[string]*yaml.Node{}
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			p.add(k.Line, k.Column, "a key of "+where+" is not a plain name", "write keys as plain words")
			continue
		}
		f := spec.field(k.Value)
		if f == nil {
			p.add(k.Line, k.Column, fmt.Sprintf("unknown key %q in %s", k.Value, where), "use one of: "+strings.Join(spec.keys(), ", ")+didYouMean(k.Value, spec.keys()))
			continue
		}
		if _, dup := out[k.Value]; dup {
			p.add(k.Line, k.Column, fmt.Sprintf("key %q appears twice in %s", k.Value, where), "keep one")
			continue
		}
		out[k.Value] = v
	}
	for _, f := range spec.Fields {
		if f.Required {
			if _, ok := out[f.Key]; !ok {
				p.add(m.Line, m.Column, fmt.Sprintf("%s has no %q", where, f.Key), "add "+f.Key+": "+f.Example)
			}
		}
	}
	return out
}

// didYouMean names a known key close to a misspelt one.
func didYouMean(got string, keys []string) string {
	best, bestD := "", 3
	for _, k := range keys {
		if d := suggest.Distance(got, k); d < bestD {
			best, bestD = k, d
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

func (p *parser) str(n *yaml.Node, what string) (string, bool) {
	if !p.expect(n, yaml.ScalarNode, what, "write a single value") {
		return "", false
	}
	if n.Tag == "!!null" {
		p.add(n.Line, n.Column, what+" is empty", "give it a value")
		return "", false
	}
	return n.Value, true
}

func (p *parser) strs(n *yaml.Node, what, fix string) []string {
	if !p.expect(n, yaml.SequenceNode, what, fix) {
		return nil
	}
	var out []string
	for _, c := range n.Content {
		if s, ok := p.str(c, "an entry of "+what); ok {
			out = append(out, s)
		}
	}
	return out
}

func (p *parser) duration(n *yaml.Node, what string, lo, hi time.Duration) (time.Duration, bool) {
	s, ok := p.str(n, what)
	if !ok {
		return 0, false
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		p.add(n.Line, n.Column, fmt.Sprintf("%s %q is not a duration", what, s), "write a number with a unit, e.g. 10s or 2m")
		return 0, false
	}
	if d < lo || d > hi {
		p.add(n.Line, n.Column, fmt.Sprintf("%s %s is out of range", what, d), fmt.Sprintf("choose between %s and %s", lo, hi))
		return 0, false
	}
	return d, true
}

func (p *parser) integer(n *yaml.Node, what string, lo, hi int) (int, bool) {
	s, ok := p.str(n, what)
	if !ok {
		return 0, false
	}
	v, err := strconv.Atoi(strings.ReplaceAll(s, "_", ""))
	if err != nil || v < lo || v > hi {
		p.add(n.Line, n.Column, fmt.Sprintf("%s %q is not a whole number between %d and %d", what, s, lo, hi), "write a whole number in that range")
		return 0, false
	}
	return v, true
}

func (p *parser) boolean(n *yaml.Node, what string) (bool, bool) {
	s, ok := p.str(n, what)
	if !ok {
		return false, false
	}
	switch s {
	case "true":
		return true, true
	case "false":
		return false, true
	}
	p.add(n.Line, n.Column, fmt.Sprintf("%s %q is not true or false", what, s), "write true or false")
	return false, false
}

// Warning is what a valid sinks file still gets wrong, for one sink.
type Warning struct {
	Sink string
	Line int
	Msg  string
}

func (w Warning) String() string { return fmt.Sprintf("sink %q: %s", w.Sink, w.Msg) }

// Warnings are what a valid file still gets wrong: a webhook sink without
// secret_env, whose requests go out unsigned, so that its endpoint cannot
// tell them from anyone's; one with legacy_underscore_headers, which goes
// away in the next release.
func (c *Config) Warnings() []Warning {
	var out []Warning
	for _, s := range c.Sinks {
		if s.Webhook == nil {
			continue
		}
		if s.Webhook.SecretEnv == "" {
			out = append(out, Warning{s.Name, s.Line, "webhook without secret_env sends unsigned requests (no webhook-signature); set secret_env to the variable holding its whsec_ secret"})
		}
		if s.Webhook.LegacyUnderscoreHeaders {
			out = append(out, Warning{s.Name, s.Line, "legacy_underscore_headers sends Event_type, Tenant_id, ..., which proxies drop, and is removed in the next release; move the receiver to Event-Type, Tenant-Id, ..."})
		}
	}
	return out
}

func (p *parser) sink(n *yaml.Node) (Spec, bool) {
	s := Spec{Line: n.Line, MaxParked: DefaultMaxParked}
	if !p.expect(n, yaml.MappingNode, "a sink", "write '- name: …' followed by one of "+destinations) {
		return s, false
	}
	before := len(p.problems)
	f := p.fields(n, sinkSpec, "a sink")
	where := "a sink"
	if v, ok := f["name"]; ok {
		if name, ok := p.str(v, "name"); ok {
			if !sinkName.MatchString(name) {
				p.add(v.Line, v.Column, fmt.Sprintf("sink name %q is not allowed", name), "use 1-63 lower-case letters, digits, '-' or '_', starting with a letter or digit")
			}
			s.Name = name
			where = fmt.Sprintf("sink %q", name)
		}
	}
	if v, ok := f["match"]; ok && p.expect(v, yaml.MappingNode, "match", "write match: { event_types: [\"order.*\"] }") {
		mf := p.fields(v, matchSpec, "match")
		if g, ok := mf["event_types"]; ok {
			s.Match.EventTypes = p.globs(g, "match.event_types")
		}
		if g, ok := mf["aggregate_types"]; ok {
			s.Match.AggregateTypes = p.globs(g, "match.aggregate_types")
		}
	}
	if v, ok := f["max_parked"]; ok {
		if m, ok := p.integer(v, "max_parked", 1, 1<<40); ok {
			s.MaxParked = m
		}
	}
	s.Format = FormatEnvelope
	if v, ok := f["format"]; ok {
		if fm, ok := p.str(v, "format"); ok {
			switch fm {
			case FormatEnvelope, FormatCloudEvents, FormatCloudEventsStructured:
				s.Format = fm
			default:
				p.add(v.Line, v.Column, fmt.Sprintf("format %q is not known", fm), "write envelope (the default), cloudevents (binary content mode) or cloudevents-structured"+didYouMean(fm, []string{FormatEnvelope, FormatCloudEvents, FormatCloudEventsStructured}))
			}
		}
	}
	if v, ok := f["source"]; ok {
		if src, ok := p.str(v, "source"); ok {
			if u, err := url.Parse(src); err != nil || strings.ContainsFunc(src, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
				p.add(v.Line, v.Column, fmt.Sprintf("source %q is not a URI reference", src), "write e.g. /billing/orders or urn:example:orders")
			} else {
				s.Source = u.String()
			}
			if s.Format == FormatEnvelope {
				p.add(v.Line, v.Column, "source is set but the sink sends the envelope, which has no source", "add format: cloudevents (or cloudevents-structured), or remove source")
			}
		}
	}
	if v, ok := f["filter"]; ok {
		s.Filter = p.filter(v)
	}
	if v, ok := f["transform"]; ok {
		s.Transform = p.value(v, "transform")
	}
	var kinds []string
	for _, k := range []string{"webhook", "nats", "kafka", "rabbitmq", "redis"} {
		if v, ok := f[k]; ok {
			kinds = append(kinds, k)
			if !p.expect(v, yaml.MappingNode, k, "write its settings indented below "+k+":") {
				continue
			}
			switch k {
			case "webhook":
				s.Webhook = p.webhook(v)
			case "nats":
				s.NATS = p.nats(v)
			case "kafka":
				s.Kafka = p.kafka(v)
			case "rabbitmq":
				s.RabbitMQ = p.rabbitmq(v)
			case "redis":
				s.Redis = p.redis(v)
			}
		}
	}
	switch len(kinds) {
	case 0:
		p.add(n.Line, n.Column, where+" names no destination", "add exactly one of "+destinations)
	case 1:
	default:
		p.add(n.Line, n.Column, where+" has "+strings.Join(kinds, " and "), "declare one destination per sink: split it into several sinks")
	}
	if v, ok := f["format"]; ok && s.Format != FormatEnvelope && (s.RabbitMQ != nil || s.Redis != nil) {
		// CloudEvents bindings exist for HTTP, NATS and Kafka; these sinks
		// send the envelope with the event's metadata as their own fields.
		p.add(v.Line, v.Column, fmt.Sprintf("format %s is for webhook, nats and kafka sinks; %s sends the envelope", s.Format, s.Kind()), "remove format from this sink")
	}
	return s, len(p.problems) == before
}

// filter compiles a sink's filter: one ${ … } expression giving a bool.
func (p *parser) filter(n *yaml.Node) *Expr {
	text, ok := p.str(n, "filter")
	if !ok {
		return nil
	}
	t := strings.TrimSpace(text)
	if !strings.HasPrefix(t, "${") || expr.ClosingBrace(t[2:]) != len(t)-3 {
		p.add(n.Line, n.Column, "filter is not one ${ … } expression", `write e.g. filter: "${ event.payload.amount > 100 }"`)
		return nil
	}
	parts := p.splitExprs(n, "filter")
	if len(parts) != 1 || parts[0].x == nil {
		return nil
	}
	x := parts[0].x
	if x.typ != nil && x.typ.Kind() != types.BoolKind && x.typ.Kind() != types.DynKind && x.typ.Kind() != types.AnyKind {
		p.add(n.Line, n.Column, fmt.Sprintf("filter %s gives %s, not true or false", x, x.typ), "compare, e.g. event.payload.kind == \"refund\"")
		return nil
	}
	return x
}

// destinations lists the destination keys, for messages.
const destinations = "webhook:, nats:, kafka:, rabbitmq:, redis:"

func (p *parser) globs(n *yaml.Node, what string) []string {
	gs := p.strs(n, what, `write a list of globs, e.g. ["payment.*"]`)
	for i, g := range gs {
		if _, err := path.Match(g, ""); err != nil {
			c := n.Content[i]
			p.add(c.Line, c.Column, fmt.Sprintf("glob %q in %s is malformed", g, what), "use *, ? and [a-z] with balanced brackets")
		}
	}
	return gs
}

func (p *parser) webhook(n *yaml.Node) *WebhookSpec {
	w := &WebhookSpec{Timeout: 10 * time.Second, Concurrency: DefaultWebhookConcurrency}
	f := p.fields(n, webhookSpec, "webhook")
	if v, ok := f["url"]; ok {
		if s, ok := p.str(v, "webhook.url"); ok {
			u, err := url.Parse(s)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				p.add(v.Line, v.Column, fmt.Sprintf("webhook.url %q is not an http(s) URL", s), "write e.g. https://service.example/events")
			} else if u.User != nil {
				p.add(v.Line, v.Column, "webhook.url carries a user or password", "sign requests with secret_env instead of credentials in the URL")
			}
			w.URL = s
		}
	}
	if v, ok := f["secret_env"]; ok {
		if s, ok := p.str(v, "webhook.secret_env"); ok {
			if !envName.MatchString(s) {
				p.add(v.Line, v.Column, "webhook.secret_env is not an environment variable name (its value is not shown: it may be the secret)", "name the variable (e.g. RELAY_WEBHOOK_SECRET), not the secret itself")
			}
			w.SecretEnv = s
		}
	}
	if v, ok := f["timeout"]; ok {
		if d, ok := p.duration(v, "webhook.timeout", 100*time.Millisecond, 5*time.Minute); ok {
			w.Timeout = d
		}
	}
	if v, ok := f["concurrency"]; ok {
		if c, ok := p.integer(v, "webhook.concurrency", 1, 1024); ok {
			w.Concurrency = c
		}
	}
	if v, ok := f["legacy_underscore_headers"]; ok {
		if b, ok := p.boolean(v, "webhook.legacy_underscore_headers"); ok {
			w.LegacyUnderscoreHeaders = b
		}
	}
	return w
}

func (p *parser) nats(n *yaml.Node) *NATSSpec {
	s := &NATSSpec{Subject: MustTemplate("outbox.{aggregate_type}.{raw(event_type)}"), DuplicateWindow: MinDuplicateWindow, Timeout: 10 * time.Second}
	f := p.fields(n, natsSpec, "nats")
	if v, ok := f["url"]; ok {
		if u, ok := p.str(v, "nats.url"); ok {
			for _, one := range strings.Split(u, ",") {
				pu, err := url.Parse(strings.TrimSpace(one))
				if err != nil || pu.Host == "" || !slices.Contains([]string{"nats", "tls", "ws", "wss"}, pu.Scheme) {
					p.add(v.Line, v.Column, fmt.Sprintf("nats.url %q is not a NATS URL", one), "write e.g. nats://127.0.0.1:4222 (several separated by commas)")
				}
			}
			s.URL = u
		}
	}
	if v, ok := f["stream"]; ok {
		if st, ok := p.str(v, "nats.stream"); ok {
			if !streamName.MatchString(st) {
				p.add(v.Line, v.Column, fmt.Sprintf("nats.stream %q is not a JetStream stream name", st), "use letters, digits, '-' and '_' only")
			}
			s.Stream = st
		}
	}
	if v, ok := f["subject"]; ok {
		if st, ok := p.str(v, "nats.subject"); ok {
			t, err := ParseTemplate(st)
			switch {
			case err != nil:
				p.add(v.Line, v.Column, "nats.subject "+err.Error(), "write e.g. outbox.{aggregate_type}.{event_type}")
			case strings.ContainsAny(t.literalText(), " \t*>"):
				p.add(v.Line, v.Column, fmt.Sprintf("nats.subject %q holds a space or a wildcard", st), "a publish subject is literal tokens and placeholders separated by dots")
			case !t.Literal() && !strings.HasSuffix(t.Prefix(), ".") || strings.HasPrefix(st, "."):
				p.add(v.Line, v.Column, fmt.Sprintf("nats.subject %q must start with a literal token and a dot before any placeholder", st), "write e.g. outbox.{aggregate_type}.{event_type}: the stream listens on outbox.>")
			default:
				s.Subject = t
			}
		}
	}
	if v, ok := f["duplicate_window"]; ok {
		if d, ok := p.duration(v, "nats.duplicate_window", MinDuplicateWindow, 7*24*time.Hour); ok {
			s.DuplicateWindow = d
		}
	}
	if v, ok := f["timeout"]; ok {
		if d, ok := p.duration(v, "nats.timeout", 100*time.Millisecond, 5*time.Minute); ok {
			s.Timeout = d
		}
	}
	return s
}

func (p *parser) kafka(n *yaml.Node) *KafkaSpec {
	k := &KafkaSpec{Topic: MustTemplate("outbox.event.{aggregate_type}"), Timeout: 10 * time.Second}
	f := p.fields(n, kafkaSpec, "kafka")
	if v, ok := f["brokers"]; ok {
		k.Brokers = p.strs(v, "kafka.brokers", `write a list, e.g. ["127.0.0.1:9092"]`)
		if v.Kind == yaml.SequenceNode && len(v.Content) == 0 {
			p.add(v.Line, v.Column, "kafka.brokers is empty", `list at least one broker, e.g. ["127.0.0.1:9092"]`)
		}
		for i, b := range k.Brokers {
			if _, port, err := net.SplitHostPort(b); err != nil || port == "" {
				c := v.Content[i]
				p.add(c.Line, c.Column, fmt.Sprintf("kafka broker %q is not host:port", b), "write e.g. 127.0.0.1:9092")
			}
		}
	}
	if v, ok := f["topic"]; ok {
		if st, ok := p.str(v, "kafka.topic"); ok {
			t, err := ParseTemplate(st)
			if err != nil {
				p.add(v.Line, v.Column, "kafka.topic "+err.Error(), "write e.g. outbox.event.{aggregate_type}")
			} else if bad := strings.Map(func(r rune) rune {
				if r < 128 && (r == '.' || r == '_' || r == '-' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
					return -1
				}
				return r
			}, t.Expand(&Event{}, nil)); bad != "" {
				p.add(v.Line, v.Column, fmt.Sprintf("kafka.topic %q holds characters Kafka refuses (%q)", st, bad), "use letters, digits, '.', '_' and '-'")
			} else {
				k.Topic = t
			}
		}
	}
	if v, ok := f["timeout"]; ok {
		if d, ok := p.duration(v, "kafka.timeout", 100*time.Millisecond, 5*time.Minute); ok {
			k.Timeout = d
		}
	}
	if v, ok := f["max_message_bytes"]; ok {
		// franz-go's bounds for ProducerBatchMaxBytes.
		if m, ok := p.integer(v, "kafka.max_message_bytes", 512, 1<<30); ok {
			k.MaxMessageBytes = m
		}
	}
	return k
}
