package sinks

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/testkit"
)

// TestMessagesReachTheSinksInOrderWithRows: a row and messages written in one
// transaction reach the sink in the transaction's order, a message without
// an id under the id of its position; refused messages (non-transactional,
// not JSON, no event_type) are dead letters that no sink receives, and the
// events after them flow.
func TestMessagesReachTheSinksInOrderWithRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	b := setupOn(t, db, 2*time.Second, 0)
	row, msg, row2 := uuid.New(), uuid.New(), uuid.New()
	err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		if err := outbox.Write(ctx, tx, outbox.Message{ID: row, AggregateType: "order", AggregateID: "o-1", EventType: "order.placed", Payload: map[string]int{"n": 0}}); err != nil {
			return err
		}
		if err := outbox.Emit(ctx, tx, outbox.Message{ID: msg, AggregateType: "order", AggregateID: "o-1", EventType: "order.paid", Payload: map[string]int{"n": 1}}); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `SELECT pg_logical_emit_message(true, 'outbox', '{"aggregate_type": "order", "aggregate_id": "o-1", "event_type": "order.noted"}')`); err != nil {
			return err
		}
		for _, refused := range []string{
			`SELECT pg_logical_emit_message(false, 'outbox', '{"aggregate_type": "order", "aggregate_id": "o-1", "event_type": "order.nontx"}')`,
			`SELECT pg_logical_emit_message(true, 'outbox', 'not json')`,
			`SELECT pg_logical_emit_message(true, 'outbox', '{"aggregate_type": "order", "aggregate_id": "o-1"}')`,
		} {
			if _, err := tx.Exec(ctx, refused); err != nil {
				return err
			}
		}
		return outbox.Write(ctx, tx, outbox.Message{ID: row2, AggregateType: "order", AggregateID: "o-1", EventType: "order.shipped", Payload: map[string]int{"n": 3}})
	})
	if err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 30*time.Second, "four events delivered", func() bool { return len(firstSeen(b.ep.ids())) >= 4 })
	testkit.WaitFor(t, 30*time.Second, "three dead letters", func() bool { return count(t, db, `SELECT count(*) FROM relay_dead_letters`) == 3 })
	time.Sleep(500 * time.Millisecond) // anything refused that would be delivered has had the time
	ids := b.ep.ids()
	pos := firstSeen(ids)
	if len(pos) != 4 {
		t.Fatalf("the sink received %d events, want 4 (refused messages are never delivered): %v", len(pos), ids)
	}
	var noted string
	for id := range pos {
		if id != row.String() && id != msg.String() && id != row2.String() {
			noted = id
		}
	}
	order := []string{row.String(), msg.String(), noted, row2.String()}
	for i := 1; i < len(order); i++ {
		if pos[order[i]] < pos[order[i-1]] {
			t.Fatalf("event %d of the transaction first delivered before event %d: %v", i, i-1, ids)
		}
	}
	if _, err := uuid.Parse(noted); err != nil {
		t.Fatalf("the message without an id was delivered under %q", noted)
	}
	if n := count(t, db, `SELECT count(*) FROM outbox`); n != 2 {
		t.Fatalf("outbox holds %d rows, want the 2 rows only", n)
	}
	var reasons []string
	rows, err := db.Pool.Query(ctx, `SELECT reason FROM relay_dead_letters ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	reasons, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	joined := strings.Join(reasons, "\n")
	for _, want := range []string{"non-transactional", "not JSON", "no event_type"} {
		if !strings.Contains(joined, want) {
			t.Errorf("no dead letter says %q:\n%s", want, joined)
		}
	}
}
