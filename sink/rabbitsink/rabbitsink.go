// Package rabbitsink delivers outbox events to a RabbitMQ exchange that the
// operator declared, and promises:
//
//   - Durable before acknowledged. Every message is persistent (delivery
//     mode 2) and published on one channel in confirm mode; Deliver returns
//     success for an event only once the broker confirmed it (for a durable
//     queue: written to disk), so the stream's position passes it only then.
//   - Never dropped as unroutable. Messages are published mandatory: one
//     that no queue is bound for comes back (basic.return, 312 NO_ROUTE)
//     and is refused for that event (sink.EventError), parked with the
//     reason, and delivered again by the drainer once a queue is bound. The
//     relay declares nothing (no exchange, queue or binding): what exists
//     on the broker is the operator's decision, and a typo in the sinks file
//     must not create a queue that nobody reads.
//   - Order per aggregate. Events go out in commit order on one channel,
//     whose confirms come in publishing order; once an event of an
//     aggregate is not delivered, its later events count as not delivered
//     (sink.ErrHeldBack) and are resent after it with the same ids.
//   - One dedupe id. message_id is the outbox row's id on every retry and
//     replay; the body is the event's JSON envelope (sink.Event.Envelope),
//     content type application/json; the row's fields, its headers and the
//     trace context (traceparent) are message headers.
//   - Event data names no destination. The routing key is the template's
//     expansion with each placeholder's value made one word (its dots, '*',
//     '#', spaces and control characters become '_'), and a row's headers
//     cannot set CC or BCC (RabbitMQ's sender-selected distribution, which
//     would route the message under other keys) or any x- header.
//   - Outages are errors. A closed connection or channel, a nack, a
//     missing confirm or a broker blocking publishers (a memory or disk
//     alarm) fails the events not confirmed (the fan-out parks them and the
//     drainer resends them); every write and the wait for confirms are
//     bounded by the timeout, and the next Deliver dials again.
//   - What the broker cannot take is refused, not an outage. A body larger
//     than rabbitmq.max_message_bytes, or than the max_message_size the
//     broker refused a message for (RabbitMQ 4.0 lowered its default to
//     16 MiB, below this sink's default: the sink learns the broker's
//     limit from the channel error and checks later messages against it),
//     and properties and headers that do not fit in one frame (AMQP sends
//     them as a single frame of at most the negotiated frame_max, and a
//     broker closes the connection on a larger one) refuse their event
//     only (sink.EventError).
//   - No credentials in errors. The password comes from the environment
//     (Config.Password) and is cut out of every error the sink returns.
package rabbitsink

import (
	"context"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/compensa/compensa/sink"
)

// Config configures a RabbitMQ sink.
type Config struct {
	// URL is amqp:// or amqps:// (TLS); a password in it is replaced by
	// Password when that is set.
	URL string
	// Password for the URL's user (from the variable named by
	// rabbitmq.password_env); empty: the URL's.
	Password   string
	Exchange   string
	RoutingKey sink.Template
	// Timeout bounds dialing and the wait for each batch's confirms.
	Timeout time.Duration
	// MaxMessageBytes: a larger body is refused for its event before
	// publishing (0: sink.DefaultRabbitMQMaxMessageBytes).
	MaxMessageBytes int
	// Name is the connection's name (shown by the broker).
	Name string
}

// chunk is how many messages are published before their confirms are
// awaited: the channel's buffer of returned messages holds a whole chunk,
// so the connection's reader never blocks on it.
const chunk = 512

// Sink is a RabbitMQ destination; safe for concurrent use (deliveries are
// serialized on its one channel).
type Sink struct {
	cfg  Config
	uri  amqp.URI
	auth []amqp.Authentication

	mu      sync.Mutex
	conn    *amqp.Connection
	ch      *amqp.Channel
	returns chan amqp.Return
	raw     net.Conn // the socket under conn
	closed  bool
	// closes receives the error the channel was closed with.
	closes chan *amqp.Error
	// frameMax is the connection's negotiated frame_max (0: no limit).
	frameMax int
	// brokerMax is the max_message_size the broker refused a message for
	// (0: none seen); it holds across connections, as the broker's
	// setting does, until the sink is opened again (a relay restart).
	brokerMax int
	// blocked is the reason the broker gave for blocking this connection's
	// publishers (a memory or disk alarm), "" when it does not.
	blocked atomic.Pointer[string]
}

