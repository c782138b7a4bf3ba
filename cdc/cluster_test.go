package cdc_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/compensa/compensa/internal/pgcluster"
	"github.com/compensa/compensa/internal/pgcluster/pgdocker"
	"github.com/compensa/compensa/migrations"
	"github.com/compensa/compensa/test/pgtest"
)

// privateDB starts a cluster of the test's own, for what must not disturb
// the shared one: restarts, cluster-wide settings, WAL measurements. It
// returns a migrated database on it, shaped like pgtest.DB.
func privateDB(t *testing.T, settings map[string]string) *pgtest.DB {
	t.Helper()
	return privateDBOpts(t, pgcluster.Options{Settings: settings})
}

func privateDBOpts(t *testing.T, opts pgcluster.Options) *pgtest.DB {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := pgdocker.Start(ctx, opts)
	if err != nil {
		t.Fatalf("private cluster: %v", err)
	}
	t.Cleanup(func() { c.Stop() })
	if c.Kind != pgcluster.KindLocal {
		t.Skipf("needs a cluster of its own (restart, cluster-wide settings); got a %s one", c.Kind)
	}
	conn, err := pgx.Connect(ctx, c.URL)
	if err != nil {
		t.Fatal(err)
	}
	_, err = migrations.Apply(ctx, conn, migrations.Options{WithExamples: true})
	conn.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, c.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return &pgtest.DB{Name: "postgres", URL: c.URL, Slot: "private_slot", Publication: "private_pub", Pool: pool, Cluster: c}
}
