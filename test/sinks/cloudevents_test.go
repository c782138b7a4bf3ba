package sinks

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/sink/webhook"
	"github.com/compensa/compensa/test/cetest"
	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/relaytest"
	"github.com/compensa/compensa/test/testkit"
)

const ceTraceID = "0af7651916cd43dd8448eb211c80319c"

// ceEndpoint is a webhook endpoint that checks each request's signature
// over the body it received and decodes it with the CloudEvents SDK's HTTP
// binding. hold, when set, keeps the first request unanswered until it is
// closed (the relay is killed meanwhile).
type ceEndpoint struct {
	srv  *httptest.Server
	mu   sync.Mutex
	got  []*event.Event
	bad  []string
	hold chan struct{}
	held chan struct{} // closed when the held request arrived
	once sync.Once
}

func newCEEndpoint(t *testing.T, hold bool) *ceEndpoint {
	e := &ceEndpoint{held: make(chan struct{})}
	if hold {
		e.hold = make(chan struct{})
	}
	key, _ := webhook.DecodeSecret(secret)
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		ev, err := cetest.HTTPParts(r.Header, body)
		e.mu.Lock()
		switch {
		case !webhook.Verify(key, r.Header.Get("webhook-id"), r.Header.Get("webhook-timestamp"), body, r.Header.Get("webhook-signature")):
			e.bad = append(e.bad, "signature does not verify over the body sent")
		case err != nil:
			e.bad = append(e.bad, fmt.Sprintf("SDK: %v", err))
		case ev.ID() != r.Header.Get("webhook-id"):
			e.bad = append(e.bad, fmt.Sprintf("id %s, webhook-id %s", ev.ID(), r.Header.Get("webhook-id")))
		default:
			e.got = append(e.got, ev)
		}
		e.mu.Unlock()
		if e.hold != nil {
			first := false
			e.once.Do(func() { first = true })
			if first {
				close(e.held)
				<-e.hold
				return // the relay is gone: no answer reaches it
			}
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *ceEndpoint) events() ([]*event.Event, []string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]*event.Event(nil), e.got...), append([]string(nil), e.bad...)
}

// byID keeps the first event of each id and counts each id.
func byID(evs []*event.Event) (map[string]*event.Event, map[string]int) {
	first, n := map[string]*event.Event{}, map[string]int{}
	for _, e := range evs {
		if first[e.ID()] == nil {
			first[e.ID()] = e
		}
		n[e.ID()]++
	}
	return first, n
}

type ceWant struct {
	id, aggregate, eventType string
	tenant, corr, cause      uuid.UUID
	n                        int
}

// checkCE checks every attribute of e against the row it came from.
func checkCE(t *testing.T, sinkName string, e *event.Event, w ceWant, source string) {
	t.Helper()
	if err := e.Validate(); err != nil {
		t.Errorf("%s: %s is not a valid CloudEvent: %v", sinkName, w.id, err)
	}
	if e.SpecVersion() != "1.0" || e.Source() != source || e.Type() != w.eventType || e.Subject() != w.aggregate ||
		e.DataContentType() != "application/json" || e.Time().IsZero() || time.Since(e.Time()) > 10*time.Minute {
		t.Errorf("%s: attributes of %s: %s", sinkName, w.id, e)
	}
	x := e.Extensions()
	if x["tenantid"] != w.tenant.String() || x["aggregatetype"] != "order" || x["correlationid"] != w.corr.String() ||
		x["causationid"] != w.cause.String() || x["tracestate"] != "vendor=7" {
		t.Errorf("%s: extensions of %s: %v", sinkName, w.id, x)
	}
	if tp, _ := x["traceparent"].(string); !strings.HasPrefix(tp, "00-"+ceTraceID+"-") {
		t.Errorf("%s: traceparent of %s is %q, want one of trace %s", sinkName, w.id, tp, ceTraceID)
	}
	var data map[string]int
	if err := e.DataAs(&data); err != nil || data["n"] != w.n {
		t.Errorf("%s: data of %s: %s (%v)", sinkName, w.id, e.Data(), err)
	}
}

