package correlator_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/compensa/compensa/correlator"
	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/saga"
)

// Values Go's JSON accepts and PostgreSQL's jsonb refuses are parked by the
// checks, and the rest of the batch goes on.
func TestPayloadsJSONBRefusesAreParked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	good := trigger(uuid.New())
	surrogate := trigger(uuid.New())
	surrogate.Payload = json.RawMessage(fmt.Sprintf(`{"brief_id":%q,"note":"\ud800"}`, uuid.New()))
	huge := trigger(uuid.New())
	huge.Payload = json.RawMessage(fmt.Sprintf(`{"brief_id":%q,"n":1e200000}`, uuid.New()))
	escaped := trigger(uuid.New()) // an escaped backslash before u0000 is ordinary text
	escaped.Payload = json.RawMessage(fmt.Sprintf(`{"brief_id":%q,"path":"C:\\u0000"}`, uuid.New()))
	if err := b.corr.HandleBatch(ctx, b.batch(good, surrogate, huge, escaped)); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT count(*) FROM saga_instances WHERE trigger_event_id = ANY($1)`, []uuid.UUID{good.ID, escaped.ID}); n != 2 {
		t.Fatalf("usable triggers started %d instances, want 2", n)
	}
	if n := b.count(t, `SELECT count(*) FROM relay_dead_letters WHERE reason LIKE '%surrogate%' OR reason LIKE '%numeric%'`); n != 2 {
		t.Fatalf("parked %d of the 2 jsonb-refused payloads", n)
	}
}

// A payload the stream read from a jsonb column is not checked again: jsonb
// takes its own text back. Were one marked so wrongly, PostgreSQL's refusal
// still parks only that event.
func TestAPayloadFromJSONBIsNotCheckedAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	good := trigger(uuid.New())
	good.PayloadJSONB = true
	bad := trigger(uuid.New())
	bad.Payload = json.RawMessage(fmt.Sprintf(`{"brief_id":%q,"note":"\ud800"}`, uuid.New()))
	bad.PayloadJSONB = true
	if reason := parkedBesideGood(t, b, good, bad); !strings.Contains(reason, "refused by PostgreSQL") {
		t.Fatalf("reason %q: the correlator's own check ran on a payload marked as jsonb's", reason)
	}
}

// Should a refused value get past the checks, the batch does not fail for
// ever: the events carrying one are found and parked, the rest commit.
func TestRefusedValueThatSlipsThroughIsParkedNotFatal(t *testing.T) {
	// Not parallel: it switches the package's payload checks off.
	restore := correlator.SkipPayloadChecks()
	defer restore()
	b := setup(t)
	good := trigger(uuid.New())
	bad := trigger(uuid.New())
	bad.Payload = json.RawMessage(fmt.Sprintf(`{"brief_id":%q,"note":"\udc00"}`, uuid.New()))
	if reason := parkedBesideGood(t, b, good, bad); !strings.Contains(reason, "refused by PostgreSQL") {
		t.Fatalf("reason %q", reason)
	}
}

// parkedBesideGood hands good and bad to the correlator in one batch, checks
// that the batch committed and good started its saga, and returns the reason
// bad was parked with.
func parkedBesideGood(t *testing.T, b *testBundle, good, bad outbox.Event) string {
	t.Helper()
	if err := b.corr.HandleBatch(context.Background(), b.batch(good, bad)); err != nil {
		t.Fatalf("the batch failed instead of parking the refused event: %v", err)
	}
	if n := b.count(t, `SELECT count(*) FROM saga_instances WHERE trigger_event_id = $1`, good.ID); n != 1 {
		t.Fatal("the good trigger did not start")
	}
	var reason string
	if err := b.db.Pool.QueryRow(context.Background(), `SELECT reason FROM relay_dead_letters WHERE event_id = $1`, bad.RawID).Scan(&reason); err != nil {
		t.Fatal(err)
	}
	return reason
}

func TestHostileDeadLetterKeysAreParked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	long := outbox.Event{RawID: strings.Repeat("Ω", 3000), EventType: strings.Repeat("t", 5000), Poison: "payload is not JSON"}
	noID1 := outbox.Event{EventType: "x", Poison: "no id"}
	noID2 := outbox.Event{EventType: "x", Poison: "no id"}
	if err := b.corr.HandleBatch(ctx, b.batch(long, noID1, noID2, trigger(uuid.New()))); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT count(*) FROM relay_dead_letters`); n != 3 {
		t.Fatalf("parked %d, want 3", n)
	}
	if n := b.count(t, `SELECT count(*) FROM relay_dead_letters WHERE raw->>'id' = $1`, long.RawID); n != 1 {
		t.Fatal("the raw row lost the long id")
	}

	// Ids that are not UTF-8 (a SQL_ASCII database) and differ only in
	// those bytes stay two dead letters; a raw value larger than jsonb
	// holds comfortably is clipped, not refused.
	a := outbox.Event{RawID: "id-ÿ", EventType: "tþ", Poison: "id is not valid UTF-8",
		Raw: map[string]any{"id": "id-ÿ", "payload": strings.Repeat("p", 17<<20)}}
	c := outbox.Event{RawID: "id-þ", EventType: "tþ", Poison: "id is not valid UTF-8", Raw: map[string]any{"id": "id-þ"}}
	if err := b.corr.HandleBatch(ctx, b.batch(a, c)); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT count(DISTINCT event_id) FROM relay_dead_letters WHERE event_id LIKE 'id-%'`); n != 2 {
		t.Fatalf("%d dead letters for two ids that are not UTF-8, want 2", n)
	}
	if n := b.count(t, `SELECT count(*) FROM relay_dead_letters WHERE length(raw->>'payload') < 17 << 20 AND raw->>'payload' LIKE '%clipped%'`); n != 1 {
		t.Fatal("the huge raw value is not clipped")
	}
}

func TestTwoRepliesForOneInstanceInOneBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	waiting, corr := b.waitingInstance(t)
	first := outbox.Event{ID: uuid.New(), EventType: "enrichment.done", Payload: json.RawMessage(`{"ok":true,"which":"first"}`),
		CorrelationID: uuid.NullUUID{UUID: corr, Valid: true}}
	second := outbox.Event{ID: uuid.New(), EventType: "enrichment.done", Payload: json.RawMessage(`{"ok":false,"which":"second"}`),
		CorrelationID: uuid.NullUUID{UUID: corr, Valid: true}}
	if err := b.corr.HandleBatch(ctx, b.batch(first, second)); err != nil {
		t.Fatal(err)
	}
	var reply string
	if err := b.db.Pool.QueryRow(ctx, `SELECT reply->>'which' FROM saga_instances WHERE id = $1`, waiting).Scan(&reply); err != nil {
		t.Fatal(err)
	}
	if reply != "first" {
		t.Fatalf("delivered the %s reply, want the first in stream order", reply)
	}
	outcomes := map[string]string{}
	rows, _ := b.db.Pool.Query(ctx, `SELECT event_id::text, outcome FROM relay_inbox`)
	for rows.Next() {
		var id, o string
		rows.Scan(&id, &o)
		outcomes[id] = o
	}
	if outcomes[first.ID.String()] != "delivered" || outcomes[second.ID.String()] != "late" {
		t.Fatalf("inbox %v", outcomes)
	}
	if s := b.corr.Stats(); s.RepliesDelivered != 1 || s.LateReplies != 1 {
		t.Fatalf("stats %+v", s)
	}
}

// A transaction replayed after a new version was deployed starts nothing new.
func TestReplayAfterNewVersionDoesNotStartAgain(t *testing.T) {
	t.Parallel()
	b := setup(t, def("brief_enrichment", 1, 0, "research_brief.created"))
	ctx := context.Background()
	ev := trigger(uuid.New())
	first := b.batch(ev)
	first.Partial = true // committed part of a transaction, then a crash
	if err := b.corr.HandleBatch(ctx, first); err != nil {
		t.Fatal(err)
	}
	reg := saga.NewRegistry()
	reg.MustRegister(def("brief_enrichment", 1, 0, "research_brief.created"), def("brief_enrichment", 2, 0, "research_brief.created"))
	v2, err := correlator.New(b.db.Pool, &correlator.Config{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	replay := first
	replay.Partial = false
	if err := v2.HandleBatch(ctx, replay); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT count(*) FROM saga_instances WHERE trigger_event_id = $1`, ev.ID); n != 1 {
		t.Fatalf("the trigger started %d instances across versions, want 1", n)
	}
	if s := v2.Stats(); s.DuplicateStarts != 1 {
		t.Fatalf("stats %+v", s)
	}
}

