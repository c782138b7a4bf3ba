package outbox_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/test/pgtest"
)

// TestMain stops the throwaway PostgreSQL the examples use and checks that
// no goroutine leaked.
func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// A producer writes its business row and the event that announces it in one
// transaction: the event exists exactly when the order does. The relay
// streams the committed outbox row; a rolled-back transaction emits nothing.
func ExampleWrite() {
	ctx := context.Background()
	databaseURL := pgtest.ExampleURL() // your database, migrated with `relay migrate`
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id uuid PRIMARY KEY, total_cents bigint NOT NULL)`); err != nil {
		panic(err)
	}

	placeOrder := func(total int64, commit bool) error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx) // a no-op after Commit
		id := uuid.New()
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id, total_cents) VALUES ($1, $2)`, id, total); err != nil {
			return err
		}
		err = outbox.Write(ctx, tx, outbox.Message{
			TenantID:      uuid.MustParse("7a3f0c1e-0000-4000-8000-000000000001"),
			AggregateType: "order",
			AggregateID:   id.String(),
			EventType:     "order.placed",
			Payload:       map[string]any{"order_id": id, "total_cents": total},
		})
		if err != nil || !commit {
			return err
		}
		return tx.Commit(ctx)
	}
	if err := placeOrder(4200, true); err != nil {
		panic(err)
	}
	if err := placeOrder(999, false); err != nil { // rolled back
		panic(err)
	}

	var orders, events int
	pool.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&orders)
	pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE event_type = 'order.placed'`).Scan(&events)
	fmt.Printf("orders: %d, order.placed events: %d\n", orders, events)
	// Output: orders: 1, order.placed events: 1
}