var _ sink.Sink = (*Sink)(nil)

// New checks the URL; it connects on the first delivery, so that a relay
// starts while RabbitMQ is down and parks meanwhile.
func New(cfg Config) (*Sink, error) {
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.MaxMessageBytes <= 0 {
		cfg.MaxMessageBytes = sink.DefaultRabbitMQMaxMessageBytes
	}
	if cfg.Name == "" {
		cfg.Name = "compensa-relay"
	}
	uri, err := amqp.ParseURI(cfg.URL)
	if err != nil {
		// ParseURI's messages do not quote the URL.
		return nil, fmt.Errorf("rabbitmq sink: url: %w", err)
	}
	if cfg.Password != "" {
		uri.Password = cfg.Password
	}
	return &Sink{cfg: cfg, uri: uri, auth: []amqp.Authentication{uri.PlainAuth()}}, nil
}

// RoutingKey is the routing key an event is published with.
func (s *Sink) RoutingKey(ev *sink.Event) string { return s.cfg.RoutingKey.Expand(ev, cleanWord) }

// cleanWord makes a value one word of a topic routing key: no '.', which
// would start another word, no '*' or '#' (wildcards in binding keys), no
// spaces or control characters.
func cleanWord(v string) string {
	return strings.Map(func(r rune) rune {
		if r <= ' ' || r == '.' || r == '*' || r == '#' || r == 0x7f || unicode.IsSpace(r) || unicode.IsControl(r) {
			return '_'
		}
		return r
	}, v)
}

// maxShortString is AMQP's limit on a routing key, a header name and the
// message_id property.
const maxShortString = 255

// frameOverhead is what a frame adds to its payload: type, channel, size
// and the end octet. frame_max counts them (AMQP 0-9-1, 4.2.3), so the
// payload may be frame_max less this. RabbitMQ tolerates these 8 bytes
// more (clients commonly get it wrong) and closes the connection beyond
// them, with frame_too_large; the sink keeps to the specification, which
// every broker takes.
const frameOverhead = 8

// maxSizeRefusal is RabbitMQ's reason for closing a channel on a message
// larger than its max_message_size (406 PRECONDITION_FAILED).
var maxSizeRefusal = regexp.MustCompile(`message size (\d+) is larger than configured max size (\d+)`)

// HeaderFrameSize is the payload size of the content header frame that
// carries msg's properties (AMQP 0-9-1, 4.2.6.1), for the properties this
// sink sets and headers whose values are strings: the frame cannot be
// split, so it must fit in frame_max less the frame's overhead.
func HeaderFrameSize(msg amqp.Publishing) int {
	short := func(v string) int {
		if v == "" {
			return 0
		}
		return 1 + len(v)
	}
	n := 2 + 2 + 8 + 2 // class, weight, body size, property flags
	n += short(msg.ContentType) + short(msg.CorrelationId) + short(msg.MessageId) + short(msg.Type) + short(msg.AppId)
	if msg.DeliveryMode > 0 {
		n++
	}
	if !msg.Timestamp.IsZero() {
		n += 8
	}
	if len(msg.Headers) > 0 {
		n += 4 // the table's length
		for k, v := range msg.Headers {
			s, _ := v.(string)
			n += 1 + len(k) + 1 + 4 + len(s) // short name, 'S', long string
		}
	}
	return n
}

// maxBody is the largest body the broker takes, as far as the sink knows:
// the configured limit, or the broker's when it refused a message for a
// lower one. Called with s.mu held.
func (s *Sink) maxBody() (limit int, learned bool) {
	if s.brokerMax > 0 && s.brokerMax < s.cfg.MaxMessageBytes {
		return s.brokerMax, true
	}
	return s.cfg.MaxMessageBytes, false
}

// tooLarge is the refusal of a body of n bytes. Called with s.mu held.
func (s *Sink) tooLarge(n int) error {
	limit, learned := s.maxBody()
	if learned {
		return fmt.Errorf("message of %d bytes is larger than the broker's max_message_size of %d bytes (learned when it refused a larger message); raise it on the broker, or set rabbitmq.max_message_bytes to it", n, limit)
	}
	return fmt.Errorf("message of %d bytes is larger than the %d bytes the broker takes (rabbitmq.max_message_bytes)", n, limit)
}

