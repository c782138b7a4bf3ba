// Package natssink delivers outbox events to a NATS JetStream stream: the
// payload is the message body, the outbox row's id is Nats-Msg-Id (so
// JetStream drops a resend within the stream's duplicate window), the row's
// fields and headers are message headers; or, with a cloudevents format,
// a CloudEvent per the NATS protocol binding (ce- headers in binary mode). Events are published in commit
// order with PublishMsgAsync and every future is awaited; once an event of
// an aggregate fails, its later events count as not delivered, so the
// fan-out resends them in order with the same ids.
package natssink

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/compensa/compensa/sink"
)

// Config configures a JetStream sink.
type Config struct {
	URL     string
	Stream  string
	Subject sink.Template
	// DuplicateWindow of the stream when this sink creates it (at least
	// sink.MinDuplicateWindow).
	DuplicateWindow time.Duration
	// Timeout bounds the wait for each acknowledgement.
	Timeout time.Duration
	// Name is the client's connection name (shown by the server).
	Name string
	// Format is sink.FormatEnvelope (or empty: the payload as the body, the
	// row's fields as headers), sink.FormatCloudEvents (binary content
	// mode: attributes as ce- headers, datacontenttype as content-type, per
	// the NATS protocol binding) or sink.FormatCloudEventsStructured.
	Format string
	// Source is the CloudEvents source.
	Source string
}

// Sink is a JetStream destination; safe for concurrent use.
type Sink struct {
	cfg Config
	nc  *nats.Conn
	js  jetstream.JetStream

	mu      sync.Mutex
	ensured bool
}

var _ sink.Sink = (*Sink)(nil)

// New connects (retrying in the background while the server is away, so a
// relay starts while NATS is down and parks meanwhile). The stream is
// created or checked on the first delivery.
func New(cfg Config) (*Sink, error) {
	cfg.DuplicateWindow = max(cfg.DuplicateWindow, sink.MinDuplicateWindow)
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	nc, err := nats.Connect(cfg.URL, nats.Name(cmpOr(cfg.Name, "compensa-relay")),
		nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond),
		nats.Timeout(cfg.Timeout))
	if err != nil {
		return nil, fmt.Errorf("nats sink: connect: %w", err)
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(cfg.Timeout), jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("nats sink: %w", err)
	}
	return &Sink{cfg: cfg, nc: nc, js: js}, nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// StreamSubjects is what the stream listens on: the subject's literal
// prefix and '>' (outbox.{aggregate_type}.{event_type} -> outbox.>).
func StreamSubjects(t sink.Template) []string {
	if t.Literal() {
		return []string{t.String()}
	}
	return []string{t.Prefix() + ">"}
}

// ensureStream creates the stream if it is missing and checks its
// duplicate window otherwise.
func (s *Sink) ensureStream(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ensured {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	st, err := s.js.Stream(ctx, s.cfg.Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		_, err = s.js.CreateStream(ctx, jetstream.StreamConfig{
			Name: s.cfg.Stream, Subjects: StreamSubjects(s.cfg.Subject),
			Duplicates: s.cfg.DuplicateWindow, Storage: jetstream.FileStorage,
		})
		if err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return fmt.Errorf("create stream %s: %w", s.cfg.Stream, err)
		}
		s.ensured = err == nil
		return nil
	}
	if err != nil {
		return fmt.Errorf("look up stream %s: %w", s.cfg.Stream, err)
	}
	if dw := st.CachedInfo().Config.Duplicates; dw < sink.MinDuplicateWindow {
		return sink.EventError(fmt.Errorf("stream %s has a duplicate window of %s, too short to recognise a resend after a crash; raise it to at least %s", s.cfg.Stream, dw, sink.MinDuplicateWindow))
	}
	s.ensured = true
	return nil
}

// Subject is the subject an event is published on (an expression that
// fails fills its token with "_"; Deliver refuses such an event).
func (s *Sink) Subject(ev *sink.Event) string { return s.cfg.Subject.Expand(ev, cleanToken) }

// Message is the message ev is published as, without its Nats-Msg-Id
// (the event's id, set when publishing). The error refuses this event:
// an expression of the subject failed, or the subject is too long.
func Message(cfg Config, ev *sink.Event) (*nats.Msg, error) {
	subject, err := cfg.Subject.Render(ev, cleanToken)
	if err != nil {
		return nil, sink.EventError(err)
	}
	msg := nats.NewMsg(subject)
	if len(msg.Subject) > MaxSubjectBytes {
		// The server would close the connection on such a line, and
		// every event after it would look like an outage.
		return nil, sink.EventError(fmt.Errorf("subject of %d bytes is longer than the %d bytes the sink publishes (the server's control line is 4096 bytes)", len(msg.Subject), MaxSubjectBytes))
	}
	enc := ev.Encode(cfg.Format, cfg.Source, "ce-", "content-type", nil)
	msg.Data = enc.Body
	for _, h := range enc.Headers {
		// Nats-* headers steer the server (Nats-Msg-Id, expectations):
		// only the sink sets them.
		if !strings.HasPrefix(strings.ToLower(h.Key), "nats-") {
			msg.Header.Set(h.Key, h.Value)
		}
	}
	return msg, nil
}

