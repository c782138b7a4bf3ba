package main

import (
	"context"
	"fmt"

	"github.com/compensa/compensa/internal/briefs"
	"github.com/compensa/compensa/migrations"
	"github.com/compensa/compensa/saga"
)

// registryFor is the set of sagas this binary runs against db: the example
// saga (research briefs) only where its schema was migrated (`relay migrate
// --with-examples`, or `relay demo`), so that a production relay runs no saga
// it was not given.
func registryFor(ctx context.Context, db migrations.Querier) (*saga.Registry, error) {
	withExamples, err := migrations.SetApplied(ctx, db, migrations.Examples)
	if err != nil {
		return nil, err
	}
	return newRegistry(withExamples)
}

func newRegistry(withExamples bool) (*saga.Registry, error) {
	reg := saga.NewRegistry()
	if withExamples {
		if err := briefs.Register(reg); err != nil {
			return nil, fmt.Errorf("register the example saga: %w", err)
		}
	}
	return reg, nil
}