// message builds the publishing of ev and its routing key; an error is a
// refusal of this event. Called with s.mu held.
func (s *Sink) message(ev *sink.Event) (amqp.Publishing, string, error) {
	key, err := s.cfg.RoutingKey.Render(ev, cleanWord)
	if err != nil {
		return amqp.Publishing{}, "", err
	}
	if len(key) > maxShortString {
		return amqp.Publishing{}, "", fmt.Errorf("routing key of %d bytes is longer than the %d bytes AMQP takes", len(key), maxShortString)
	}
	if len(ev.ID) > maxShortString {
		return amqp.Publishing{}, "", fmt.Errorf("id of %d bytes is longer than the %d bytes an AMQP message_id takes", len(ev.ID), maxShortString)
	}
	body := ev.Envelope()
	if limit, _ := s.maxBody(); len(body) > limit {
		return amqp.Publishing{}, "", s.tooLarge(len(body))
	}
	headers := amqp.Table{}
	for _, h := range ev.MessageHeaders() {
		// A header name is an AMQP short string: a longer one (only a
		// row's headers object can hold one) is left out rather than
		// holding the event back. x- headers steer the broker and its
		// plugins, and CC/BCC add routing keys: only the relay sets them.
		n := strings.ToLower(h.Key)
		if len(h.Key) > maxShortString || strings.HasPrefix(n, "x-") || n == "cc" || n == "bcc" {
			continue
		}
		headers[h.Key] = h.Value
	}
	msg := amqp.Publishing{
		Headers: headers, ContentType: "application/json", DeliveryMode: amqp.Persistent,
		MessageId: ev.ID, Timestamp: ev.CreatedAt, AppId: "compensa-relay", Body: body,
	}
	// Type and correlation_id are short strings too; the headers carry
	// them whatever their length.
	if len(ev.EventType) <= maxShortString {
		msg.Type = ev.EventType
	}
	if len(ev.CorrelationID) <= maxShortString {
		msg.CorrelationId = ev.CorrelationID
	}
	if n := HeaderFrameSize(msg); s.frameMax > 0 && n > s.frameMax-frameOverhead {
		return amqp.Publishing{}, "", fmt.Errorf("properties and headers of %d bytes do not fit in one AMQP frame (frame_max %d bytes, as negotiated with the broker), which is how AMQP sends them: the row's headers are too large for RabbitMQ; keep large values in the payload, or raise frame_max on the broker", n, s.frameMax)
	}
	return msg, key, nil
}

// channel returns the open confirm-mode channel, dialing and opening one
// when the last is gone. Called with s.mu held.
func (s *Sink) channel() (*amqp.Channel, error) {
	if s.closed {
		return nil, errors.New("rabbitmq sink: closed")
	}
	if s.ch != nil && !s.ch.IsClosed() && s.conn != nil && !s.conn.IsClosed() {
		return s.ch, nil
	}
	s.drop()
	dial := amqp.DefaultDial(s.cfg.Timeout)
	var raw net.Conn
	conn, err := amqp.DialConfig(s.cfg.URL, amqp.Config{
		SASL: s.auth, Heartbeat: 10 * time.Second,
		Dial: func(network, addr string) (net.Conn, error) {
			c, err := dial(network, addr)
			if err != nil {
				return nil, err
			}
			raw = c
			return &writeDeadlineConn{Conn: c, timeout: s.cfg.Timeout}, nil
		},
		Properties: amqp.Table{"connection_name": s.cfg.Name},
	})
	if err != nil {
		return nil, fmt.Errorf("connect to RabbitMQ at %s: %w", s.uri.Host, err)
	}
	s.blocked.Store(nil)
	blocked := conn.NotifyBlocked(make(chan amqp.Blocking, 4))
	go func() {
		// Ends when the connection closes (the library closes the channel).
		for b := range blocked {
			if conn.IsClosed() {
				continue // a later connection's state is its own
			}
			if b.Active {
				reason := b.Reason
				s.blocked.Store(&reason)
			} else {
				s.blocked.Store(nil)
			}
		}
	}()
	ch, err := conn.Channel()
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("open a channel: %w", err)
	}
	// Passively: the relay never creates the exchange. A missing one
	// closes the channel with 404, which is an operator's fix for the
	// whole sink (it parks and is probed), not a refusal of one event.
	if err := ch.ExchangeDeclarePassive(s.cfg.Exchange, "topic", true, false, false, false, nil); err != nil {
		conn.Close()
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.NotFound {
			return nil, fmt.Errorf("exchange %q does not exist on the broker; declare it (durable) and bind the queues that should receive the events: the relay declares nothing", s.cfg.Exchange)
		}
		return nil, fmt.Errorf("check exchange %q: %w", s.cfg.Exchange, err)
	}
	if err := ch.Confirm(false); err != nil {
		conn.Close()
		return nil, fmt.Errorf("put the channel in confirm mode: %w", err)
	}
	s.returns = ch.NotifyReturn(make(chan amqp.Return, chunk))
	s.closes = ch.NotifyClose(make(chan *amqp.Error, 1))
	s.frameMax = conn.Config.FrameSize
	s.conn, s.ch, s.raw = conn, ch, raw
	return ch, nil
}

