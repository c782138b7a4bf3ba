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

// registryFor is the set of compiled-in sagas the CLI's tools (sagas,
// deadletters) know against db: the example saga (research briefs) where its
// schema exists, so that they can name and retry the instances a relay run
// with --with-examples made. `relay run` itself registers the examples only
// when asked (runRegistry).
func registryFor(ctx context.Context, db querier) (*saga.Registry, error) {
	present, err := examplesPresent(ctx, db)
	if err != nil {
		return nil, err
	}
	return newRegistry(present)
}

// examplesPresent reports whether the example schema exists (`relay migrate
// --with-examples`, or `relay demo`). It reads the catalog, not the
// migrations table, so that the least-privileged role of the quickstart can
// ask.
func examplesPresent(ctx context.Context, db querier) (bool, error) {
	var present bool
	if err := db.QueryRow(ctx, `SELECT to_regclass('research_briefs') IS NOT NULL`).Scan(&present); err != nil {
		return false, fmt.Errorf("look for the example schema: %w", err)
	}
	return present, nil
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
