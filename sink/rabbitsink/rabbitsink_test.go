package rabbitsink_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/compensa/compensa/sink"
	"github.com/compensa/compensa/sink/rabbitsink"
	"github.com/compensa/compensa/sink/sinktest"
	"github.com/compensa/compensa/test/rabbittest"
)

// TestMain stops the shared node before goleak checks, so that its
// goroutines are not taken for leaks.
func TestMain(m *testing.M) {
	code := m.Run()
	rabbittest.StopShared()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			os.Stderr.WriteString("goleak: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}

// topology declares what an operator would: a durable topic exchange and a
// durable queue bound to it for every routing key under prefix.
func topology(t *testing.T, srv *rabbittest.Server, exchange, queue, binding string) {
	t.Helper()
	conn, err := srv.Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare(exchange, "topic", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if queue == "" {
		return
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(queue, binding, exchange, false, nil); err != nil {
		t.Fatal(err)
	}
}

// readQueue returns what the queue received so far, in queue order,
// without consuming it for good (every message is requeued when the
// reader's channel closes, in its original order).
func readQueue(srv *rabbittest.Server, queue string) func() []sinktest.Received {
	return func() []sinktest.Received {
		conn, err := srv.Dial()
		if err != nil {
			return nil
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			return nil
		}
		var out []sinktest.Received
		for {
			d, ok, err := ch.Get(queue, false)
			if err != nil || !ok {
				return out
			}
			out = append(out, received(d))
		}
	}
}

func received(d amqp.Delivery) sinktest.Received {
	h := map[string]string{}
	for k, v := range d.Headers {
		if s, ok := v.(string); ok {
			h[k] = s
		}
	}
	var env struct {
		Payload json.RawMessage `json:"payload"`
		Raw     string          `json:"payload_base64"`
	}
	json.Unmarshal(d.Body, &env)
	raw, _ := base64.StdEncoding.DecodeString(env.Raw)
	return sinktest.Received{ID: d.MessageId, Headers: h, Payload: env.Payload, Raw: raw}
}

func newSink(t *testing.T, srv *rabbittest.Server, exchange, key string) *rabbitsink.Sink {
	t.Helper()
	s, err := rabbitsink.New(rabbitsink.Config{URL: srv.URL(), Password: srv.Password, Exchange: exchange,
		RoutingKey: sink.MustTemplate(key), Timeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	srv := rabbittest.Shared(t)
	sinktest.Run(t, sinktest.Harness{
		New: func(t *testing.T) (sink.Sink, func() []sinktest.Received) {
			name := "c" + strings.ReplaceAll(uuid.NewString(), "-", "")[:12]
			topology(t, srv, name, name, "outbox.#")
			return newSink(t, srv, name, "outbox.{aggregate_type}.{event_type}"), readQueue(srv, name)
		},
		// The fault test kills a node of its own (TestBrokerKilledAndBack):
		// the shared node serves the other packages' tests too.
	})
}

// The message as a consumer sees it: persistent, message_id the outbox
// id, JSON content type, the envelope as body, the metadata as headers.
func TestMessageProperties(t *testing.T) {
	srv := rabbittest.Shared(t)
	topology(t, srv, "props", "props", "#")
	s := newSink(t, srv, "props", "outbox.{aggregate_type}.{event_type}")
	ev := sinktest.Events(1, 1)[0]
	ev.CausationID = uuid.NewString()
	ev.Headers = json.RawMessage(`{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}`)
	ev.CreatedAt = time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC)
	if err := s.Deliver(t.Context(), []*sink.Event{ev})[0]; err != nil {
		t.Fatal(err)
	}
	conn, _ := srv.Dial()
	defer conn.Close()
	ch, _ := conn.Channel()
	d, ok, err := ch.Get("props", true)
	if err != nil || !ok {
		t.Fatalf("get: %v %v", ok, err)
	}
	if d.DeliveryMode != amqp.Persistent || d.MessageId != ev.ID || d.ContentType != "application/json" ||
		string(d.Body) != string(ev.Envelope()) || d.RoutingKey != "outbox.order.order_placed" || d.Type != ev.EventType {
		t.Errorf("delivery: mode %d id %q type %q key %q body %s", d.DeliveryMode, d.MessageId, d.ContentType, d.RoutingKey, d.Body)
	}
	for k, want := range map[string]string{"event_type": ev.EventType, "aggregate_type": "order", "aggregate_id": ev.AggregateID,
		"tenant_id": ev.TenantID, "correlation_id": ev.CorrelationID, "causation_id": ev.CausationID,
		"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"} {
		if d.Headers[k] != want {
			t.Errorf("header %s = %v, want %q", k, d.Headers[k], want)
		}
	}
}

// A value fills one word of the routing key: its dots, wildcards and
// spaces cannot add words, so a binding on outbox.order.* never receives
// an event whose data tries to reach another key; and a row's headers
// cannot add routing keys through CC or BCC.
func TestEventDataCannotChooseTheRoutingKey(t *testing.T) {
	srv := rabbittest.Shared(t)
	topology(t, srv, "route", "route-order", "outbox.order.*")
	topology(t, srv, "route", "route-admin", "outbox.admin.#")
	s := newSink(t, srv, "route", "outbox.{aggregate_type}.{event_type}")
	for in, want := range map[[2]string]string{
		{"order", "placed"}:              "outbox.order.placed",
		{"admin.x", "a.b"}:               "outbox.admin_x.a_b",
		{"order", "x.#"}:                 "outbox.order.x__",
		{"order", "*"}:                   "outbox.order._",
		{"order", "with space\ttab\n.."}: "outbox.order.with_space_tab___",
		{"", ""}:                         "outbox._._",
	} {
		if got := s.RoutingKey(&sink.Event{AggregateType: in[0], EventType: in[1]}); got != want {
			t.Errorf("%q: routing key %q, want %q", in, got, want)
		}
	}
	evs := sinktest.Events(3, 3)
	evs[0].AggregateType, evs[0].EventType = "order", "placed"
	evs[1].AggregateType, evs[1].EventType = "order", "admin.#" // would be outbox.order.admin.# raw
	evs[2].AggregateType, evs[2].EventType = "order", "x"
	evs[2].Headers = json.RawMessage(`{"CC":["outbox.admin.x"],"BCC":"outbox.admin.y","cc":"outbox.admin.z","x-delay":"5000"}`)
	for i, err := range s.Deliver(t.Context(), evs) {
		if err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
	}
	if got := readQueue(srv, "route-admin")(); len(got) != 0 {
		t.Fatalf("the admin queue received %d messages from event data", len(got))
	}
	got := readQueue(srv, "route-order")()
	if len(got) != 3 {
		t.Fatalf("the order queue holds %d messages, want 3", len(got))
	}
	for k := range got[2].Headers {
		if l := strings.ToLower(k); l == "cc" || l == "bcc" || strings.HasPrefix(l, "x-") {
			t.Errorf("header %s came from the row's headers", k)
		}
	}
}

// An event no queue is bound for comes back (mandatory): it is refused for
// that event (parked with the reason), its aggregate's later events are
// held back, other aggregates go on, and the sink keeps delivering.
func TestUnroutableIsRefusedNotDropped(t *testing.T) {
	srv := rabbittest.Shared(t)
	topology(t, srv, "unroutable", "unroutable-orders", "outbox.order.#")
	s := newSink(t, srv, "unroutable", "outbox.{aggregate_type}.{event_type}")
	evs := sinktest.Events(4, 2) // aggregates o-0 (0, 2) and o-1 (1, 3)
	evs[0].AggregateType = "invoice"
	evs[2].AggregateType = "invoice"
	errs := s.Deliver(t.Context(), evs)
	if sink.Classify(errs[0]) != "event" || !strings.Contains(errs[0].Error(), "no queue is bound") {
		t.Fatalf("unroutable event: %v (%s), want an event error naming the missing binding", errs[0], sink.Classify(errs[0]))
	}
	if !errors.Is(errs[2], sink.ErrHeldBack) && sink.Classify(errs[2]) != "event" {
		t.Fatalf("the later event of the unroutable one's aggregate: %v, want not delivered", errs[2])
	}
	if errs[1] != nil || errs[3] != nil {
		t.Fatalf("the routable aggregate: %v %v", errs[1], errs[3])
	}
	for _, err := range s.Deliver(t.Context(), sinktest.Events(2, 2)) {
		if err != nil {
			t.Fatalf("the sink no longer delivers after a return: %v", err)
		}
	}
}

// A missing exchange is the operator's to declare: every event fails as an
// outage (parked, probed), with a message that says so; the relay never
// declares it.
func TestMissingExchangeIsAnOutageThatSaysWhy(t *testing.T) {
	srv := rabbittest.Shared(t)
	s := newSink(t, srv, "nowhere", "outbox.{aggregate_type}")
	errs := s.Deliver(t.Context(), sinktest.Events(2, 1))
	if errs[0] == nil || sink.Classify(errs[0]) != "down" || !strings.Contains(errs[0].Error(), `exchange "nowhere" does not exist`) {
		t.Fatalf("errors %v, want an outage naming the exchange", errs)
	}
	topology(t, srv, "nowhere", "nowhere", "#")
	for _, err := range s.Deliver(t.Context(), sinktest.Events(2, 1)) {
		if err != nil {
			t.Fatalf("after the exchange was declared: %v", err)
		}
	}
}

func TestTooLargeIsAnEventError(t *testing.T) {
	srv := rabbittest.Shared(t)
	topology(t, srv, "big", "big", "#")
	s, err := rabbitsink.New(rabbitsink.Config{URL: srv.URL(), Password: srv.Password, Exchange: "big",
		RoutingKey: sink.MustTemplate("big.{event_type}"), MaxMessageBytes: 4096})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	evs := sinktest.Events(3, 2)
	evs[0].Payload = json.RawMessage(`"` + strings.Repeat("x", 8192) + `"`)
	evs[1].EventType = strings.Repeat("t", 300)
	errs := s.Deliver(t.Context(), evs)
	if sink.Classify(errs[0]) != "event" || !strings.Contains(errs[0].Error(), "max_message_bytes") ||
		sink.Classify(errs[1]) != "event" || !strings.Contains(errs[1].Error(), "routing key") || !errors.Is(errs[2], sink.ErrHeldBack) {
		t.Fatalf("errors %v: want both refused as event errors and the third held back", errs)
	}
}

// A wrong password fails as an outage whose message never holds the
// password; a sink that cannot reach the broker fails the same way.
func TestCredentialsNeverInErrors(t *testing.T) {
	srv := rabbittest.Shared(t)
	const secret = "s3cret-never-shown"
	s, err := rabbitsink.New(rabbitsink.Config{URL: "amqp://relay:" + secret + "@" + strings.TrimPrefix(srv.URL(), "amqp://relay@"),
		Password: secret, Exchange: "amq.topic", RoutingKey: sink.MustTemplate("x"), Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	errs := s.Deliver(t.Context(), sinktest.Events(1, 1))
	if errs[0] == nil || sink.Classify(errs[0]) != "down" || strings.Contains(errs[0].Error(), secret) {
		t.Fatalf("wrong password: %v", errs[0])
	}
}

// The broker killed with -9 and started again: deliveries fail while it
// is away (never reported delivered), succeed once it is back on a new
// connection, and what was confirmed before the kill is still in the
// durable queue.
func TestBrokerKilledAndBack(t *testing.T) {
	srv := rabbittest.Start(t)
	topology(t, srv, "kill", "kill", "#")
	s := newSink(t, srv, "kill", "k.{aggregate_type}")
	before := sinktest.Events(10, 3)
	for _, err := range s.Deliver(t.Context(), before) {
		if err != nil {
			t.Fatal(err)
		}
	}
	srv.Kill()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	evs := sinktest.Events(6, 2)
	for _, err := range s.Deliver(ctx, evs) {
		if err == nil || sink.Classify(err) == "event" && !errors.Is(err, sink.ErrHeldBack) {
			t.Fatalf("delivered or refused while the broker was down: %v", err)
		}
	}
	srv.Restart(t)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ok := true
		for _, err := range s.Deliver(ctx, evs) {
			ok = ok && err == nil
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("still failing after the broker came back")
		}
		time.Sleep(200 * time.Millisecond)
	}
	got := readQueue(srv, "kill")()
	all := append(append([]*sink.Event{}, before...), evs...)
	sinktest.RequireOrder(t, all, got)
}

// Concurrent deliveries share the one channel: each batch's confirms are
// its own.
func TestConcurrentBatchesOnOneChannel(t *testing.T) {
	srv := rabbittest.Shared(t)
	topology(t, srv, "conc", "conc", "#")
	s := newSink(t, srv, "conc", "c")
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, err := range s.Deliver(context.Background(), sinktest.Events(700, 5)) {
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// A broker that blocks publishers (a memory alarm) fails deliveries as an
// outage within the timeout, saying why, and delivers again once the alarm
// clears.
func TestBlockedBrokerIsAnOutage(t *testing.T) {
	srv := rabbittest.Shared(t)
	topology(t, srv, "blocked", "blocked", "#")
	s := newSink(t, srv, "blocked", "b")
	for _, err := range s.Deliver(t.Context(), sinktest.Events(1, 1)) {
		if err != nil {
			t.Fatal(err)
		}
	}
	if out, err := srv.Ctl("set_vm_memory_high_watermark", "absolute", "1MB"); err != nil {
		t.Fatalf("set the alarm: %v\n%s", err, out)
	}
	t.Cleanup(func() { srv.Ctl("set_vm_memory_high_watermark", "absolute", "1GB") })
	start := time.Now()
	var last error
	for time.Since(start) < 20*time.Second {
		if last = s.Deliver(t.Context(), sinktest.Events(1, 1))[0]; last != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if last == nil || sink.Classify(last) != "down" {
		t.Fatalf("while publishers are blocked: %v, want an outage", last)
	}
	t.Logf("blocked: %v (after %s)", last, time.Since(start).Round(time.Millisecond))
	if out, err := srv.Ctl("set_vm_memory_high_watermark", "absolute", "1GB"); err != nil {
		t.Fatalf("clear the alarm: %v\n%s", err, out)
	}
	deadline := time.Now().Add(20 * time.Second)
	for s.Deliver(t.Context(), sinktest.Events(1, 1))[0] != nil {
		if time.Now().After(deadline) {
			t.Fatal("still failing after the alarm cleared")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// AMQP sends a message's properties and headers as one frame of at most
// the negotiated frame_max, and RabbitMQ closes the connection on a larger
// one. A message whose header frame fills a frame exactly is delivered;
// one byte more is refused for its event before publishing, rather than
// failing the connection on every retry, and the other aggregate goes on.
func TestHeadersLargerThanAFrameAreAnEventError(t *testing.T) {
	srv := rabbittest.Shared(t)
	topology(t, srv, "frame", "frame", "#")
	s := newSink(t, srv, "frame", "f.{aggregate_type}")
	for _, err := range s.Deliver(t.Context(), sinktest.Events(1, 1)) {
		if err != nil {
			t.Fatal(err)
		}
	}
	frameMax := s.FrameMax()
	if frameMax <= 0 {
		t.Fatalf("frame_max %d after connecting", frameMax)
	}
	// withHeader is an event whose one extra header's value is n bytes.
	withHeader := func(n int) *sink.Event {
		ev := sinktest.Events(1, 1)[0]
		ev.Headers = json.RawMessage(`{"big":"` + strings.Repeat("h", n) + `"}`)
		return ev
	}
	msg, err := s.Message(withHeader(1))
	if err != nil {
		t.Fatal(err)
	}
	// The frame's payload may be frame_max less 8 bytes (type, channel,
	// size, end octet); the header's value makes up the rest.
	fits := frameMax - 8 - rabbitsink.HeaderFrameSize(msg) + 1
	evs := []*sink.Event{withHeader(fits), withHeader(fits + 1), sinktest.Events(1, 1)[0]}
	evs[2].AggregateID = "other"
	errs := s.Deliver(t.Context(), evs)
	if errs[0] != nil {
		t.Fatalf("a header frame of exactly frame_max: %v", errs[0])
	}
	if sink.Classify(errs[1]) != "event" || !strings.Contains(errs[1].Error(), "frame_max") {
		t.Fatalf("a header frame one byte over frame_max: %v, want an event error naming frame_max", errs[1])
	}
	if errs[2] != nil {
		t.Fatalf("another aggregate's event: %v", errs[2])
	}
	got := readQueue(srv, "frame")()
	if len(got) != 3 || got[1].ID != evs[0].ID || got[2].ID != evs[2].ID {
		t.Fatalf("queue holds %d messages, want the first event, then the one at the limit and the other aggregate's", len(got))
	}
}

// A broker whose max_message_size is below rabbitmq.max_message_bytes (as
// RabbitMQ 4's default of 16 MiB is below the sink's default) closes the
// channel on a larger message. The sink refuses that event as an event
// error, not an outage that would repeat on every retry, keeps the
// broker's limit and checks later messages against it before publishing;
// the events cut off with the channel are delivered on the next attempt.
func TestBrokerMaxMessageSizeIsLearned(t *testing.T) {
	srv := rabbittest.Shared(t)
	// Read when a channel opens: the sink's channel, opened below, has it.
	if out, err := srv.Ctl("eval", "application:set_env(rabbit, max_message_size, 65536)."); err != nil {
		t.Fatalf("lower max_message_size: %v\n%s", err, out)
	}
	t.Cleanup(func() { srv.Ctl("eval", "application:set_env(rabbit, max_message_size, 134217728).") })
	topology(t, srv, "maxsize", "maxsize", "#")
	s := newSink(t, srv, "maxsize", "m.{aggregate_type}")
	evs := sinktest.Events(4, 2)
	evs[1].Payload = json.RawMessage(`"` + strings.Repeat("x", 100<<10) + `"`)
	errs := s.Deliver(t.Context(), evs)
	if sink.Classify(errs[1]) != "event" || !strings.Contains(errs[1].Error(), "max_message_size") || !strings.Contains(errs[1].Error(), "65536") {
		t.Fatalf("errors %v: want the large event refused, naming the broker's max_message_size", errs)
	}
	if errs[3] == nil {
		t.Fatalf("the large event's aggregate went on past it")
	}
	// The next attempt: the large event is refused before publishing, the
	// others are delivered, on one channel that stays open.
	var retry []*sink.Event
	for i, err := range errs {
		if err != nil && i != 1 {
			retry = append(retry, evs[i])
		}
	}
	errs = s.Deliver(t.Context(), append([]*sink.Event{evs[1]}, retry...))
	if sink.Classify(errs[0]) != "event" || !strings.Contains(errs[0].Error(), "max_message_size") {
		t.Fatalf("the large event again: %v", errs[0])
	}
	for i, err := range errs[1:] {
		if retry[i].AggregateID == evs[1].AggregateID {
			if !errors.Is(err, sink.ErrHeldBack) {
				t.Errorf("%s behind the refused event: %v, want held back", retry[i].ID, err)
			}
		} else if err != nil {
			t.Errorf("%s: %v", retry[i].ID, err)
		}
	}
	got := readQueue(srv, "maxsize")()
	ids := map[string]bool{}
	for _, r := range got {
		ids[r.ID] = true
	}
	if !ids[evs[0].ID] || !ids[evs[2].ID] || ids[evs[1].ID] || ids[evs[3].ID] {
		t.Fatalf("queue holds %v, want the other aggregate's events only", ids)
	}
}
