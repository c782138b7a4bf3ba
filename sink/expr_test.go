package sink_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/compensa/compensa/sink"
)

func parseOne(t *testing.T, yaml string) sink.Spec {
	t.Helper()
	cfg, err := sink.Parse("s.yaml", []byte(yaml))
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	return cfg.Sinks[0]
}

func TestExampleFileUsesEveryFeature(t *testing.T) {
	t.Parallel()
	cfg, err := sink.LoadFile("testdata/cloudevents.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg.SetDefaultSource(sink.DefaultSource("shop", "", "outbox"))
	b, a, bus, k := cfg.Sinks[0], cfg.Sinks[1], cfg.Sinks[2], cfg.Sinks[3]
	if b.Format != sink.FormatCloudEvents || b.Source != "/shop/orders" || b.Filter == nil || b.Transform == nil {
		t.Errorf("billing: %+v", b)
	}
	if a.Format != sink.FormatCloudEventsStructured || a.Source != "/compensa/shop/public.outbox" {
		t.Errorf("audit: %+v", a)
	}
	ev := &sink.Event{ID: "e", EventType: "order.placed", AggregateType: "order", AggregateID: "o-1", Payload: json.RawMessage(`{"amount":120,"region":"eu"}`)}
	if got, err := bus.NATS.Subject.Render(ev, nil); err != nil || got != "outbox.eu.order.placed" {
		t.Errorf("bus subject %q %v", got, err)
	}
	if got, err := k.Kafka.Topic.Render(ev, nil); err != nil || got != "outbox.event.shared" {
		t.Errorf("kafka topic %q %v", got, err)
	}
	out, keep, err := b.Shape(ev)
	if err != nil || !keep {
		t.Fatalf("shape: %v %v", keep, err)
	}
	if string(out.Payload) != `{"label":"order o-1 in eu","large":true,"order":"o-1","total":120}` {
		t.Errorf("transformed payload %s", out.Payload)
	}
	if string(ev.Payload) != `{"amount":120,"region":"eu"}` {
		t.Errorf("the event handed in was changed: %s", ev.Payload)
	}
	ev.Payload = json.RawMessage(`{"amount":99.5,"region":"eu"}`)
	if _, keep, err := b.Shape(ev); err != nil || keep {
		t.Errorf("filter kept amount 99.5: %v", err)
	}
}

// TestExpressionProblemsAtOnce: every expression mistake is reported with
// its file:line:col and a fix, in one error.
func TestExpressionProblemsAtOnce(t *testing.T) {
	t.Parallel()
	_, err := sink.Parse("s.yaml", []byte(`sinks:
  - name: a
    format: cloudevent
    filter: "${ event.payload.n + }"
    transform: { bad: "${ nope.x }", ok: "${ event.id }" }
    nats: { url: "nats://127.0.0.1:4222", stream: S, subject: "outbox.${ event.payload.region }.{event_type}" }
  - name: b
    filter: "${ 'x' }"
    source: /y
    kafka: { brokers: ["127.0.0.1:9092"], topic: "t.${ event.payload.x" }
  - name: c
    filter: "event.payload.n > 1"
    webhook: { url: "http://127.0.0.1:1/x" }
`))
	if !errors.Is(err, sink.ErrConfig) {
		t.Fatalf("err = %v", err)
	}
	msg := err.Error()
	for _, want := range []string{
		`s.yaml:3:13: format "cloudevent" is not known; write envelope (the default), cloudevents (binary content mode) or cloudevents-structured (did you mean "cloudevents"?)`,
		`s.yaml:4:35: expression ${ event.payload.n + }: Syntax error:`,
		`s.yaml:5:27: expression ${ nope.x }: undeclared reference to 'nope' in transform.bad; the one name in scope is event`,
		`s.yaml:8:13: filter ${ 'x' } gives string, not true or false;`,
		`s.yaml:9:13: source is set but the sink sends the envelope`,
		`s.yaml:10:50: kafka.topic "t.${ event.payload.x" has a '${' without its '}'`,
		`s.yaml:12:13: filter is not one ${ … } expression;`,
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("missing %q in:\n%s", want, msg)
		}
	}
	if n := strings.Count(msg, "\n") + 1; n != 7 {
		t.Errorf("%d problems, want 7:\n%s", n, msg)
	}
}

