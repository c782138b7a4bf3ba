package main

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/compensa/compensa/internal/pgcluster"
	"github.com/compensa/compensa/internal/pgcluster/pgdocker"
	"github.com/compensa/compensa/migrations"
)

// migratedCluster starts a throwaway PostgreSQL for one test, applies the
// migrations with opts and opens a pool on it; both go at the test's end.
func migratedCluster(ctx context.Context, t *testing.T, opts migrations.Options) (*pgcluster.Cluster, *pgxpool.Pool) {
	t.Helper()
	c, err := pgdocker.Start(ctx, pgcluster.Options{})
	if err != nil {
		t.Fatalf("start PostgreSQL: %v", err)
	}
	t.Cleanup(func() { c.Stop() })
	conn, err := pgx.Connect(ctx, c.URL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := migrations.Apply(ctx, conn, opts); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	pool, err := pgxpool.New(ctx, c.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return c, pool
}