// A reply is accepted only from the tenant of the command it answers: one
// from another tenant is parked with its reason and the instance keeps
// waiting for its own tenant's reply.
func TestReplyFromAnotherTenantIsParkedNotDelivered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	tenantA, tenantB := uuid.New(), uuid.New()
	waiting, corr := b.waitingInstanceOf(t, tenantB)
	forged := outbox.Event{ID: uuid.New(), TenantID: tenantA, EventType: "enrichment.done",
		Payload: json.RawMessage(`{"which":"forged"}`), CorrelationID: uuid.NullUUID{UUID: corr, Valid: true}}
	if err := b.corr.HandleBatch(ctx, b.batch(forged)); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT count(*) FROM saga_instances WHERE id = $1 AND reply IS NULL AND awaiting_correlation_id = $2`, waiting, corr); n != 1 {
		t.Fatal("another tenant's reply was delivered to the waiting instance")
	}
	var reason string
	if err := b.db.Pool.QueryRow(ctx, `SELECT reason FROM relay_dead_letters WHERE event_id = $1`, forged.ID.String()).Scan(&reason); err != nil {
		t.Fatalf("the forged reply is not a dead letter: %v", err)
	}
	if reason != "reply from another tenant" {
		t.Fatalf("reason %q", reason)
	}
	own := outbox.Event{ID: uuid.New(), TenantID: tenantB, EventType: "enrichment.done",
		Payload: json.RawMessage(`{"which":"own"}`), CorrelationID: uuid.NullUUID{UUID: corr, Valid: true}}
	if err := b.corr.HandleBatch(ctx, b.batch(own)); err != nil {
		t.Fatal(err)
	}
	var got string
	if err := b.db.Pool.QueryRow(ctx, `SELECT reply->>'which' FROM saga_instances WHERE id = $1`, waiting).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if got != "own" {
		t.Fatalf("delivered %q, want the own tenant's reply", got)
	}
	if s := b.corr.Stats(); s.RepliesDelivered != 1 || s.OutcomeParked != 1 || s.OutcomeReply != 1 {
		t.Fatalf("stats %+v", s)
	}
}

// A trigger whose aggregate id is longer than an index entry takes (random
// text, which does not compress) starts its saga; the instance keeps the
// id clipped, with a hash of the whole.
func TestTriggerWithAnOverlongAggregateIDStarts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var agg strings.Builder
	for agg.Len() < 6000 {
		agg.WriteString(uuid.NewString())
	}
	ev := trigger(uuid.New())
	ev.AggregateID = agg.String()
	if err := b.corr.HandleBatch(ctx, b.batch(ev)); err != nil {
		t.Fatalf("the batch failed on the trigger's aggregate id: %v", err)
	}
	if n := b.count(t, `SELECT count(*) FROM saga_instances WHERE trigger_event_id = $1 AND length(trigger_aggregate_id) < 1100`, ev.ID); n != 1 {
		t.Fatal("the trigger did not start its saga with a clipped aggregate id")
	}
}

// Should PostgreSQL refuse what an event holds in a way no check foresaw
// (here: an index entry too large, the clipping switched off), the batch
// does not fail for ever: its events are applied one by one, the refused
// one is parked with PostgreSQL's message, the others start, and rows
// without an id keep their numbers.
func TestRefusalNoCheckForesawParksOnlyThatEvent(t *testing.T) {
	// Not parallel: it switches the package's aggregate clipping off.
	restore := correlator.SkipAggregateClipping()
	defer restore()
	b := setup(t)
	ctx := context.Background()
	var agg strings.Builder
	for agg.Len() < 6000 {
		agg.WriteString(uuid.NewString())
	}
	good1, bad, good2 := trigger(uuid.New()), trigger(uuid.New()), trigger(uuid.New())
	bad.AggregateID = agg.String()
	noID1 := outbox.Event{EventType: "x", Poison: "no id"}
	noID2 := outbox.Event{EventType: "x", Poison: "no id"}
	if err := b.corr.HandleBatch(ctx, b.batch(good1, noID1, bad, noID2, good2)); err != nil {
		t.Fatalf("the batch failed instead of parking the refused event: %v", err)
	}
	if n := b.count(t, `SELECT count(*) FROM saga_instances WHERE trigger_event_id = ANY($1)`, []uuid.UUID{good1.ID, good2.ID}); n != 2 {
		t.Fatalf("%d of the 2 usable triggers started", n)
	}
	if n := b.count(t, `SELECT count(*) FROM saga_instances WHERE trigger_event_id = $1`, bad.ID); n != 0 {
		t.Fatal("the refused trigger started")
	}
	if n := b.count(t, `SELECT count(*) FROM relay_dead_letters WHERE event_id = $1 AND reason LIKE 'PostgreSQL refused what the event holds: index row size%'`, bad.RawID); n != 1 {
		t.Fatal("the refused trigger is not a dead letter with PostgreSQL's message")
	}
	if n := b.count(t, `SELECT count(*) FROM relay_dead_letters WHERE event_id IN ('(no id) #1', '(no id) #2')`); n != 2 {
		t.Fatalf("%d of the 2 rows without an id parked under their numbers", n)
	}
	if s := b.corr.Stats(); s.OutcomeStarted != 2 || s.OutcomeParked != 3 || s.EventsSeen != 5 {
		t.Fatalf("stats %+v", s)
	}
}
