package relay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/relay"
	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/test/pgtest"
)

// exampleSlot gives each example its own replication slot: slots belong to the
// server, not to a database.
func exampleSlot() string { return "example_" + uuid.NewString()[:8] }

// waitStatus polls the instance started by the outbox event until it ends.
func waitStatus(ctx context.Context, pool *pgxpool.Pool, event uuid.UUID) string {
	var status string
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		err := pool.QueryRow(ctx, `SELECT status::text FROM saga_instances WHERE trigger_event_id = $1`, event).Scan(&status)
		if err == nil && status != "RUNNING" && status != "COMPENSATING" {
			break
		}
	}
	return status
}

// exampleOrder is the state of the example's saga.
type exampleOrder struct {
	OrderID string `json:"order_id"`
}

// An application runs the relay in its own process with its own sagas: fill
// a registry, build the relay from a Config (the same options as `relay run`),
// start it, and stop it on the way out. Here an order.placed outbox row
// starts a one-step saga.
func ExampleNew() {
	ctx := context.Background()
	databaseURL := pgtest.ExampleURL() // your database, migrated with `relay migrate`

	reg := saga.NewRegistry()
	reg.MustRegister(saga.Define(saga.TypedDefinition[exampleOrder]{
		Name: "order_fulfilment", Version: 1,
		Triggers: []saga.Trigger{{EventType: "order.placed"}},
		Steps: []saga.TypedStep[exampleOrder]{{
			Name: "confirm",
			Do: func(ctx context.Context, s *exampleOrder, x *saga.StepTx) error {
				fmt.Println("confirming order", s.OrderID)
				return nil
			},
		}},
	}))
	r, err := relay.New(ctx, relay.Config{
		DatabaseURL: databaseURL,
		Registry:    reg,
		Slot:        exampleSlot(),
		// HTTPAddr "127.0.0.1:8080" would serve the monitor; left empty, the
		// application mounts r.Handler() on its own server.
	})
	if err != nil {
		panic(err) // a bad Config or a failed preflight (wal_level, privileges): nothing started
	}
	if err := r.Start(ctx); err != nil {
		panic(err)
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := r.Stop(stopCtx); err != nil {
			panic(err)
		}
	}()

	// The application's producer side: an order and its event, one transaction.
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	event := uuid.New()
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return outbox.Write(ctx, tx, outbox.Message{ID: event, EventType: "order.placed",
			AggregateType: "order", AggregateID: "A-7", Payload: map[string]string{"order_id": "A-7"}})
	})
	if err != nil {
		panic(err)
	}
	fmt.Println("saga:", waitStatus(ctx, pool, event))
	// Output:
	// confirming order A-7
	// saga: COMPLETED
}

// search is the state of a saga whose step asks another service for
// documents and waits for its answer.
type search struct {
	Query     string   `json:"query"`
	Documents []string `json:"documents"`
}

// A step that sends a command and waits for the reply: Do emits the command
// through the outbox (its id is the step's CommandID), the step waits, and the
// other service answers with an event whose correlation id is that id. The
// relay delivers the reply to the waiting step, whose OnReply reads it into
// the state.
func ExampleNew_commandAndReply() {
	ctx := context.Background()
	databaseURL := pgtest.ExampleURL() // your database, migrated with `relay migrate`

	reg := saga.NewRegistry()
	reg.MustRegister(saga.Define(saga.TypedDefinition[search]{
		Name: "research", Version: 1,
		Triggers: []saga.Trigger{{EventType: "research.requested"}},
		Steps: []saga.TypedStep[search]{{
			Name:         "find_documents",
			ReplyTimeout: time.Minute, // no reply by then: a failed attempt, retried
			Do: func(ctx context.Context, s *search, x *saga.StepTx) error {
				return x.EmitCommand(ctx, outbox.Message{TenantID: x.Instance.TenantID,
					EventType: "documents.search", Payload: map[string]string{"query": s.Query}})
			},
			OnReply: func(ctx context.Context, s *search, reply saga.Reply, x *saga.StepTx) error {
				var body struct {
					Documents []string `json:"documents"`
				}
				if err := json.Unmarshal(reply.Payload, &body); err != nil {
					return saga.Permanent(err)
				}
				s.Documents = body.Documents
				return nil
			},
		}},
	}))
	r, err := relay.New(ctx, relay.Config{DatabaseURL: databaseURL, Registry: reg, Slot: exampleSlot()})
	if err != nil {
		panic(err)
	}
	if err := r.Start(ctx); err != nil {
		panic(err)
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		r.Stop(stopCtx)
	}()
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		panic(err)
	}
	defer pool.Close()

	// The documents service, in miniature: it answers the first command it
	// finds, with the command's id as the reply's correlation id ("ok": true
	// is a success by the reply convention of saga.Reply).
	go func() {
		for {
			var command uuid.UUID
			var tenant uuid.UUID
			err := pool.QueryRow(ctx, `SELECT id, tenant_id FROM outbox WHERE event_type = 'documents.search'`).Scan(&command, &tenant)
			if err == nil {
				pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					return outbox.Write(ctx, tx, outbox.Message{TenantID: tenant, EventType: "documents.found", CorrelationID: command,
						Payload: map[string]any{"ok": true, "documents": []string{"coral-nurseries.pdf", "bleaching-2024.pdf"}}})
				})
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()

	event := uuid.New()
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return outbox.Write(ctx, tx, outbox.Message{ID: event, EventType: "research.requested",
			Payload: search{Query: "coral reefs"}})
	}); err != nil {
		panic(err)
	}
	fmt.Println("saga:", waitStatus(ctx, pool, event))
	var state search
	pool.QueryRow(ctx, `SELECT context FROM saga_instances WHERE trigger_event_id = $1`, event).Scan(&state)
	fmt.Println("documents:", state.Documents)
	// Output:
	// saga: COMPLETED
	// documents: [coral-nurseries.pdf bleaching-2024.pdf]
}
