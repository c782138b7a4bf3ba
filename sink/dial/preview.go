package dial

import (
	"encoding/base64"
	"fmt"
	"os"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/compensa/compensa/sink"
	"github.com/compensa/compensa/sink/kafkasink"
	"github.com/compensa/compensa/sink/natssink"
	"github.com/compensa/compensa/sink/webhook"
)

// Outcomes of a Preview.
const (
	OutcomeDeliver     = "deliver"
	OutcomeNotSelected = "not selected"
	OutcomeFiltered    = "filtered out"
	OutcomeRefused     = "refused"
)

// Preview is what one sink would do with one event: deliver a message
// (its destination, headers and body) or not, and why.
type Preview struct {
	Sink    string `json:"sink"`
	Kind    string `json:"kind"`
	Outcome string `json:"outcome"`
	// Reason says why an event is not delivered: the match, or the
	// expression or destination rule that refuses it (it would be parked).
	Reason string `json:"reason,omitempty"`
	// Destination is the webhook URL, the NATS subject or the Kafka topic.
	Destination string `json:"destination,omitempty"`
	// Key is a Kafka record's key.
	Key     string          `json:"key,omitempty"`
	Headers []PreviewHeader `json:"headers,omitempty"`
	// Body is the body as text, or BodyBase64 when it is not UTF-8.
	Body       string `json:"body,omitempty"`
	BodyBase64 string `json:"body_base64,omitempty"`
	// Note is what the preview could not show as sent (an unset secret).
	Note string `json:"note,omitempty"`
}

// PreviewHeader is one header of a previewed message.
type PreviewHeader struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// PreviewAll says what every sink of cfg would deliver for ev, without a
// broker, an endpoint or a database: the same encoding, match, filter,
// transform and templates as the running relay. Webhook requests are
// signed when the sink's secret_env is set in getenv (the signature is
// shown, never the secret).
func PreviewAll(cfg *sink.Config, ev *sink.Event, getenv func(string) string) []Preview {
	if getenv == nil {
		getenv = os.Getenv
	}
	out := make([]Preview, 0, len(cfg.Sinks))
	for _, s := range cfg.Sinks {
		out = append(out, preview(s, ev, getenv))
	}
	return out
}

func preview(s sink.Spec, ev *sink.Event, getenv func(string) string) Preview {
	p := Preview{Sink: s.Name, Kind: s.Kind()}
	if !s.Match.Selects(ev) {
		p.Outcome, p.Reason = OutcomeNotSelected, "its match does not select the event"
		return p
	}
	shaped, keep, err := s.Shape(ev)
	switch {
	case err != nil:
		p.Outcome, p.Reason = OutcomeRefused, err.Error()+" (the relay parks the event for this sink with this reason)"
		return p
	case !keep:
		p.Outcome, p.Reason = OutcomeFiltered, "its filter "+s.Filter.String()+" rejects the event (dropped for this sink, counted, never parked)"
		return p
	}
	p.Outcome = OutcomeDeliver
	var body []byte
	switch {
	case s.Webhook != nil:
		w := s.Webhook
		var secret string
		if w.SecretEnv != "" {
			if secret = getenv(w.SecretEnv); secret == "" {
				p.Note = fmt.Sprintf("%s (secret_env) is not set: shown unsigned; the relay signs every request", w.SecretEnv)
			}
		}
		sk, err := webhook.New(webhook.Config{URL: w.URL, Secret: secret, Format: s.Format, Source: s.Source,
			LegacyUnderscoreHeaders: w.LegacyUnderscoreHeaders})
		if err != nil {
			sk, _ = webhook.New(webhook.Config{URL: w.URL, Format: s.Format, Source: s.Source, LegacyUnderscoreHeaders: w.LegacyUnderscoreHeaders})
			p.Note = fmt.Sprintf("%s: %v: shown unsigned", w.SecretEnv, err)
		}
		hs, b := sk.Request(shaped, nil)
		sk.Close()
		p.Destination, body = "POST "+redactQuery(w.URL), b
		for _, h := range hs {
			p.Headers = append(p.Headers, PreviewHeader{h.Key, h.Value})
		}
	case s.NATS != nil:
		msg, err := natssink.Message(natsConfig(s), shaped)
		if err != nil {
			return refused(p, err)
		}
		p.Destination, body = msg.Subject, msg.Data
		p.Headers = append(p.Headers, PreviewHeader{"Nats-Msg-Id", shaped.ID})
		keys := make([]string, 0, len(msg.Header))
		for k := range msg.Header {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			p.Headers = append(p.Headers, PreviewHeader{k, msg.Header.Get(k)})
		}
	case s.Kafka != nil:
		rec, err := kafkasink.Record(kafkaConfig(s), shaped)
		if err != nil {
			return refused(p, err)
		}
		p.Destination, p.Key, body = rec.Topic, string(rec.Key), rec.Value
		for _, h := range rec.Headers {
			p.Headers = append(p.Headers, PreviewHeader{h.Key, string(h.Value)})
		}
	}
	if utf8.Valid(body) {
		p.Body = string(body)
	} else {
		p.BodyBase64 = base64.StdEncoding.EncodeToString(body)
	}
	return p
}

// redactQuery keeps a webhook URL's query string, which may carry a
// token, out of the output (as the webhook sink keeps it out of errors).
func redactQuery(u string) string {
	if i := strings.IndexAny(u, "?#"); i >= 0 {
		return u[:i] + "?…"
	}
	return u
}

func refused(p Preview, err error) Preview {
	p.Outcome, p.Reason = OutcomeRefused, err.Error()+" (the relay parks the event for this sink with this reason)"
	return p
}
