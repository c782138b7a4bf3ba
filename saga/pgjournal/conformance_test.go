package pgjournal_test

import (
	"context"
	"flag"
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/journaltest"
	"github.com/compensa/compensa/saga/pgjournal"
	"github.com/compensa/compensa/test/pgtest"
)

func TestMain(m *testing.M) {
	// The model test is bounded to 50 random sequences unless -rapid.checks
	// says otherwise: each one runs against a real database.
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "rapid.checks" })
	if !set {
		_ = flag.Set("rapid.checks", "50")
	}
	os.Exit(pgtest.Main(m))
}

// newPool opens a pool of 8 connections on url, closed when t ends: the
// concurrency test runs 8 workers per pool.
func newPool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func newJournal(t *testing.T, pool *pgxpool.Pool, clock *journaltest.Clock) *pgjournal.Journal {
	t.Helper()
	// Oldest first: the claim order the memory journal shares, which the
	// suite and the model test check; the claims shared between tenants
	// have their own test (fair_test.go).
	j, err := pgjournal.New(pool, &pgjournal.Config{Now: clock.PtrNow, OldestFirst: true})
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// TestConformance runs the shared suite on PostgreSQL. Time is controlled
// through Config.Now: every statement takes the test clock's reading as its
// one clock, so a test sets the clock to a lease's expiry exactly.
func TestConformance(t *testing.T) {
	journaltest.Run(t, func(t *testing.T) journaltest.Harness {
		db := pgtest.NewDB(t)
		clock := journaltest.NewClock(journaltest.Epoch)
		return journaltest.Harness{
			Journal: newJournal(t, newPool(t, db.URL), clock),
			Clock:   clock,
			Peer: func(t *testing.T) saga.Journal {
				return newJournal(t, newPool(t, db.URL), clock)
			},
		}
	})
}
