package sinks

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"

	"github.com/compensa/compensa/cdc"
	"github.com/compensa/compensa/correlator"
	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/sink"
	"github.com/compensa/compensa/sink/webhook"
	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/testkit"
)

// envelope is a webhook body as a consumer parses it.
type envelope struct {
	ID            string          `json:"id"`
	TenantID      string          `json:"tenant_id"`
	Payload       json.RawMessage `json:"payload"`
	Headers       json.RawMessage `json:"headers"`
	Poison        string          `json:"poison"`
	PayloadBase64 []byte          `json:"payload_base64"`
	HeadersBase64 []byte          `json:"headers_base64"`
}

func (e *endpoint) envelope(t *testing.T, id string) envelope {
	t.Helper()
	e.mu.Lock()
	body := e.bodies[id]
	e.mu.Unlock()
	var env envelope
	if err := json.Unmarshal(body, &env); err != nil {
		t.Fatalf("the envelope of %s does not parse: %v: %s", id, err, body)
	}
	return env
}

// TestPoisonEventsReachTheSinks: rows the relay cannot decode (a payload or
// headers that are not JSON, a tenant_id that is not a UUID) are dead
// letters for the sagas and still reach the sink, in commit order with the
// rest of their aggregate, directly and through the parked table.
func TestPoisonEventsReachTheSinks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	// Outboxes that predate jsonb keep text columns: there such rows commit.
	if _, err := db.Pool.Exec(ctx, `ALTER TABLE outbox ALTER COLUMN headers DROP DEFAULT,
		ALTER COLUMN payload TYPE text, ALTER COLUMN headers TYPE text, ALTER COLUMN tenant_id TYPE text`); err != nil {
		t.Fatal(err)
	}
	b := setupOn(t, db, 2*time.Second, 0)
	insert := func(payload, headers, tenant string) string {
		id := uuid.NewString()
		if _, err := db.Pool.Exec(ctx, `INSERT INTO outbox (id, tenant_id, aggregate_type, aggregate_id, event_type, payload, headers)
			VALUES ($1, NULLIF($2, ''), 'order', 'o-1', 'order.placed', $3, $4)`, id, tenant, payload, headers); err != nil {
			t.Fatal(err)
		}
		return id
	}
	ids := []string{
		insert(`{"n":0}`, `{}`, ""),
		insert(`not json {`, `{"trace":"t-1"}`, ""),
		insert(`{"n":2}`, `{}`, ""),
		insert(`{"n":3}`, `oops`, "acme"),
		insert(`{"n":4}`, `{}`, ""),
	}
	testkit.WaitFor(t, 30*time.Second, "every event delivered", func() bool { return len(firstSeen(b.ep.ids())) >= len(ids) })
	pos := firstSeen(b.ep.ids())
	for i := 1; i < len(ids); i++ {
		if pos[ids[i]] < pos[ids[i-1]] {
			t.Fatalf("event %d first delivered before event %d of its aggregate", i, i-1)
		}
	}
	env := b.ep.envelope(t, ids[1])
	if !strings.Contains(env.Poison, "payload") || string(env.Payload) != "null" || string(env.PayloadBase64) != "not json {" {
		t.Fatalf("envelope of the event whose payload is not JSON: poison %q, payload %s, payload_base64 %q", env.Poison, env.Payload, env.PayloadBase64)
	}
	env = b.ep.envelope(t, ids[3])
	if env.Poison == "" || string(env.HeadersBase64) != "oops" || env.TenantID != "acme" || string(env.Payload) != `{"n":3}` {
		t.Fatalf("envelope of the event with bad headers and tenant: %+v", env)
	}
	if env := b.ep.envelope(t, ids[0]); env.Poison != "" || env.PayloadBase64 != nil {
		t.Fatalf("a good event's envelope carries poison fields: %+v", env)
	}
	// The sinks may have an event before the correlator's transaction that
	// parks its dead letter commits: wait for the commit, do not race it.
	testkit.WaitFor(t, 30*time.Second, "both poison events to be dead letters", func() bool {
		return count(t, db, `SELECT count(*) FROM relay_dead_letters WHERE event_id = ANY($1)`, []string{ids[1], ids[3]}) == 2
	})

	// Down: the poison event is parked, the slot passes it, and it drains.
	b.ep.status.Store(503)
	bad := insert(`<xml/>`, `{}`, "")
	after := insert(`{"n":6}`, `{}`, "")
	var lsn pglogrepl.LSN
	var s string
	if err := db.Pool.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&s); err != nil {
		t.Fatal(err)
	}
	lsn, _ = pglogrepl.ParseLSN(s)
	testkit.WaitFor(t, 30*time.Second, "the slot to pass the parked poison event", func() bool { return confirmedFlush(t, db) >= lsn })
	if n := count(t, db, `SELECT count(*) FROM relay_sink_parked WHERE event_id = $1 AND event->>'poison' <> ''`, bad); n != 1 {
		t.Fatalf("the poison event written while the sink is down is not parked with its reason")
	}
	b.ep.status.Store(0)
	testkit.WaitFor(t, 30*time.Second, "the parked poison event to drain", func() bool {
		p := firstSeen(b.ep.ids())
		_, ok1 := p[bad]
		_, ok2 := p[after]
		return ok1 && ok2
	})
	if p := firstSeen(b.ep.ids()); p[after] < p[bad] {
		t.Fatal("the event after the parked poison event was delivered first")
	}
	if env := b.ep.envelope(t, bad); string(env.PayloadBase64) != "<xml/>" {
		t.Fatalf("drained poison event: payload_base64 %q", env.PayloadBase64)
	}
}

