package correlator_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/google/uuid"

	"github.com/compensa/compensa/cdc"
	"github.com/compensa/compensa/correlator"
	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/saga"
)

// tenantEvent is a trigger of a real tenant with headers (carrying a
// workspace), a correlation and a causation id, whose payload the strict
// saga refuses: it decodes fine, so the stream hands it over without a raw row.
func tenantEvent() (outbox.Event, uuid.UUID) {
	ev := trigger(uuid.New())
	ws := uuid.New()
	ev.Payload = json.RawMessage(`{"brief_id":"not-a-uuid"}`)
	ev.Headers = json.RawMessage(fmt.Sprintf(`{"workspace_id":%q,"trace":"t-1"}`, ws))
	ev.CorrelationID = uuid.NullUUID{UUID: uuid.New(), Valid: true}
	ev.CausationID = uuid.NullUUID{UUID: uuid.New(), Valid: true}
	ev.AggregateType, ev.AggregateID = "research_brief", "b-1"
	return ev, ws
}

func lenientCorrelator(t *testing.T, b *testBundle) *correlator.Correlator {
	t.Helper()
	strict := def("brief_enrichment", 1, 0, "research_brief.created")
	lenient := def("brief_enrichment", 2, 0, "research_brief.created")
	lenient.DecodeState = nil
	reg := saga.NewRegistry()
	reg.MustRegister(strict, lenient)
	c, err := correlator.New(b.db.Pool, &correlator.Config{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestRedrivenDeadLetterKeepsItsTenantHeadersAndCorrelation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	ev, ws := tenantEvent()
	if err := b.corr.HandleBatch(ctx, b.batch(ev)); err != nil {
		t.Fatal(err)
	}
	list, err := b.corr.ListDeadLetters(ctx, true, 10)
	if err != nil || len(list) != 1 {
		t.Fatalf("list = %v, %v", list, err)
	}
	var stored map[string]any
	if err := json.Unmarshal(list[0].Raw, &stored); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]string{"tenant_id": ev.TenantID.String(), "correlation_id": ev.CorrelationID.UUID.String(),
		"causation_id": ev.CausationID.UUID.String(), "aggregate_id": "b-1", "headers": string(ev.Headers)} {
		if stored[k] != want {
			t.Errorf("stored %s = %v, want %s", k, stored[k], want)
		}
	}
	d, err := lenientCorrelator(t, b).RetryDeadLetter(ctx, list[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	if d.RedrivenFrom != correlator.SourceStored {
		t.Fatalf("re-driven from %q", d.RedrivenFrom)
	}
	var tenant, gotWS, corr uuid.UUID
	if err := b.db.Pool.QueryRow(ctx, `SELECT tenant_id, workspace_id, correlation_id FROM saga_instances WHERE trigger_event_id = $1`, ev.ID).
		Scan(&tenant, &gotWS, &corr); err != nil {
		t.Fatalf("the re-driven event started no instance: %v", err)
	}
	if tenant != ev.TenantID || gotWS != ws || corr != ev.CorrelationID.UUID {
		t.Fatalf("instance tenant %s workspace %s correlation %s; want %s %s %s", tenant, gotWS, corr, ev.TenantID, ws, ev.CorrelationID.UUID)
	}
}

// A replay after --recreate-slot hands the same rows over at new LSNs: the
// event is parked once.
func TestParkingTheSameEventTwiceIsOneRow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	ev, _ := tenantEvent()
	for i := 0; i < 3; i++ {
		if err := b.corr.HandleBatch(ctx, b.batch(ev)); err != nil {
			t.Fatal(err)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM relay_dead_letters WHERE event_id = $1`, ev.RawID); n != 1 {
		t.Fatalf("the event parked 3 times at 3 LSNs has %d rows, want 1", n)
	}
	if got := b.corr.Stats().EventsParked; got != 1 {
		t.Fatalf("EventsParked = %d, want 1", got)
	}
}

func TestRetryFromOutboxUsesTheCurrentRowWhenItExists(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	ev, _ := tenantEvent()
	gone, _ := tenantEvent()
	if err := b.corr.HandleBatch(ctx, b.batch(ev, gone)); err != nil {
		t.Fatal(err)
	}
	// The producer corrected the row in place; the other row was deleted.
	if _, err := b.db.Pool.Exec(ctx, `INSERT INTO outbox (id, tenant_id, event_type, payload) VALUES ($1, $2, $3, $4)`,
		ev.ID, ev.TenantID, ev.EventType, fmt.Sprintf(`{"brief_id":%q}`, uuid.New())); err != nil {
		t.Fatal(err)
	}
	read := func(ctx context.Context, q cdc.Querier, rawID string) (outbox.Event, bool, error) {
		return cdc.ReadEvent(ctx, q, outbox.TableName{Name: "outbox"}, outbox.DefaultColumns(), rawID)
	}
	ids := map[string]int64{}
	list, _ := b.corr.ListDeadLetters(ctx, true, 10)
	for _, d := range list {
		ids[d.EventID] = d.ID
	}
	// The strict saga accepts the corrected payload.
	d, err := b.corr.RetryDeadLetterFromOutbox(ctx, ids[ev.RawID], read)
	if err != nil || d.RedrivenFrom != correlator.SourceOutbox {
		t.Fatalf("retry --from-outbox: %v, from %q", err, d.RedrivenFrom)
	}
	if n := b.count(t, `SELECT count(*) FROM saga_instances WHERE trigger_event_id = $1 AND tenant_id = $2`, ev.ID, ev.TenantID); n != 1 {
		t.Fatalf("the corrected row started %d instances under its tenant", n)
	}
	d, err = b.corr.RetryDeadLetterFromOutbox(ctx, ids[gone.RawID], read)
	if !errors.Is(err, correlator.ErrStillPoison) || d.RedrivenFrom != correlator.SourceStoredRowGone {
		t.Fatalf("retry --from-outbox of a deleted row: %v, from %q", err, d.RedrivenFrom)
	}
}

// Every streamed event has one outcome, and the outcomes add up to the events
// seen: an operator can tell why nothing happened.
func TestEventOutcomesAddUp(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	unrelated := trigger(uuid.New())
	unrelated.EventType = "order.shipped"
	reply := trigger(uuid.New())
	reply.EventType = "documents.found"
	reply.CorrelationID = uuid.NullUUID{UUID: uuid.New(), Valid: true}
	poison := trigger(uuid.New())
	poison.Poison = "payload is not valid JSON"
	if err := b.corr.HandleBatch(ctx, b.batch(trigger(uuid.New()), trigger(uuid.New()), unrelated, reply, poison)); err != nil {
		t.Fatal(err)
	}
	s := b.corr.Stats()
	if s.OutcomeStarted != 2 || s.OutcomeIgnored != 1 || s.OutcomeReply != 1 || s.OutcomeParked != 1 {
		t.Fatalf("outcomes started %d ignored %d reply %d parked %d; want 2 1 1 1", s.OutcomeStarted, s.OutcomeIgnored, s.OutcomeReply, s.OutcomeParked)
	}
	if sum := s.OutcomeStarted + s.OutcomeIgnored + s.OutcomeReply + s.OutcomeParked; sum != s.EventsSeen {
		t.Fatalf("outcomes add up to %d, events seen %d", sum, s.EventsSeen)
	}
}
