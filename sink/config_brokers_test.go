package sink_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/compensa/compensa/sink"
)

func TestParseRabbitMQAndRedis(t *testing.T) {
	t.Parallel()
	cfg, err := sink.LoadFile("testdata/sinks.yaml")
	if err != nil {
		t.Fatal(err)
	}
	r, s := cfg.Sinks[3], cfg.Sinks[4]
	if r.Kind() != "rabbitmq" || r.RabbitMQ.URL != "amqp://relay@127.0.0.1:5672/" || r.RabbitMQ.PasswordEnv != "RELAY_RABBITMQ_PASSWORD" ||
		r.RabbitMQ.Exchange != "outbox" || r.RabbitMQ.Timeout != 10*time.Second || r.RabbitMQ.MaxMessageBytes != sink.DefaultRabbitMQMaxMessageBytes ||
		r.RabbitMQ.RoutingKey.Expand(&sink.Event{AggregateType: "order", EventType: "placed"}, nil) != "outbox.order.placed" {
		t.Errorf("rabbit: %+v", r.RabbitMQ)
	}
	if s.Kind() != "redis" || s.Redis.URL != "redis://127.0.0.1:6379/0" || s.Redis.PasswordEnv != "RELAY_REDIS_PASSWORD" ||
		s.Redis.MaxLen != 1000000 || s.Redis.DedupeWindow != 24*time.Hour ||
		s.Redis.Stream.Expand(&sink.Event{AggregateType: "order"}, nil) != "outbox.order" {
		t.Errorf("streams: %+v", s.Redis)
	}
	cfg, err = sink.Parse("d.yaml", []byte("sinks:\n  - name: r\n    rabbitmq: {url: 'amqps://h', exchange: x}\n  - name: s\n    redis: {url: 'rediss://h:6380'}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if d := cfg.Sinks[1].Redis; d.MaxLen != 0 || d.DedupeWindow != sink.DefaultDedupeWindow || d.Stream.String() != "outbox.{aggregate_type}" {
		t.Errorf("redis defaults: %+v", d)
	}
	if d := cfg.Sinks[0].RabbitMQ; d.RoutingKey.String() != "outbox.{aggregate_type}.{event_type}" || d.PasswordEnv != "" {
		t.Errorf("rabbitmq defaults: %+v", d)
	}
}

// Every bad value of the two kinds is reported at once, each at its
// position with a fix; a password in a URL is refused and never quoted.
func TestRabbitMQAndRedisProblems(t *testing.T) {
	t.Parallel()
	in := `sinks:
  - name: r
    rabbitmq:
      url: amqp://relay:hunter2@h:5672/
      password_env: hunter2!
      exchange: "out box"
      routing_key: "outbox.{aggregate}.#"
      timeout: 1h
      mandatory: false
  - name: r2
    rabbitmq: { url: "http://h", routing_key: "a b.{event_type}" }
  - name: s
    redis:
      url: redis://:hunter2@h:6379
      stream: "{aggregate_type}"
      maxlen: -1
      dedupe_window: 10s
  - name: both
    redis: { url: "redis://h" }
    rabbitmq: { url: "amqp://h", exchange: x }
`
	_, err := sink.Parse("b.yaml", []byte(in))
	if !errors.Is(err, sink.ErrConfig) {
		t.Fatalf("err = %v", err)
	}
	msg := err.Error()
	for _, want := range []string{
		`b.yaml:4:12: rabbitmq.url carries a password (the URL is not shown); keep the user in the URL`,
		`b.yaml:5:21: rabbitmq.password_env is not an environment variable name`,
		`b.yaml:6:17: rabbitmq.exchange "out box" is not an exchange name`,
		`b.yaml:7:20: rabbitmq.routing_key "outbox.{aggregate}.#" uses unknown placeholder {aggregate}`,
		`b.yaml:8:16: rabbitmq.timeout 1h0m0s is out of range`,
		`b.yaml:9:7: unknown key "mandatory" in rabbitmq`,
		`b.yaml:11:15: rabbitmq has no "exchange"`,
		`b.yaml:11:22: rabbitmq.url "http://h" is not an AMQP URL (amqp:// or amqps://)`,
		`b.yaml:11:47: rabbitmq.routing_key "a b.{event_type}" holds a space or a wildcard`,
		`b.yaml:14:12: redis.url carries a password (the URL is not shown)`,
		`b.yaml:15:15: redis.stream "{aggregate_type}" starts with a placeholder`,
		`b.yaml:16:15: redis.maxlen "-1" is not a whole number between 0 and`,
		`b.yaml:17:22: redis.dedupe_window 10s is out of range`,
		`b.yaml:18:5: sink "both" has rabbitmq and redis`,
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("missing %q in:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, "hunter2") {
		t.Errorf("a password is quoted in:\n%s", msg)
	}
}
