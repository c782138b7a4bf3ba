package pgtest_test

import (
	"context"
	"os"
	"testing"

	"github.com/compensa/compensa/migrations"
	"github.com/compensa/compensa/test/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

func TestNewDBIsMigratedWithLogicalWAL(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := context.Background()
	var level string
	if err := db.Pool.QueryRow(ctx, "SHOW wal_level").Scan(&level); err != nil {
		t.Fatal(err)
	}
	if level != "logical" {
		t.Fatalf("wal_level = %q, want logical", level)
	}
	var n int
	if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM compensa_schema_migrations").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Fatal("template was not migrated")
	}
}

func TestMigrateTwiceIsANoOp(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := context.Background()
	schema := func() string {
		var s string
		err := db.Pool.QueryRow(ctx, `SELECT string_agg(table_name || '.' || column_name || ':' || data_type, ',' ORDER BY table_name, column_name)
			FROM information_schema.columns WHERE table_schema = 'public'`).Scan(&s)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	before := schema()
	for i := 0; i < 2; i++ {
		ran, err := migrations.Apply(ctx, db.Pool, migrations.Options{WithExamples: true})
		if err != nil {
			t.Fatalf("apply #%d: %v", i+1, err)
		}
		if len(ran) != 0 {
			t.Fatalf("apply #%d ran %v on a migrated database", i+1, ran)
		}
	}
	if after := schema(); after != before {
		t.Fatal("schema changed on a second migrate")
	}
}