// drop closes the connection; the next delivery dials again. Called with
// s.mu held.
func (s *Sink) drop() {
	if s.conn != nil {
		// A broker that blocks publishers may never answer
		// connection.close, and its heartbeats keep moving the socket's
		// read deadline: after the timeout, close the socket under it.
		conn, raw, done := s.conn, s.raw, make(chan struct{})
		go func() { conn.Close(); close(done) }()
		select {
		case <-done:
		case <-time.After(s.cfg.Timeout):
			raw.Close()
			select {
			case <-done:
			case <-time.After(time.Second):
			}
		}
	}
	s.conn, s.ch, s.returns, s.closes, s.raw = nil, nil, nil, nil, nil
}

// writeDeadlineConn bounds every write: a broker that stopped reading (it
// blocks publishers on a resource alarm) fails the connection after the
// timeout instead of holding the stream.
type writeDeadlineConn struct {
	net.Conn
	timeout time.Duration
}

func (c *writeDeadlineConn) Write(b []byte) (int, error) {
	c.Conn.SetWriteDeadline(time.Now().Add(c.timeout))
	return c.Conn.Write(b)
}

// Deliver publishes evs in order and waits for every confirm.
func (s *Sink) Deliver(ctx context.Context, evs []*sink.Event) []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	errs := make([]error, len(evs))
	failed := map[string]bool{}
	for start := 0; start < len(evs); start += chunk {
		end := min(start+chunk, len(evs))
		s.deliverChunk(ctx, evs[start:end], errs[start:end], failed)
	}
	// After a failure, the aggregate's later events count as not
	// delivered: the fan-out resends them in order, with the same ids.
	failed = map[string]bool{}
	for i, ev := range evs {
		k := ev.AggregateKey()
		if failed[k] && errs[i] == nil {
			errs[i] = sink.ErrHeldBack
		}
		if errs[i] != nil {
			failed[k] = true
			errs[i] = s.redact(errs[i])
		}
	}
	return errs
}

