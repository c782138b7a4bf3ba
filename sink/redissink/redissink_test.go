package redissink_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/compensa/compensa/sink"
	"github.com/compensa/compensa/sink/redissink"
	"github.com/compensa/compensa/sink/sinktest"
	"github.com/compensa/compensa/test/redistest"
)

// TestMain stops the shared server before goleak checks, so that its
// goroutines are not taken for leaks.
func TestMain(m *testing.M) {
	code := m.Run()
	redistest.StopShared()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			os.Stderr.WriteString("goleak: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}

func client(t *testing.T, srv *redistest.Server) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), Password: srv.Password})
	t.Cleanup(func() { c.Close() })
	return c
}

// readStream returns every entry of the stream, in stream order.
func readStream(t *testing.T, srv *redistest.Server, stream string) func() []sinktest.Received {
	c := client(t, srv)
	return func() []sinktest.Received {
		xs, err := c.XRange(context.Background(), stream, "-", "+").Result()
		if err != nil {
			return nil
		}
		out := make([]sinktest.Received, 0, len(xs))
		for _, x := range xs {
			h := map[string]string{}
			for k, v := range x.Values {
				h[k], _ = v.(string)
			}
			env0 := h["payload"]
			delete(h, "payload")
			var env struct {
				Payload json.RawMessage `json:"payload"`
				Raw     string          `json:"payload_base64"`
			}
			json.Unmarshal([]byte(env0), &env)
			raw, _ := base64.StdEncoding.DecodeString(env.Raw)
			out = append(out, sinktest.Received{ID: h["id"], Headers: h, Payload: env.Payload, Raw: raw})
		}
		return out
	}
}