// cleanToken makes a value one token of a subject: no '.', which would
// start another token, no spaces, control characters or wildcards.
func cleanToken(v string) string {
	return strings.Map(func(r rune) rune {
		if r <= ' ' || r == '.' || r == '*' || r == '>' || r == 0x7f || unicode.IsSpace(r) {
			return '_'
		}
		return r
	}, v)
}

// Deliver publishes evs in order and waits for every acknowledgement.
func (s *Sink) Deliver(ctx context.Context, evs []*sink.Event) []error {
	errs := make([]error, len(evs))
	if err := s.ensureStream(ctx); err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	futures := make([]jetstream.PubAckFuture, len(evs))
	// refused: aggregates with an event refused before publishing; failed
	// (after the acknowledgements): aggregates with any event not delivered.
	refused, failed := map[string]bool{}, map[string]bool{}
	maxPayload := s.nc.MaxPayload()
	for i, ev := range evs {
		// An event refused before publishing holds back the rest of its
		// aggregate: publishing them would put them ahead of it.
		if refused[ev.AggregateKey()] {
			errs[i] = sink.ErrHeldBack
			continue
		}
		msg, err := Message(s.cfg, ev)
		if err != nil {
			errs[i] = err
			refused[ev.AggregateKey()] = true
			continue
		}
		if size := int64(len(msg.Data) + len(msg.Subject) + headerSize(msg.Header)); maxPayload > 0 && size > maxPayload {
			errs[i] = sink.EventError(fmt.Errorf("event of %d bytes is larger than the server's max_payload of %d bytes", size, maxPayload))
			refused[ev.AggregateKey()] = true
			continue
		}
		// With the two headers publishing adds: Nats-Msg-Id and
		// Nats-Expected-Stream.
		if n := headerSize(msg.Header) + len(jetstream.MsgIDHeader) + len(ev.ID) + 4 + len(jetstream.ExpectedStreamHeader) + len(s.cfg.Stream) + 4; n > MaxHeaderBytes {
			errs[i] = sink.EventError(fmt.Errorf("headers of %d bytes are larger than the %d bytes JetStream stores with a message; keep large values in the payload", n, MaxHeaderBytes))
			refused[ev.AggregateKey()] = true
			continue
		}
		f, err := s.js.PublishMsgAsync(msg, jetstream.WithMsgID(ev.ID), jetstream.WithExpectStream(s.cfg.Stream))
		if err != nil {
			errs[i] = classify(err)
			refused[ev.AggregateKey()] = true
			continue
		}
		futures[i] = f
	}
	timer := time.NewTimer(s.cfg.Timeout + time.Second)
	defer timer.Stop()
	for i, f := range futures {
		if f == nil {
			continue
		}
		select {
		case <-f.Ok():
		case err := <-f.Err():
			errs[i] = classify(err)
		case <-timer.C:
			errs[i] = errors.New("no acknowledgement from JetStream in time")
			timer.Reset(0)
		case <-ctx.Done():
			errs[i] = ctx.Err()
		}
	}
	// After a failure, the aggregate's later events count as not delivered:
	// the fan-out resends them in order, with the same ids.
	for i, ev := range evs {
		k := ev.AggregateKey()
		if failed[k] && errs[i] == nil {
			errs[i] = sink.ErrHeldBack
		}
		if errs[i] != nil {
			failed[k] = true
		}
	}
	return errs
}

// headerSize is the length of h on the wire: "NATS/1.0\r\n", a line per
// value, and an empty line.
func headerSize(h nats.Header) int {
	n := 12
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return n
}

// MaxHeaderBytes is the largest header block JetStream stores with a
// message: it keeps the length in 16 bits, and refuses a larger block
// (err_code 10097) whatever max_payload allows. Refused before publishing,
// not taken for an outage.
const MaxHeaderBytes = 65535

// errHeaderTooLarge is JetStream's error code for a header block larger
// than MaxHeaderBytes.
const errHeaderTooLarge jetstream.ErrorCode = 10097

// MaxSubjectBytes bounds the subject an event is published on: the server
// refuses a protocol line longer than its max_control_line (4096 bytes by
// default), which holds the subject, a reply subject and two lengths.
const MaxSubjectBytes = 3584

func classify(err error) error {
	var apiErr *jetstream.APIError
	if errors.Is(err, nats.ErrMaxPayload) || errors.Is(err, nats.ErrBadSubject) ||
		(errors.As(err, &apiErr) && (apiErr.Code == 413 || apiErr.ErrorCode == errHeaderTooLarge)) {
		return sink.EventError(err)
	}
	return err
}

// Close drains nothing (every publish was awaited) and closes the connection.
func (s *Sink) Close() error {
	s.nc.Close()
	return nil
}
