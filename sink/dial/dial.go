// Package dial builds the sinks of a sinks file (sink.Config): a webhook,
// NATS, Kafka, RabbitMQ or Redis destination for each entry. It is the one place that knows
// every broker sub-package, so that sink/ itself imports none.
package dial

import (
	"errors"
	"fmt"
	"os"

	"github.com/compensa/compensa/sink"
	"github.com/compensa/compensa/sink/kafkasink"
	"github.com/compensa/compensa/sink/natssink"
	"github.com/compensa/compensa/sink/rabbitsink"
	"github.com/compensa/compensa/sink/redissink"
	"github.com/compensa/compensa/sink/webhook"
)

// Open connects every sink of cfg. Secrets come from the environment
// variables the file names; a missing or malformed one is an error that
// names the variable, never its value. On error nothing stays open.
func Open(cfg *sink.Config, getenv func(string) string) ([]sink.Destination, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	var out []sink.Destination
	var errs []error
	for _, s := range cfg.Sinks {
		d, err := open(s, getenv)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s:%d: sink %q: %w", cfg.File, s.Line, s.Name, err))
			continue
		}
		out = append(out, sink.Destination{Spec: s, Sink: sink.Shaped(s, d)})
	}
	if len(errs) > 0 {
		Close(out)
		return nil, errors.Join(errs...)
	}
	return out, nil
}

// Check refuses what Open would refuse before anything connects: a
// webhook's secret_env that is not set or does not hold a valid secret, a
// RabbitMQ or Redis password_env that is not set. It
// connects nothing, so a relay that does not stream (and opens no sink)
// checks a sinks file exactly as one that does.
func Check(cfg *sink.Config, getenv func(string) string) error {
	if getenv == nil {
		getenv = os.Getenv
	}
	var errs []error
	for _, s := range cfg.Sinks {
		if s.Webhook == nil && s.RabbitMQ == nil && s.Redis == nil {
			continue
		}
		sk, err := open(s, getenv)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s:%d: sink %q: %w", cfg.File, s.Line, s.Name, err))
			continue
		}
		sk.Close()
	}
	return errors.Join(errs...)
}

// Close closes every destination.
func Close(ds []sink.Destination) {
	for _, d := range ds {
		d.Sink.Close()
	}
}

func open(s sink.Spec, getenv func(string) string) (sink.Sink, error) {
	switch {
	case s.Webhook != nil:
		w := s.Webhook
		var secret string
		if w.SecretEnv != "" {
			if secret = getenv(w.SecretEnv); secret == "" {
				return nil, fmt.Errorf("environment variable %s (secret_env) is not set; export it with the endpoint's whsec_ secret", w.SecretEnv)
			}
		}
		sk, err := webhook.New(webhook.Config{URL: w.URL, Secret: secret, Timeout: w.Timeout, Concurrency: w.Concurrency,
			LegacyUnderscoreHeaders: w.LegacyUnderscoreHeaders, Format: s.Format, Source: s.Source})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", w.SecretEnv, err)
		}
		return sk, nil
	case s.NATS != nil:
		return natssink.New(natsConfig(s))
	case s.Kafka != nil:
		return kafkasink.New(kafkaConfig(s))
	case s.RabbitMQ != nil:
		r := s.RabbitMQ
		password, err := passwordFrom(r.PasswordEnv, getenv)
		if err != nil {
			return nil, err
		}
		return rabbitsink.New(rabbitsink.Config{URL: r.URL, Password: password, Exchange: r.Exchange, RoutingKey: r.RoutingKey,
			Timeout: r.Timeout, MaxMessageBytes: r.MaxMessageBytes, Name: "compensa-relay/" + s.Name})
	case s.Redis != nil:
		r := s.Redis
		password, err := passwordFrom(r.PasswordEnv, getenv)
		if err != nil {
			return nil, err
		}
		return redissink.New(redissink.Config{URL: r.URL, Password: password, Stream: r.Stream, MaxLen: r.MaxLen,
			DedupeWindow: r.DedupeWindow, Timeout: r.Timeout, Name: "compensa-relay/" + s.Name})
	}
	return nil, errors.New("no destination (webhook, nats, kafka, rabbitmq or redis)")
}

// passwordFrom reads the password a broker sink's password_env names; an
// unset variable is an error naming it, never a guess at its value.
func passwordFrom(env string, getenv func(string) string) (string, error) {
	if env == "" {
		return "", nil
	}
	p := getenv(env)
	if p == "" {
		return "", fmt.Errorf("environment variable %s (password_env) is not set; export it with the broker user's password", env)
	}
	return p, nil
}

func natsConfig(s sink.Spec) natssink.Config {
	n := s.NATS
	return natssink.Config{URL: n.URL, Stream: n.Stream, Subject: n.Subject, DuplicateWindow: n.DuplicateWindow,
		Timeout: n.Timeout, Name: "compensa-relay/" + s.Name, Format: s.Format, Source: s.Source}
}

func kafkaConfig(s sink.Spec) kafkasink.Config {
	k := s.Kafka
	return kafkasink.Config{Brokers: k.Brokers, Topic: k.Topic, Timeout: k.Timeout, MaxMessageBytes: k.MaxMessageBytes,
		Format: s.Format, Source: s.Source}
}