// An expression's result fills one token and is cleaned exactly like a
// placeholder's value: a payload cannot move a message to another subject
// or topic than the template's.
func TestExpressionResultsAreCleanedLikePlaceholders(t *testing.T) {
	t.Parallel()
	s := parseOne(t, `sinks:
  - name: a
    nats: { url: "nats://127.0.0.1:4222", stream: S, subject: "outbox.${ event.payload.region }.x" }
`)
	clean := func(v string) string { return strings.NewReplacer(".", "_", "*", "_", ">", "_", " ", "_").Replace(v) }
	for region, want := range map[string]string{"eu": "outbox.eu.x", "eu.>": "outbox.eu__.x", "a.b.c": "outbox.a_b_c.x", "* >": "outbox.___.x", "": "outbox._.x"} {
		ev := &sink.Event{Payload: json.RawMessage(`{"region":` + strings.TrimSpace(mustJSON(region)) + `}`)}
		got, err := s.NATS.Subject.Render(ev, clean)
		if err != nil || got != want {
			t.Errorf("region %q: %q %v, want %q", region, got, err, want)
		}
		placeholder, _ := sink.ParseTemplate("outbox.{aggregate_id}.x")
		if p := placeholder.Expand(&sink.Event{AggregateID: region}, clean); p != got {
			t.Errorf("region %q: expression gives %q, the placeholder %q", region, got, p)
		}
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

type recordingSink struct{ got []*sink.Event }

func (r *recordingSink) Deliver(_ context.Context, evs []*sink.Event) []error {
	r.got = append(r.got, evs...)
	return make([]error, len(evs))
}
func (r *recordingSink) Close() error { return nil }

// An expression that fails for one event refuses that event with the
// reason (sink.EventError, parked by the fan-out) and holds back the later
// events of its aggregate; other aggregates go on, transformed.
func TestRuntimeExpressionErrorRefusesTheEvent(t *testing.T) {
	t.Parallel()
	s := parseOne(t, `sinks:
  - name: a
    filter: "${ event.payload.n % 2 == 0 }"
    transform: { n: "${ event.payload.n }", half: "${ event.payload.n / 2 }" }
    webhook: { url: "http://127.0.0.1:1/x" }
`)
	ev := func(id, agg, payload string) *sink.Event {
		return &sink.Event{ID: id, AggregateType: "o", AggregateID: agg, EventType: "t", Payload: json.RawMessage(payload)}
	}
	evs := []*sink.Event{ev("1", "a", `{"n":2}`), ev("2", "a", `{"m":1}`), ev("3", "a", `{"n":4}`), ev("4", "b", `{"n":3}`),
		ev("5", "b", `{"n":"x"}`), ev("6", "c", `{"n":6}`)}
	rec := &recordingSink{}
	errs := sink.Shaped(s, rec).Deliver(context.Background(), evs)
	if errs[0] != nil || errs[3] != nil || errs[5] != nil {
		t.Errorf("delivered or filtered events failed: %v", errs)
	}
	for _, i := range []int{1, 4} {
		if errs[i] == nil || sink.Classify(errs[i]) != "event" || !strings.Contains(errs[i].Error(), "filter: expression ${ event.payload.n % 2 == 0 } failed") {
			t.Errorf("event %d: %v, want a refusal naming the filter", i+1, errs[i])
		}
	}
	if !errors.Is(errs[2], sink.ErrHeldBack) {
		t.Errorf("event 3: %v, want held back behind event 2", errs[2])
	}
	var ids []string
	for _, e := range rec.got {
		ids = append(ids, e.ID+"="+string(e.Payload))
	}
	if strings.Join(ids, " ") != `1={"half":1,"n":2} 6={"half":3,"n":6}` {
		t.Errorf("sent %v", ids)
	}
	// The cost limit is an error like any other: refused, never a hang.
	costly := parseOne(t, `sinks:
  - name: a
    transform: "${ event.payload.xs.map(a, event.payload.xs.map(b, event.payload.xs.map(c, a + b + c))) }"
    webhook: { url: "http://127.0.0.1:1/x" }
`)
	big := make([]int, 300)
	b, _ := json.Marshal(map[string]any{"xs": big})
	errs = sink.Shaped(costly, rec).Deliver(context.Background(), []*sink.Event{ev("7", "d", string(b))})
	if errs[0] == nil || !strings.Contains(errs[0].Error(), "cost limit") {
		t.Errorf("costly transform: %v", errs[0])
	}
}
