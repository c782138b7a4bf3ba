package saga_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/pgjournal"
	"github.com/compensa/compensa/test/pgtest"
)

// checkout is the saga's state: decoded from the trigger's payload, saved
// after every step.
type checkout struct {
	OrderID  string `json:"order_id"`
	Reserved bool   `json:"reserved"`
}

// A typed saga with a compensation: reserve_stock succeeds, charge_card fails
// for good, and the runner compensates reserve_stock with the state it saved.
func ExampleDefine() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgtest.ExampleURL()) // your database, migrated with `relay migrate`
	if err != nil {
		panic(err)
	}
	defer pool.Close()

	var mu sync.Mutex
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Printf(format+"\n", args...)
	}
	def := saga.Define(saga.TypedDefinition[checkout]{
		Name:     "checkout",
		Version:  1,
		Triggers: []saga.Trigger{{EventType: "order.placed"}},
		// A trigger whose payload fails Check is parked as a dead letter.
		Check: func(s *checkout) error {
			if s.OrderID == "" {
				return errors.New("order_id is required")
			}
			return nil
		},
		Steps: []saga.TypedStep[checkout]{
			{
				Name: "reserve_stock",
				Do: func(ctx context.Context, s *checkout, x *saga.StepTx) error {
					// x.Tx is the step's transaction: writes here commit with
					// the journal entry, or not at all.
					s.Reserved = true
					say("reserve_stock: stock reserved for %s", s.OrderID)
					return nil
				},
				Compensate: func(ctx context.Context, s checkout, x *saga.StepTx) error {
					say("reserve_stock compensated: stock released for %s (reserved: %v)", s.OrderID, s.Reserved)
					return nil
				},
			},
			{
				Name: "charge_card",
				Do: func(ctx context.Context, s *checkout, x *saga.StepTx) error {
					say("charge_card: declined")
					return saga.Permanent(errors.New("card declined")) // no retry: compensate now
				},
			},
		},
	})
	reg := saga.NewRegistry()
	reg.MustRegister(def)
	journal, err := pgjournal.New(pool, nil)
	if err != nil {
		panic(err)
	}
	runner, err := saga.NewRunner(journal, pool, reg, &saga.RunnerConfig{Workers: 2})
	if err != nil {
		panic(err)
	}
	if err := runner.Start(ctx); err != nil {
		panic(err)
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		runner.Stop(stopCtx)
	}()

	// The relay starts instances from outbox events; here one is enqueued
	// directly.
	id := uuid.New()
	if err := journal.Enqueue(ctx, saga.Instance{ID: id, TenantID: uuid.Nil, SagaName: def.Name, SagaVersion: def.Version,
		Status: saga.StatusRunning, TriggerEventID: uuid.New(), Context: json.RawMessage(`{"order_id": "A-1001"}`)}); err != nil {
		panic(err)
	}
	runner.Wake()
	inst := waitTerminal(ctx, journal, id)
	say("status: %s", inst.Status)
	// Output:
	// reserve_stock: stock reserved for A-1001
	// charge_card: declined
	// reserve_stock compensated: stock released for A-1001 (reserved: true)
	// status: COMPENSATED
}

// waitTerminal polls an instance until it ends (at most 30 s).
func waitTerminal(ctx context.Context, j saga.Journal, id uuid.UUID) saga.Instance {
	deadline := time.Now().Add(30 * time.Second)
	for {
		inst, err := j.Get(ctx, id)
		if err != nil {
			panic(err)
		}
		if inst.Status.Terminal() || time.Now().After(deadline) {
			return inst
		}
		time.Sleep(20 * time.Millisecond)
	}
}