// TestUndecidablePoisonIsHeldForTheOperator: an event whose event_type
// could not be read is held (not dropped, not delivered) by a sink whose
// match filters on event types, and the later events of its aggregate wait
// behind it; a row without an id is held by every sink selecting it;
// `relay sinks retry` delivers them in order. A sink without a filter
// delivers the unread event at once. A payload jsonb refuses is parked
// whole rather than failing the batch.
func TestUndecidablePoisonIsHeldForTheOperator(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	filtered, all := newEndpoint(t), newEndpoint(t)
	var dests []sink.Destination
	for _, x := range []struct {
		name  string
		ep    *endpoint
		match sink.Match
	}{{"hook", filtered, sink.Match{EventTypes: []string{"order.*"}}}, {"all", all, sink.Match{}}} {
		wh, err := webhook.New(webhook.Config{URL: x.ep.srv.URL, Secret: secret, Timeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { wh.Close() })
		dests = append(dests, sink.Destination{Spec: sink.Spec{Name: x.name, Match: x.match, Webhook: &sink.WebhookSpec{URL: x.ep.srv.URL}}, Sink: wh})
	}
	f, err := sink.NewFanout(ctx, sink.FanoutConfig{Pool: db.Pool, DrainInterval: 50 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, Destinations: dests})
	if err != nil {
		t.Fatal(err)
	}
	corr, err := correlator.New(db.Pool, &correlator.Config{Registry: checkoutRegistry(), DisableNotify: true, InBatchTx: f.WriteParked})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); f.Run(runCtx) }()
	t.Cleanup(func() { cancel(); wg.Wait() })
	handle := f.Sink(corr)
	end := pglogrepl.LSN(1000)
	send := func(evs ...outbox.Event) {
		t.Helper()
		end += 100
		for i := range evs {
			evs[i].LSN = uint64(end - 1)
		}
		if err := handle.HandleBatch(ctx, cdc.Batch{Slot: db.Slot, Events: evs, CommitLSN: end - 1, EndLSN: end}); err != nil {
			t.Fatal(err)
		}
	}
	good := func(agg string, payload string) outbox.Event {
		id := uuid.New()
		return outbox.Event{ID: id, RawID: id.String(), TenantID: outbox.NilTenant, AggregateType: "order", AggregateID: agg,
			EventType: "order.placed", Payload: json.RawMessage(payload)}
	}
	unreadID := uuid.New()
	unread := outbox.Event{ID: unreadID, RawID: unreadID.String(), TenantID: outbox.NilTenant, AggregateType: "order", AggregateID: "o-1",
		Payload: json.RawMessage(`{}`), Poison: "column for event_type is no longer in the table", Unread: []string{"event_type"},
		Raw: map[string]any{"id": unreadID.String(), "aggregate_type": "order", "aggregate_id": "o-1", "payload": "{}"}}
	behind := good("o-1", `{"n":1}`)
	noID := outbox.Event{TenantID: outbox.NilTenant, AggregateType: "order", AggregateID: "o-2", EventType: "order.placed",
		Payload: json.RawMessage(`{}`), Poison: "id is null or empty", Raw: map[string]any{"id": nil, "event_type": "order.placed"}}
	send(unread, behind, noID)

	if n := count(t, db, `SELECT count(*) FROM relay_sink_parked WHERE sink = 'hook' AND event_id = $1
		AND next_attempt_at = 'infinity' AND reason LIKE 'held: event_type could not be read%'`, unreadID.String()); n != 1 {
		t.Fatal("the event whose event_type is unread is not held with its reason in the filtering sink")
	}
	if n := count(t, db, `SELECT count(*) FROM relay_sink_parked WHERE sink = 'hook' AND event_id = $1`, behind.RawID); n != 1 {
		t.Fatal("the later event of the held event's aggregate is not queued behind it")
	}
	if n := count(t, db, `SELECT count(*) FROM relay_sink_parked WHERE event_id LIKE '(no id)%' AND next_attempt_at = 'infinity'`); n != 2 {
		t.Fatalf("the row without an id is held in %d of 2 sinks", n)
	}
	testkit.WaitFor(t, 10*time.Second, "the unfiltered sink's direct deliveries", func() bool { return len(all.ids()) >= 2 })
	time.Sleep(time.Second) // the drainers run every 50ms: nothing held may leave
	if got := filtered.ids(); len(got) != 0 {
		t.Fatalf("the filtering sink delivered %v before the operator's retry", got)
	}
	if got := all.ids(); len(got) != 2 || got[0] != unreadID.String() || got[1] != behind.RawID {
		t.Fatalf("the unfiltered sink delivered %v, want the unread event then the next", got)
	}
	if n := count(t, db, `SELECT count(*) FROM relay_dead_letters`); n != 2 {
		t.Fatalf("%d dead letters, want 2 (the saga side parks both poison events)", n)
	}
	for _, name := range []string{"hook", "all"} {
		if _, err := sink.RequestRetry(ctx, db.Pool, name); err != nil {
			t.Fatal(err)
		}
	}
	testkit.WaitFor(t, 20*time.Second, "the held events delivered after retry", func() bool {
		return len(firstSeen(filtered.ids())) == 3 && len(firstSeen(all.ids())) == 3
	})
	if got := filtered.ids(); got[0] != unreadID.String() || got[1] != behind.RawID || !strings.HasPrefix(got[2], "(no id) ") {
		t.Fatalf("after retry the filtering sink delivered %v", got)
	}

	// Rows without an id in two parts of one large transaction get distinct
	// ids: the numbering carries over from part to part.
	end += 100
	lsn := end - 1
	for _, partial := range []bool{true, false} {
		ev := noID
		ev.LSN = uint64(lsn)
		b := cdc.Batch{Slot: db.Slot, Events: []outbox.Event{ev}, CommitLSN: lsn, EndLSN: lsn + 1, Partial: partial}
		if !partial {
			b.EndLSN = lsn + 50
		}
		if err := handle.HandleBatch(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	if n := count(t, db, `SELECT count(DISTINCT event_id) FROM relay_sink_parked WHERE sink = 'all' AND event_id LIKE $1`,
		"(no id) "+lsn.String()+" #%"); n != 2 {
		t.Fatalf("two rows without an id in two parts of one transaction: %d held, want 2", n)
	}

	// A payload every JSON parser accepts and jsonb refuses is parked whole.
	filtered.status.Store(503)
	nul := good("o-3", `{"note":"a\u0000b","big":1e200000}`)
	send(nul)
	if n := count(t, db, `SELECT count(*) FROM relay_sink_parked WHERE sink = 'hook' AND event_id = $1`, nul.RawID); n != 1 {
		t.Fatal("the event whose payload jsonb refuses is not parked")
	}
	filtered.status.Store(0)
	testkit.WaitFor(t, 20*time.Second, "the parked event to drain", func() bool { _, ok := firstSeen(filtered.ids())[nul.RawID]; return ok })
	env := filtered.envelope(t, nul.RawID)
	if string(env.Payload) != `{"note":"a\u0000b","big":1e200000}` {
		t.Fatalf("drained payload %s, want it unchanged", env.Payload)
	}
}
