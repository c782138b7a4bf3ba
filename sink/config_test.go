package sink_test

import (
	"bytes"
	"errors"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/compensa/compensa/sink"
)

func TestParseIssueExample(t *testing.T) {
	t.Parallel()
	cfg, err := sink.LoadFile("testdata/sinks.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Sinks) != 5 {
		t.Fatalf("got %d sinks", len(cfg.Sinks))
	}
	p, b, k := cfg.Sinks[0], cfg.Sinks[1], cfg.Sinks[2]
	if p.Kind() != "webhook" || p.Webhook.URL != "http://127.0.0.1:8099/events" || p.Webhook.SecretEnv != "RELAY_WEBHOOK_SECRET" ||
		p.Webhook.Timeout != 10*time.Second || p.MaxParked != sink.DefaultMaxParked {
		t.Errorf("payments: %+v %+v", p, p.Webhook)
	}
	if !p.Match.Selects(&sink.Event{EventType: "payment.captured", AggregateType: "order"}) ||
		p.Match.Selects(&sink.Event{EventType: "payment.captured", AggregateType: "invoice"}) ||
		p.Match.Selects(&sink.Event{EventType: "order.placed", AggregateType: "order"}) {
		t.Error("payments' match selects the wrong events")
	}
	if b.Kind() != "nats" || b.NATS.Stream != "OUTBOX" || b.NATS.DuplicateWindow < 2*time.Minute ||
		b.NATS.Subject.Expand(&sink.Event{AggregateType: "order", EventType: "placed"}, nil) != "outbox.order.placed" {
		t.Errorf("bus: %+v", b.NATS)
	}
	if !b.Match.Selects(&sink.Event{EventType: "anything"}) {
		t.Error("an omitted match must select everything")
	}
	if k.Kind() != "kafka" || k.Kafka.Brokers[0] != "127.0.0.1:9092" || k.Kafka.Topic.Expand(&sink.Event{AggregateType: "order"}, nil) != "outbox.event.order" ||
		k.Kafka.MaxMessageBytes != 0 {
		t.Errorf("kafka: %+v", k.Kafka)
	}
	cfg, err = sink.Parse("k.yaml", []byte("sinks:\n  - name: k\n    kafka: {brokers: ['h:9092'], max_message_bytes: 5242880}\n"))
	if err != nil || cfg.Sinks[0].Kafka.MaxMessageBytes != 5242880 {
		t.Fatalf("kafka.max_message_bytes: %v %+v", err, cfg)
	}
}

// TestEveryProblemAtOnce: each mistake is reported, with its position and
// a fix, in one error.
func TestEveryProblemAtOnce(t *testing.T) {
	t.Parallel()
	_, err := sink.LoadFile("testdata/bad.yaml")
	if !errors.Is(err, sink.ErrConfig) {
		t.Fatalf("err = %v, want a config error", err)
	}
	msg := err.Error()
	for _, want := range []string{
		`testdata/bad.yaml:2:11: sink name "Payments" is not allowed`,
		`testdata/bad.yaml:3:14: unknown key "event_typs" in match; use one of: event_types, aggregate_types (did you mean "event_types"?)`,
		`testdata/bad.yaml:3:59: glob "[order" in match.aggregate_types is malformed`,
		`testdata/bad.yaml:5:12: webhook.url "ftp://127.0.0.1/events" is not an http(s) URL`,
		`testdata/bad.yaml:6:19: webhook.secret_env is not an environment variable name (its value is not shown: it may be the secret)`,
		`testdata/bad.yaml:7:16: webhook.timeout "10" is not a duration`,
		`testdata/bad.yaml:10:7: nats has no "stream"`,
		`testdata/bad.yaml:11:16: nats.subject "outbox.{aggregate}.{event_type}" uses unknown placeholder {aggregate}`,
		`testdata/bad.yaml:12:25: nats.duplicate_window 30s is out of range`,
		`testdata/bad.yaml:14:17: kafka broker "127.0.0.1" is not host:port`,
		`testdata/bad.yaml:8:5: sink "bus" has nats and kafka`,
		`testdata/bad.yaml:17:16: kafka.brokers is empty`,
		`testdata/bad.yaml:18:14: kafka.topic "outbox event" holds characters Kafka refuses`,
		`testdata/bad.yaml:19:5: sink "nothing" names no destination; add exactly one of webhook:, nats:, kafka:`,
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("missing %q in:\n%s", want, msg)
		}
	}
	line := regexp.MustCompile(`^testdata/bad\.yaml:\d+:\d+: [^;]+; .+$`)
	for _, l := range strings.Split(msg, "\n") {
		if !line.MatchString(l) {
			t.Errorf("line not in file:line:col: what; how to fix form: %q", l)
		}
	}
}

