package pgjournal_test

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/pgjournal"
	"github.com/compensa/compensa/test/pgtest"
)

// A tailer reads the journal of every saga in commit order: it keeps the
// GlobalSeq of the last event it handled and asks for what follows. An event
// whose transaction commits late is never skipped (see the package doc).
func ExampleJournal_LoadSince() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgtest.ExampleURL()) // your database, migrated with `relay migrate`
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	journal, err := pgjournal.New(pool, nil)
	if err != nil {
		panic(err)
	}

	// Something to read: a two-step saga, run to completion.
	noop := func(context.Context, *saga.StepTx) error { return nil }
	def := saga.Definition{Name: "welcome_mail", Version: 1,
		Triggers: []saga.Trigger{{EventType: "user.signed_up"}},
		Steps:    []saga.Step{{Name: "render", Do: noop}, {Name: "send", Do: noop}}}
	reg := saga.NewRegistry()
	reg.MustRegister(def)
	runner, err := saga.NewRunner(journal, pool, reg, nil)
	if err != nil {
		panic(err)
	}
	if err := runner.Start(ctx); err != nil {
		panic(err)
	}
	id := uuid.New()
	if err := journal.Enqueue(ctx, saga.Instance{ID: id, SagaName: def.Name, SagaVersion: def.Version,
		Status: saga.StatusRunning, TriggerEventID: uuid.New(), Context: json.RawMessage(`{}`)}); err != nil {
		panic(err)
	}
	runner.Wake()

	// The tailer: from the start (0), in pages, until the saga has ended.
	var after int64
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		events, err := journal.LoadSince(ctx, after, 100)
		if err != nil {
			panic(err)
		}
		done := false
		for _, e := range events {
			fmt.Printf("%s %s\n", e.Kind, e.StepName)
			after = e.GlobalSeq
			done = done || e.Kind == saga.EventCompleted
		}
		if done {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	runner.Stop(stopCtx)
	// Output:
	// step_completed render
	// step_completed send
	// completed
}
