package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/compensa/compensa/internal/briefs"
	"github.com/compensa/compensa/saga"
)

// querier is a *pgx.Conn or a *pgxpool.Pool.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// registryFor is the set of sagas this binary runs against db: the example
// saga (research briefs) only where its schema exists (`relay migrate
// --with-examples`, or `relay demo`), so that a production relay runs no saga
// it was not given. The check reads the catalog, not the migrations table, so
// that the least-privileged role of the quickstart can make it.
func registryFor(ctx context.Context, db querier) (*saga.Registry, error) {
	var present bool
	if err := db.QueryRow(ctx, `SELECT to_regclass('research_briefs') IS NOT NULL`).Scan(&present); err != nil {
		return nil, fmt.Errorf("look for the example schema: %w", err)
	}
	return newRegistry(present)
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