func TestSyntaxAndShapeErrors(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ in, want string }{
		{"", "x.yaml:1:1: not valid YAML: the file is empty"},
		{"sinks: [", "x.yaml:1:1: not valid YAML"},
		{"- a\n- b\n", "x.yaml:1:1: the file is a list, want a mapping"},
		{"sink:\n  - name: a\n", `x.yaml:1:1: unknown key "sink" in the file; use one of: sinks (did you mean "sinks"?)`},
		{"sinks: []\n", "x.yaml:1:8: sinks is empty"},
		{"sinks:\n  - name: a\n    webhook: {url: 'http://h/x'}\n  - name: a\n    webhook: {url: 'http://h/y'}\n", `x.yaml:4:5: sink name "a" is declared twice (first at line 2)`},
		{"sinks:\n  - name: k\n    kafka: {brokers: ['h:9092'], max_message_bytes: 100}\n", `x.yaml:3:53: kafka.max_message_bytes "100" is not a whole number between 512 and 1073741824`},
	} {
		_, err := sink.Parse("x.yaml", []byte(c.in))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: err = %v, want %q", c.in, err, c.want)
		}
	}
}

// TestSchemaFileIsCurrent: sinks.schema.json is what Schema generates from
// the loader's own field specs.
func TestSchemaFileIsCurrent(t *testing.T) {
	t.Parallel()
	got, err := os.ReadFile("sinks.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, sink.Schema()) {
		t.Fatal("sink/sinks.schema.json is stale: regenerate it from sink.Schema()")
	}
}

func FuzzParse(f *testing.F) {
	for _, p := range []string{"testdata/sinks.yaml", "testdata/bad.yaml"} {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("sinks:\n  - &a {name: x}\n  - *a\n"))
	line := regexp.MustCompile(`^f\.yaml:\d+:\d+: [^\n]+; [^\n]+$`)
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := sink.Parse("f.yaml", data)
		if err != nil {
			var ce *sink.ConfigError
			if !errors.As(err, &ce) || len(ce.Problems) == 0 {
				t.Fatalf("error is not a ConfigError with problems: %v", err)
			}
			for _, p := range ce.Problems {
				if p.Line < 1 || p.Col < 1 || !line.MatchString(strings.ReplaceAll(p.String(), "\n", " ")) {
					t.Fatalf("malformed problem %q", p.String())
				}
			}
			return
		}
		if len(cfg.Sinks) == 0 {
			t.Fatal("a valid file with no sinks")
		}
		for _, s := range cfg.Sinks {
			n := 0
			for _, set := range []bool{s.Webhook != nil, s.NATS != nil, s.Kafka != nil, s.RabbitMQ != nil, s.Redis != nil} {
				if set {
					n++
				}
			}
			if n != 1 {
				t.Fatalf("sink %q without exactly one destination", s.Name)
			}
		}
	})
}

func TestLegacyUnderscoreHeadersOption(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]bool{"true": true, "false": false} {
		cfg, err := sink.Parse("s.yaml", []byte("sinks:\n  - name: h\n    webhook: {url: 'http://a/x', secret_env: S, legacy_underscore_headers: "+in+"}\n"))
		if err != nil || cfg.Sinks[0].Webhook.LegacyUnderscoreHeaders != want {
			t.Errorf("%s: %v %+v", in, err, cfg)
			continue
		}
		if got := len(cfg.Warnings()); got != map[bool]int{true: 1, false: 0}[want] {
			t.Errorf("%s: %d warnings %v", in, got, cfg.Warnings())
		}
	}
	if _, err := sink.Parse("s.yaml", []byte("sinks:\n  - name: h\n    webhook: {url: 'http://a/x', legacy_underscore_headers: yes}\n")); err == nil || !strings.Contains(err.Error(), "not true or false") {
		t.Errorf("yes: %v", err)
	}
}