func newSink(t *testing.T, srv *redistest.Server, stream string, maxLen int) *redissink.Sink {
	t.Helper()
	s, err := redissink.New(redissink.Config{URL: srv.URL(), Password: srv.Password, Stream: sink.MustTemplate(stream),
		MaxLen: maxLen, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	srv := redistest.Shared(t)
	sinktest.Run(t, sinktest.Harness{
		New: func(t *testing.T) (sink.Sink, func() []sinktest.Received) {
			stream := "c" + strings.ReplaceAll(uuid.NewString(), "-", "")[:12]
			return newSink(t, srv, stream, 0), readStream(t, srv, stream)
		},
		// A resend within the dedupe window adds no entry.
		Dedupes: true,
	})
}

// The entry: the outbox id, the row's fields and headers, the envelope as
// payload; a second delivery of the same id (a replay) adds nothing and
// leaves a dedupe key with the window as its time to live.
func TestEntryFieldsAndReplay(t *testing.T) {
	srv := redistest.Shared(t)
	s := newSink(t, srv, "fields.{aggregate_type}", 0)
	ev := sinktest.Events(1, 1)[0]
	ev.Headers = json.RawMessage(`{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01","id":"forged","payload":"forged"}`)
	for range 3 {
		if err := s.Deliver(t.Context(), []*sink.Event{ev})[0]; err != nil {
			t.Fatal(err)
		}
	}
	c := client(t, srv)
	xs, err := c.XRange(t.Context(), "fields.order", "-", "+").Result()
	if err != nil || len(xs) != 1 {
		t.Fatalf("entries %v %v, want one after three deliveries", xs, err)
	}
	v := xs[0].Values
	for k, want := range map[string]string{"id": ev.ID, "event_type": ev.EventType, "aggregate_type": "order", "aggregate_id": ev.AggregateID,
		"tenant_id": ev.TenantID, "correlation_id": ev.CorrelationID, "payload": string(ev.Envelope()),
		"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"} {
		if v[k] != want {
			t.Errorf("field %s = %v, want %q", k, v[k], want)
		}
	}
	ttl, err := c.PTTL(t.Context(), redissink.DedupeKey("fields.order", ev.ID)).Result()
	if err != nil || ttl < 23*time.Hour || ttl > 24*time.Hour {
		t.Errorf("dedupe key's time to live %s (%v), want about 24h", ttl, err)
	}
	if got, _ := c.Get(t.Context(), redissink.DedupeKey("fields.order", ev.ID)).Result(); got != xs[0].ID {
		t.Errorf("dedupe key holds %q, want the entry id %q", got, xs[0].ID)
	}
}

// A value fills one part of the key: its dots, colons, braces and spaces
// cannot reach another key, a dedupe key or another cluster slot.
func TestEventDataCannotChooseTheKey(t *testing.T) {
	srv := redistest.Shared(t)
	s := newSink(t, srv, "keys.{aggregate_type}", 0)
	for in, want := range map[string]string{
		"order":              "keys.order",
		"order:dedupe:x":     "keys.order_dedupe_x",
		"{tag}.a b\n":        "keys._tag__a_b_",
		"":                   "keys._",
		"../../etc/passwd":   "keys.__/__/etc/passwd",
		"ünïcode-stays_here": "keys.ünïcode-stays_here",
	} {
		if got := s.Stream(&sink.Event{AggregateType: in}); got != want {
			t.Errorf("%q: stream %q, want %q", in, got, want)
		}
	}
	ev := sinktest.Events(1, 1)[0]
	ev.AggregateType = "x:dedupe:" + ev.ID
	if err := s.Deliver(t.Context(), []*sink.Event{ev})[0]; err != nil {
		t.Fatal(err)
	}
	c := client(t, srv)
	if n, _ := c.XLen(t.Context(), "keys.x_dedupe_"+ev.ID).Result(); n != 1 {
		t.Fatalf("the entry is not in its cleaned stream")
	}
}

// MAXLEN ~ n keeps the stream near n entries.
func TestApproximateTrimming(t *testing.T) {
	srv := redistest.Shared(t)
	s := newSink(t, srv, "trim", 100)
	for range 10 {
		for _, err := range s.Deliver(t.Context(), sinktest.Events(100, 7)) {
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	n, err := client(t, srv).XLen(t.Context(), "trim").Result()
	if err != nil || n < 100 || n > 300 {
		t.Fatalf("stream length %d (%v) after 1000 adds with maxlen ~100", n, err)
	}
}

// A stream key holding another type refuses the events for that key only.
func TestWrongTypeIsAnEventError(t *testing.T) {
	srv := redistest.Shared(t)
	c := client(t, srv)
	c.Set(t.Context(), "wrong.order", "a string", 0)
	s := newSink(t, srv, "wrong.{aggregate_id}", 0)
	evs := sinktest.Events(2, 2)
	evs[0].AggregateID = "order"
	errs := s.Deliver(t.Context(), evs)
	if sink.Classify(errs[0]) != "event" || errs[1] != nil {
		t.Fatalf("errors %v, want the first refused as an event error and the second delivered", errs)
	}
}

// A wrong password fails as an outage whose message never holds it.
func TestCredentialsNeverInErrors(t *testing.T) {
	srv := redistest.Shared(t)
	const secret = "s3cret-never-shown"
	s, err := redissink.New(redissink.Config{URL: srv.URL(), Password: secret, Stream: sink.MustTemplate("x"), Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	err = s.Deliver(t.Context(), sinktest.Events(1, 1))[0]
	if err == nil || sink.Classify(err) != "down" || strings.Contains(err.Error(), secret) {
		t.Fatalf("wrong password: %v", err)
	}
}

// Redis killed with -9 and started again (appendfsync always): deliveries
// fail while it is away, succeed once it is back, nothing acknowledged is
// lost, the script is loaded again, and a replay of what was acknowledged
// adds nothing.
func TestServerKilledAndBack(t *testing.T) {
	srv := redistest.Start(t)
	s := newSink(t, srv, "kill", 0)
	before := sinktest.Events(50, 4)
	for _, err := range s.Deliver(t.Context(), before) {
		if err != nil {
			t.Fatal(err)
		}
	}
	srv.Kill()
	evs := sinktest.Events(6, 2)
	for _, err := range s.Deliver(t.Context(), evs) {
		if err == nil || sink.Classify(err) == "event" && !errors.Is(err, sink.ErrHeldBack) {
			t.Fatalf("delivered or refused while the server was down: %v", err)
		}
	}
	srv.Restart(t)
	deadline := time.Now().Add(20 * time.Second)
	for {
		ok := true
		for _, err := range s.Deliver(t.Context(), append(append([]*sink.Event{}, before...), evs...)) {
			ok = ok && err == nil
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("still failing after the server came back")
		}
		time.Sleep(100 * time.Millisecond)
	}
	got := readStream(t, srv, "kill")()
	if len(got) != len(before)+len(evs) {
		t.Fatalf("%d entries, want %d: one per event, the replay adding none", len(got), len(before)+len(evs))
	}
	sinktest.RequireOrder(t, append(append([]*sink.Event{}, before...), evs...), got)
}
