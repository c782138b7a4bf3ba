package natssink_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/compensa/compensa/sink"
	"github.com/compensa/compensa/sink/natssink"
	"github.com/compensa/compensa/sink/sinktest"
	"github.com/compensa/compensa/test/natstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// readStream returns every message of the stream, in stream order.
func readStream(t *testing.T, url, stream string) func() []sinktest.Received {
	return func() []sinktest.Received {
		nc, err := nats.Connect(url)
		if err != nil {
			return nil
		}
		defer nc.Close()
		js, _ := jetstream.New(nc)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		st, err := js.Stream(ctx, stream)
		if err != nil {
			return nil
		}
		info, err := st.Info(ctx)
		if err != nil {
			return nil
		}
		var out []sinktest.Received
		for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
			m, err := st.GetMsg(ctx, seq)
			if err != nil {
				continue
			}
			h := map[string]string{}
			for k := range m.Header {
				h[k] = m.Header.Get(k)
			}
			out = append(out, sinktest.Received{ID: m.Header.Get(jetstream.MsgIDHeader), Headers: h, Payload: m.Data, Raw: m.Data})
		}
		return out
	}
}

func TestConformance(t *testing.T) {
	srv := natstest.Start(t)
	sinktest.Run(t, sinktest.Harness{
		New: func(t *testing.T) (sink.Sink, func() []sinktest.Received) {
			stream := "S" + strings.ReplaceAll(uuid.NewString(), "-", "")[:12]
			s, err := natssink.New(natssink.Config{URL: srv.URL(), Stream: stream, Subject: sink.MustTemplate(stream + ".{aggregate_type}.{event_type}"), Timeout: 2 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s, readStream(t, srv.URL(), stream)
		},
		Break:   func(*testing.T) { srv.Stop() },
		Heal:    func(t *testing.T) { srv.Restart(t) },
		Dedupes: true,
	})
}

func TestStreamCreatedWithDuplicateWindow(t *testing.T) {
	srv := natstest.Start(t)
	s, err := natssink.New(natssink.Config{URL: srv.URL(), Stream: "OUTBOX", Subject: sink.MustTemplate("outbox.{aggregate_type}.{event_type}")})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, err := range s.Deliver(t.Context(), sinktest.Events(1, 1)) {
		if err != nil {
			t.Fatal(err)
		}
	}
	nc, _ := nats.Connect(srv.URL())
	defer nc.Close()
	js, _ := jetstream.New(nc)
	st, err := js.Stream(t.Context(), "OUTBOX")
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	if cfg.Duplicates < 2*time.Minute || len(cfg.Subjects) != 1 || cfg.Subjects[0] != "outbox.>" {
		t.Fatalf("stream config: duplicates %s subjects %v", cfg.Duplicates, cfg.Subjects)
	}
}

func TestTooLargeIsAnEventError(t *testing.T) {
	srv := natstest.Start(t)
	s, err := natssink.New(natssink.Config{URL: srv.URL(), Stream: "BIG", Subject: sink.MustTemplate("big.{event_type}")})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	evs := sinktest.Events(2, 1)
	evs[0].Payload = []byte(`"` + strings.Repeat("x", 2<<20) + `"`)
	errs := s.Deliver(t.Context(), evs)
	if sink.Classify(errs[0]) != "event" || errs[1] == nil {
		t.Fatalf("errors %v: want the large event refused as an event error and the next held back", errs)
	}
}

// JetStream keeps a message's header block with a 16-bit length and
// refuses a larger one, whatever max_payload allows: a block of exactly
// natssink.MaxHeaderBytes is stored, one byte more is refused for its
// event before publishing (not an outage that would repeat for ever), and
// the other aggregate's event is delivered.
func TestHeadersLargerThanJetStreamStoresAreAnEventError(t *testing.T) {
	srv := natstest.Start(t)
	cfg := natssink.Config{URL: srv.URL(), Stream: "HDR", Subject: sink.MustTemplate("hdr.{aggregate_type}"), Timeout: 2 * time.Second}
	s, err := natssink.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// withHeaders is an event whose header block, with the two headers
	// publishing adds, is n bytes long.
	withHeaders := func(n int) *sink.Event {
		ev := sinktest.Events(1, 1)[0]
		ev.Headers = []byte(`{"big":""}`)
		msg, err := natssink.Message(cfg, ev)
		if err != nil {
			t.Fatal(err)
		}
		size := len("NATS/1.0\r\n\r\n")
		for k, vs := range msg.Header {
			size += len(k) + len(vs[0]) + 4
		}
		size += len(jetstream.MsgIDHeader) + len(ev.ID) + 4 + len(jetstream.ExpectedStreamHeader) + len(cfg.Stream) + 4
		ev.Headers = []byte(`{"big":"` + strings.Repeat("h", n-size) + `"}`)
		return ev
	}
	evs := []*sink.Event{withHeaders(natssink.MaxHeaderBytes), withHeaders(natssink.MaxHeaderBytes + 1), sinktest.Events(1, 1)[0]}
	evs[2].AggregateID = "other"
	errs := s.Deliver(t.Context(), evs)
	if errs[0] != nil {
		t.Fatalf("a header block of exactly %d bytes: %v", natssink.MaxHeaderBytes, errs[0])
	}
	if sink.Classify(errs[1]) != "event" || !strings.Contains(errs[1].Error(), "JetStream stores") {
		t.Fatalf("one byte more: %v, want an event error", errs[1])
	}
	if errs[2] != nil {
		t.Fatalf("the other aggregate's event: %v", errs[2])
	}
}

// A subject longer than a protocol line takes (an event type of 5,000
// characters) is refused for that event; the connection and the other
// aggregates' events are not affected.
func TestOverlongSubjectIsAnEventError(t *testing.T) {
	srv := natstest.Start(t)
	s, err := natssink.New(natssink.Config{URL: srv.URL(), Stream: "LONG", Subject: sink.MustTemplate("long.{event_type}"), Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	evs := sinktest.Events(3, 3)
	evs[0].EventType = strings.Repeat("t", 5000)
	errs := s.Deliver(t.Context(), evs)
	if sink.Classify(errs[0]) != "event" || errs[1] != nil || errs[2] != nil {
		t.Fatalf("errors %v: want the overlong subject refused as an event error and the other aggregates delivered", errs)
	}
	for _, err := range s.Deliver(t.Context(), sinktest.Events(2, 2)) {
		if err != nil {
			t.Fatalf("the sink no longer delivers after an overlong subject: %v", err)
		}
	}
}

// Event data fills one token of a subject each: a value's dots, wildcards
// and spaces cannot add tokens or make a wildcard; {raw(…)} keeps a value's
// dots as separators and cleans each token. The message arrives on the
// subject so built.
func TestSubjectTokensFromEventData(t *testing.T) {
	srv := natstest.Start(t)
	for tpl, c := range map[string]struct {
		ev   sink.Event
		want string
	}{
		"orders.{aggregate_id}.{event_type}":        {sink.Event{AggregateID: "1.refund.>.*", EventType: "payment captured"}, "orders.1_refund____.payment_captured"},
		"orders.{aggregate_type}.{raw(event_type)}": {sink.Event{AggregateType: "order", EventType: "payment.captured"}, "orders.order.payment.captured"},
		"orders.{raw(aggregate_id)}":                {sink.Event{AggregateID: "1..>.a b"}, "orders.1._._.a_b"},
	} {
		s, err := natssink.New(natssink.Config{URL: srv.URL(), Stream: "TOKENS", Subject: sink.MustTemplate(tpl)})
		if err != nil {
			t.Fatal(err)
		}
		if got := s.Subject(&c.ev); got != c.want {
			t.Errorf("%s: subject %q, want %q", tpl, got, c.want)
		}
		ev := sinktest.Events(1, 1)[0]
		ev.AggregateType, ev.AggregateID, ev.EventType = c.ev.AggregateType, c.ev.AggregateID, c.ev.EventType
		for _, err := range s.Deliver(t.Context(), []*sink.Event{ev}) {
			if err != nil {
				t.Fatalf("%s: %v", tpl, err)
			}
		}
		s.Close()
	}
	nc, _ := nats.Connect(srv.URL())
	defer nc.Close()
	js, _ := jetstream.New(nc)
	st, err := js.Stream(t.Context(), "TOKENS")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.GetLastMsgForSubject(t.Context(), "orders.1_refund____.payment_captured"); err != nil {
		t.Errorf("the message did not arrive on its one-token subject: %v", err)
	}
}