// deliverChunk publishes evs (at most chunk) and awaits their confirms;
// failed holds the aggregates with an event not delivered so far.
func (s *Sink) deliverChunk(ctx context.Context, evs []*sink.Event, errs []error, failed map[string]bool) {
	ch, err := s.channel()
	if err != nil {
		for i, ev := range evs {
			errs[i] = err
			failed[ev.AggregateKey()] = true
		}
		return
	}
	if reason := s.blocked.Load(); reason != nil {
		// Publishing now would wait for the whole timeout and then fail.
		err := fmt.Errorf("RabbitMQ blocks publishers (%s): a resource alarm; free memory or disk on the broker", *reason)
		for i, ev := range evs {
			errs[i] = err
			failed[ev.AggregateKey()] = true
		}
		return
	}
	pending := make([]*amqp.DeferredConfirmation, len(evs))
	sizes := make([]int, len(evs)) // body sizes of what was published
	broken := false
	for i, ev := range evs {
		k := ev.AggregateKey()
		if failed[k] {
			// Publishing it would put it ahead of the event that failed.
			errs[i] = sink.ErrHeldBack
			continue
		}
		if broken {
			errs[i] = err
			failed[k] = true
			continue
		}
		msg, key, merr := s.message(ev)
		if merr != nil {
			errs[i] = sink.EventError(merr)
			failed[k] = true
			continue
		}
		dc, perr := ch.PublishWithDeferredConfirmWithContext(ctx, s.cfg.Exchange, key, true, false, msg)
		if perr != nil {
			err, broken = fmt.Errorf("publish: %w", perr), true
			errs[i] = err
			failed[k] = true
			continue
		}
		pending[i], sizes[i] = dc, len(msg.Body)
	}
	timer := time.NewTimer(s.cfg.Timeout)
	defer timer.Stop()
	expired := false
	for i, dc := range pending {
		if dc == nil {
			continue
		}
		if expired {
			select {
			case <-dc.Done():
			default:
				errs[i] = fmt.Errorf("no confirm from RabbitMQ within %s", s.cfg.Timeout)
				continue
			}
		} else {
			select {
			case <-dc.Done():
			case <-timer.C:
				expired, broken = true, true
				errs[i] = fmt.Errorf("no confirm from RabbitMQ within %s", s.cfg.Timeout)
				continue
			case <-ctx.Done():
				expired, broken = true, true
				errs[i] = ctx.Err()
				continue
			}
		}
		if !dc.Acked() {
			// A nack (the broker could not take it: a queue at its
			// length limit with reject-publish, an internal error), or the
			// channel closed before the confirm came.
			broken = broken || ch.IsClosed()
			errs[i] = errors.New("RabbitMQ did not confirm the message (nack, or the channel closed)")
		}
	}
	// Every return of this chunk came before the confirm of its message,
	// so it is in the buffer now.
	returned := map[string]amqp.Return{}
	for drained := false; !drained; {
		select {
		case r, ok := <-s.returns:
			if !ok {
				drained = true
				break
			}
			returned[r.MessageId] = r
		default:
			drained = true
		}
	}
	if ch.IsClosed() {
		s.refusedForSize(pending, sizes, errs)
	}
	for i, ev := range evs {
		if pending[i] == nil || errs[i] != nil {
			continue
		}
		if r, ok := returned[ev.ID]; ok {
			errs[i] = sink.EventError(fmt.Errorf("RabbitMQ returned the message (%d %s): no queue is bound to exchange %q for routing key %q; bind one, and the parked event is delivered again", r.ReplyCode, r.ReplyText, r.Exchange, r.RoutingKey))
		}
	}
	for i, ev := range evs {
		if errs[i] != nil {
			failed[ev.AggregateKey()] = true
		}
	}
	if broken {
		// Unknown confirms or a closed channel: start again on a new
		// connection.
		s.drop()
	}
}

// refusedForSize looks at why the broker closed the channel: when it
// refused a message larger than its max_message_size, the sink keeps that
// limit, and every unconfirmed message above it is refused for its event
// (it would be refused again on every retry); the others were cut off with
// the channel and are resent. Called with s.mu held.
func (s *Sink) refusedForSize(pending []*amqp.DeferredConfirmation, sizes []int, errs []error) {
	var cause *amqp.Error
	select {
	case cause = <-s.closes:
	default:
	}
	if cause == nil || cause.Code != amqp.PreconditionFailed {
		return
	}
	m := maxSizeRefusal.FindStringSubmatch(cause.Reason)
	if m == nil {
		return
	}
	limit, err := strconv.Atoi(m[2])
	if err != nil || limit <= 0 {
		return
	}
	s.brokerMax = limit
	for i, dc := range pending {
		if dc != nil && errs[i] != nil && sizes[i] > limit {
			errs[i] = sink.EventError(s.tooLarge(sizes[i]))
		}
	}
}

// redact cuts the password out of err's message.
func (s *Sink) redact(err error) error {
	if s.cfg.Password == "" || !strings.Contains(err.Error(), s.cfg.Password) {
		return err
	}
	kind := sink.Classify(err)
	e := errors.New(strings.ReplaceAll(err.Error(), s.cfg.Password, "xxxxx"))
	if kind == "event" {
		return sink.EventError(e)
	}
	return e
}

// Close closes the connection; a later Deliver fails.
func (s *Sink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	s.drop()
	return nil
}
