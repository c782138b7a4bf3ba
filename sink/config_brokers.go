package sink

import (
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// brokerURL checks a RabbitMQ or Redis URL: one of schemes, a host, and no
// password (it comes from password_env). The URL is quoted in a message
// only when it holds no user information at all, since what looks like a
// user may be a secret pasted in the wrong place.
func (p *parser) brokerURL(v *yaml.Node, what, kind string, schemes []string, example string) string {
	s, ok := p.str(v, what)
	if !ok {
		return ""
	}
	u, err := url.Parse(s)
	shown := fmt.Sprintf(" %q", s)
	if err != nil || u.User != nil {
		shown = ""
	}
	switch {
	case err != nil || u.Host == "" || !slices.Contains(schemes, u.Scheme):
		p.add(v.Line, v.Column, fmt.Sprintf("%s%s is not %s URL (%s://)", what, shown, kind, strings.Join(schemes, ":// or ")), "write e.g. "+example)
	default:
		if _, has := u.User.Password(); has {
			p.add(v.Line, v.Column, what+" carries a password (the URL is not shown)", "keep the user in the URL and put the password in an environment variable named by password_env")
		}
	}
	return s
}

var exchangeName = regexp.MustCompile(`^[A-Za-z0-9_.:-]{1,255}$`)

func (p *parser) envVar(v *yaml.Node, what string) string {
	s, ok := p.str(v, what)
	if !ok {
		return ""
	}
	if !envName.MatchString(s) {
		p.add(v.Line, v.Column, what+" is not an environment variable name (its value is not shown: it may be the secret)", "name the variable (e.g. RELAY_BROKER_PASSWORD), not the password itself")
	}
	return s
}

func (p *parser) rabbitmq(n *yaml.Node) *RabbitMQSpec {
	r := &RabbitMQSpec{RoutingKey: MustTemplate("outbox.{aggregate_type}.{event_type}"), Timeout: 10 * time.Second,
		MaxMessageBytes: DefaultRabbitMQMaxMessageBytes}
	f := p.fields(n, rabbitSpec, "rabbitmq")
	if v, ok := f["url"]; ok {
		r.URL = p.brokerURL(v, "rabbitmq.url", "an AMQP", []string{"amqp", "amqps"}, "amqp://relay@127.0.0.1:5672/ (amqps:// for TLS)")
	}
	if v, ok := f["password_env"]; ok {
		r.PasswordEnv = p.envVar(v, "rabbitmq.password_env")
	}
	if v, ok := f["exchange"]; ok {
		if s, ok := p.str(v, "rabbitmq.exchange"); ok {
			if !exchangeName.MatchString(s) {
				p.add(v.Line, v.Column, fmt.Sprintf("rabbitmq.exchange %q is not an exchange name", s), "use letters, digits, '-', '_', '.' and ':' (at most 255)")
			}
			r.Exchange = s
		}
	}
	if v, ok := f["routing_key"]; ok {
		if s, ok := p.str(v, "rabbitmq.routing_key"); ok {
			t, err := ParseTemplate(s)
			switch {
			case err != nil:
				p.add(v.Line, v.Column, "rabbitmq.routing_key "+err.Error(), "write e.g. outbox.{aggregate_type}.{event_type}")
			case strings.ContainsAny(t.Expand(&Event{}, nil), " \t\r\n*#"):
				p.add(v.Line, v.Column, fmt.Sprintf("rabbitmq.routing_key %q holds a space or a wildcard", s), "a routing key is literal words and placeholders separated by dots; '*' and '#' belong in the queues' binding keys")
			case len(t.Expand(&Event{}, nil)) > 255:
				p.add(v.Line, v.Column, "rabbitmq.routing_key is longer than 255 bytes", "shorten it: AMQP routing keys are at most 255 bytes")
			default:
				r.RoutingKey = t
			}
		}
	}
	if v, ok := f["timeout"]; ok {
		if d, ok := p.duration(v, "rabbitmq.timeout", 100*time.Millisecond, 5*time.Minute); ok {
			r.Timeout = d
		}
	}
	if v, ok := f["max_message_bytes"]; ok {
		if m, ok := p.integer(v, "rabbitmq.max_message_bytes", 1024, 512<<20); ok {
			r.MaxMessageBytes = m
		}
	}
	return r
}

func (p *parser) redis(n *yaml.Node) *RedisSpec {
	r := &RedisSpec{Stream: MustTemplate("outbox.{aggregate_type}"), DedupeWindow: DefaultDedupeWindow, Timeout: 10 * time.Second}
	f := p.fields(n, redisSpec, "redis")
	if v, ok := f["url"]; ok {
		r.URL = p.brokerURL(v, "redis.url", "a Redis", []string{"redis", "rediss"}, "redis://127.0.0.1:6379/0 (rediss:// for TLS)")
	}
	if v, ok := f["password_env"]; ok {
		r.PasswordEnv = p.envVar(v, "redis.password_env")
	}
	if v, ok := f["stream"]; ok {
		if s, ok := p.str(v, "redis.stream"); ok {
			t, err := ParseTemplate(s)
			switch {
			case err != nil:
				p.add(v.Line, v.Column, "redis.stream "+err.Error(), "write e.g. outbox.{aggregate_type}")
			case !t.Literal() && t.Prefix() == "":
				p.add(v.Line, v.Column, fmt.Sprintf("redis.stream %q starts with a placeholder", s), "start with a literal part, e.g. outbox.{aggregate_type}, so that event data cannot name any key of the database")
			case strings.ContainsAny(s, " \t\r\n"):
				p.add(v.Line, v.Column, fmt.Sprintf("redis.stream %q holds a space", s), "write e.g. outbox.{aggregate_type}")
			default:
				r.Stream = t
			}
		}
	}
	if v, ok := f["maxlen"]; ok {
		if m, ok := p.integer(v, "redis.maxlen", 0, 1<<40); ok {
			r.MaxLen = m
		}
	}
	if v, ok := f["dedupe_window"]; ok {
		if d, ok := p.duration(v, "redis.dedupe_window", MinDuplicateWindow, 30*24*time.Hour); ok {
			r.DedupeWindow = d
		}
	}
	if v, ok := f["timeout"]; ok {
		if d, ok := p.duration(v, "redis.timeout", 100*time.Millisecond, 5*time.Minute); ok {
			r.Timeout = d
		}
	}
	return r
}