// TestCloudEventsThroughTheRelaySurviveAKill: a webhook in each CloudEvents
// mode and NATS in binary mode, through the real relay; every attribute as
// the SDK decodes it. The relay is killed with -9 while the binary
// webhook's first request is unanswered: after the restart that event is
// delivered again under the same id, and NATS keeps one message per id
// (its ce-id is the Nats-Msg-Id JetStream deduplicates by).
func TestCloudEventsThroughTheRelaySurviveAKill(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ns := startNATS(t)
	binary, structured := newCEEndpoint(t, true), newCEEndpoint(t, false)
	file := filepath.Join(t.TempDir(), "sinks.yaml")
	os.WriteFile(file, []byte(fmt.Sprintf(`sinks:
  - name: ce-binary
    format: cloudevents
    source: /shop/orders
    webhook: { url: "%s/events", secret_env: CE_SECRET, timeout: 30s }
  - name: ce-structured
    format: cloudevents-structured
    webhook: { url: "%s/events", secret_env: CE_SECRET, timeout: 30s }
  - name: ce-bus
    format: cloudevents
    source: /shop/orders
    nats: { url: "%s", stream: CE, subject: "ce.{aggregate_type}.{raw(event_type)}", timeout: 5s }
`, binary.srv.URL, structured.srv.URL, ns.url())), 0o600)
	env := []string{"CE_SECRET=" + secret}
	args := []string{"--database-url", db.URL, "--slot", db.Slot, "--publication", db.Publication, "--status-interval", "200ms",
		"--workers", "1", "--sinks", file}
	p := relaytest.Start(t, env, args...)

	u, _ := url.Parse(db.URL)
	defaultSource := "/compensa/" + strings.TrimPrefix(u.Path, "/") + "/public.outbox"
	const n = 4
	want := map[string]ceWant{}
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		var msgs []outbox.Message
		for i := range n {
			m := outbox.Message{ID: uuid.New(), TenantID: uuid.New(), AggregateType: "order", AggregateID: fmt.Sprintf("o-%d", i%2),
				EventType: "order.placed", Payload: map[string]int{"n": i}, CorrelationID: uuid.New(), CausationID: uuid.New(),
				Headers: map[string]string{"traceparent": "00-" + ceTraceID + "-b7ad6b7169203331-01", "tracestate": "vendor=7"}}
			msgs = append(msgs, m)
			want[m.ID.String()] = ceWant{m.ID.String(), m.AggregateID, m.EventType, m.TenantID, m.CorrelationID, m.CausationID, i}
		}
		return outbox.Write(ctx, tx, msgs...)
	})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-binary.held:
	case <-time.After(60 * time.Second):
		t.Fatalf("the binary webhook got no request\n%s", p.Output())
	}
	testkit.WaitFor(t, 30*time.Second, "the structured webhook to get every event", func() bool {
		evs, _ := structured.events()
		first, _ := byID(evs)
		return len(first) == n
	})
	held, _ := binary.events()
	heldID := held[0].ID()
	p.Kill()
	close(binary.hold)
	p = relaytest.Start(t, env, args...)
	testkit.WaitFor(t, 60*time.Second, "the binary webhook to get every event after the restart", func() bool {
		evs, _ := binary.events()
		first, _ := byID(evs)
		return len(first) == n
	})

	for name, ep := range map[string]*ceEndpoint{"ce-binary": binary, "ce-structured": structured} {
		evs, bad := ep.events()
		if len(bad) > 0 {
			t.Errorf("%s: %v", name, bad)
		}
		source := "/shop/orders"
		if name == "ce-structured" {
			source = defaultSource
		}
		first, _ := byID(evs)
		for id, w := range want {
			if e := first[id]; e == nil {
				t.Errorf("%s: %s not delivered", name, id)
			} else {
				checkCE(t, name, e, w, source)
			}
		}
	}
	evs, _ := binary.events()
	if _, count := byID(evs); count[heldID] < 2 {
		t.Errorf("the event in flight at the kill (%s) arrived %d times, want again after the restart under the same id", heldID, count[heldID])
	}

	// NATS: one message per id; ce-id = Nats-Msg-Id = the outbox id.
	var msgs []*event.Event
	testkit.WaitFor(t, 30*time.Second, "every event on the NATS stream", func() bool {
		msgs = readCENATS(t, ns.url(), "CE")
		return len(msgs) >= n
	})
	first, count := byID(msgs)
	for id, w := range want {
		if first[id] == nil {
			t.Errorf("ce-bus: %s not on the stream", id)
			continue
		}
		if count[id] != 1 {
			t.Errorf("ce-bus: %s is %d times on the stream", id, count[id])
		}
		checkCE(t, "ce-bus", first[id], w, "/shop/orders")
	}
	p.Stop(30 * time.Second)
}

// readCENATS decodes every message of the stream with the SDK; a message
// whose ce-id is not its Nats-Msg-Id fails the test.
func readCENATS(t *testing.T, u, stream string) []*event.Event {
	nc, err := nats.Connect(u, nats.Timeout(2*time.Second))
	if err != nil {
		return nil
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return nil
	}
	info, err := st.Info(ctx)
	if err != nil {
		return nil
	}
	var out []*event.Event
	for seq := uint64(1); seq <= info.State.LastSeq; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			continue
		}
		hs := map[string]string{}
		for k, v := range m.Header {
			hs[k] = v[0]
		}
		e, err := cetest.NATS(hs, m.Data)
		if err != nil {
			t.Errorf("NATS message %d: SDK: %v (%v)", seq, err, hs)
			continue
		}
		if e.ID() != m.Header.Get(jetstream.MsgIDHeader) {
			t.Errorf("NATS message %d: ce-id %s, Nats-Msg-Id %s", seq, e.ID(), m.Header.Get(jetstream.MsgIDHeader))
		}
		out = append(out, e)
	}
	return out
}
