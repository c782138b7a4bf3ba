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

// Redis reads no value longer than its proto-max-bulk-len and closes the
// connection on one, failing every command sent with it, on every retry.
// The sink reads the setting when it connects: an entry whose largest
// value (the payload field) is exactly that long is added, one byte more
// is refused for its event before it is sent, its aggregate's next event
// is held back (not added ahead of it), and the other aggregate's event
// is added.
func TestValueLargerThanTheServerTakesIsAnEventError(t *testing.T) {
	srv := redistest.Start(t)
	const limit = 1 << 20 // the smallest proto-max-bulk-len Redis allows
	if err := client(t, srv).ConfigSet(t.Context(), "proto-max-bulk-len", "1mb").Err(); err != nil {
		t.Fatal(err)
	}
	s := newSink(t, srv, "bulk", 0)
	// withPayload is an event whose envelope is n bytes long.
	withPayload := func(n int) *sink.Event {
		ev := sinktest.Events(1, 1)[0]
		ev.Payload = json.RawMessage(`""`)
		pad := n - len(ev.Envelope())
		ev.Payload = json.RawMessage(`"` + strings.Repeat("x", pad) + `"`)
		if len(ev.Envelope()) != n {
			t.Fatalf("envelope of %d bytes, want %d", len(ev.Envelope()), n)
		}
		return ev
	}
	evs := []*sink.Event{withPayload(limit), withPayload(limit + 1), sinktest.Events(1, 1)[0]}
	evs[2].AggregateID = "other"
	evs = append(evs, sinktest.Events(1, 1)[0]) // the large one's aggregate
	errs := s.Deliver(t.Context(), evs)
	if errs[0] != nil {
		t.Fatalf("a payload field of exactly proto-max-bulk-len: %v (%v)", errs[0], errs)
	}
	if sink.Classify(errs[1]) != "event" || !strings.Contains(errs[1].Error(), "proto-max-bulk-len") || !strings.Contains(errs[1].Error(), "1048576") {
		t.Fatalf("one byte more: %v, want an event error naming proto-max-bulk-len and the limit", errs[1])
	}
	if errs[2] != nil || !errors.Is(errs[3], sink.ErrHeldBack) {
		t.Fatalf("the other aggregate's event: %v; the large one's next: %v, want delivered and held back", errs[2], errs[3])
	}
	got := readStream(t, srv, "bulk")()
	if len(got) != 2 || got[0].ID != evs[0].ID || got[1].ID != evs[2].ID {
		t.Fatalf("%d entries, want the event at the limit and the other aggregate's", len(got))
	}
}

// A server that refuses CONFIG (renamed away, as managed services and
// ACLs do) leaves Redis's default limit, and the sink delivers.
func TestConfigRefusedLeavesTheDefault(t *testing.T) {
	srv := redistest.Start(t, "--rename-command", "CONFIG", "")
	s := newSink(t, srv, "noconfig", 0)
	for _, err := range s.Deliver(t.Context(), sinktest.Events(3, 2)) {
		if err != nil {
			t.Fatal(err)
		}
	}
}

// A Redis Cluster node refuses the script (its two keys are in different
// slots): the sink says that Redis Cluster is not supported, as an outage
// of the whole sink rather than a refusal of each event.
func TestClusterIsNotSupported(t *testing.T) {
	srv := redistest.Start(t, "--cluster-enabled", "yes")
	s := newSink(t, srv, "clustered", 0)
	for _, err := range s.Deliver(t.Context(), sinktest.Events(2, 2)) {
		if err == nil || sink.Classify(err) != "down" || !strings.Contains(err.Error(), "Redis Cluster is not supported") {
			t.Fatalf("on a cluster node: %v, want an outage saying Redis Cluster is not supported", err)
		}
	}
	// Replies only a cluster node gives say so too (a proxy may hide INFO).
	for _, reply := range []string{"MOVED 3999 127.0.0.1:6381", "CROSSSLOT Keys in request don't hash to the same slot",
		"CLUSTERDOWN Hash slot not served", "ASK 3999 127.0.0.1:6381", "TRYAGAIN Multiple keys request during rehashing of slot"} {
		err := s.Classify(redisReply(reply))
		if sink.Classify(err) != "down" || !strings.Contains(err.Error(), "Redis Cluster is not supported") || !strings.Contains(err.Error(), reply) {
			t.Errorf("%q: %v", reply, err)
		}
	}
	// A value longer than a server's lowered proto-max-bulk-len, when the
	// reply comes back, refuses its event.
	if err := s.Classify(redisReply("ERR Protocol error: invalid bulk length")); sink.Classify(err) != "event" {
		t.Errorf("invalid bulk length: %v, want an event error", err)
	}
}

// redisReply is an error as the server answers it.
type redisReply string

func (e redisReply) Error() string { return string(e) }
func (redisReply) RedisError()     {}
