// Package pgtest gives tests a real PostgreSQL: one throwaway cluster per test
// binary (internal/pgcluster), and a fresh, migrated database per test, cloned
// from a template so that it costs milliseconds.
//
// Use it from TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }
//
// and in a test:
//
//	db := pgtest.NewDB(t)   // db.Pool, db.URL, db.Slot
package pgtest

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/compensa/compensa/internal/pgcluster"
	"github.com/compensa/compensa/internal/pgcluster/pgdocker"
	"github.com/compensa/compensa/migrations"
)

const templateName = "compensa_template"

var (
	clusterOnce sync.Once
	cluster     *pgcluster.Cluster
	clusterErr  error
	seq         atomic.Int64
	runID       = fmt.Sprintf("%d", os.Getpid())
)

// Main runs the tests, stops the cluster (if one was started) and checks that
// no goroutine leaked. It returns the exit code instead of calling os.Exit so
// that deferred cleanup in the caller still runs.
func Main(m *testing.M, ignore ...goleak.Option) int {
	return Finish(m.Run(), ignore...)
}

// Finish is Main after m.Run, for a TestMain that stops servers of its own
// (shared brokers) between the tests and the leak check: it stops the
// cluster and checks that no goroutine leaked, and returns the exit code.
func Finish(code int, ignore ...goleak.Option) int {
	for _, name := range exampleDBs {
		Drop(cluster, name)
	}
	if cluster != nil {
		if err := cluster.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest: stop cluster:", err)
		}
	}
	if code == 0 {
		opts := append([]goleak.Option{
			// pgx's pool health checker and connection cleanup may still be
			// winding down for a moment after Close.
			goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
		}, ignore...)
		if err := goleak.Find(opts...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			return 1
		}
	}
	return code
}

// Cluster returns the shared cluster, starting it on first use. A machine
// without PostgreSQL fails the test with the install hint.
func Cluster(t testing.TB) *pgcluster.Cluster {
	t.Helper()
	if err := startCluster(); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return cluster
}

var exampleDBs []string

// ExampleURL creates a fresh, migrated database (core and example schemas)
// for an Example function, which has no *testing.T, and returns its URL. It
// panics when PostgreSQL cannot be started; Main drops the database.
func ExampleURL() string {
	if err := startCluster(); err != nil {
		panic("pgtest: " + err.Error())
	}
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, cluster.URL)
	if err != nil {
		panic("pgtest: " + err.Error())
	}
	defer admin.Close(ctx)
	name := fmt.Sprintf("x_%s_%d", runID, seq.Add(1))
	for try := 0; ; try++ {
		_, err = admin.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s_%s", name, templateName, runID))
		if err == nil || try == 20 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		panic("pgtest: create database: " + err.Error())
	}
	exampleDBs = append(exampleDBs, name)
	return cluster.DSN(name)
}

func startCluster() error {
	clusterOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cluster, clusterErr = pgdocker.Start(ctx, pgcluster.Options{})
		if clusterErr == nil {
			clusterErr = buildTemplate(ctx, cluster)
		}
	})
	return clusterErr
}

func buildTemplate(ctx context.Context, c *pgcluster.Cluster) error {
	admin, err := pgx.Connect(ctx, c.URL)
	if err != nil {
		return err
	}
	defer admin.Close(ctx)
	name := templateName + "_" + runID
	if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+name); err != nil {
		return err
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, c.DSN(name))
	if err != nil {
		return err
	}
	_, err = migrations.Apply(ctx, conn, migrations.Options{WithExamples: true})
	conn.Close(ctx)
	if err != nil {
		return fmt.Errorf("migrate template: %w", err)
	}
	return nil
}

// DB is one fresh, migrated database (core and example schemas).
type DB struct {
	Name string
	// URL connects as the cluster superuser.
	URL string
	// Slot is a replication slot name unique to this database; slots are
	// cluster-wide, so tests must not share names.
	Slot string
	// Publication is a publication name for this database.
	Publication string
	Pool        *pgxpool.Pool
	Cluster     *pgcluster.Cluster
}

// NewDB creates a database for this test and drops it (and its slots) when
// the test ends.
func NewDB(t testing.TB) *DB {
	t.Helper()
	c := Cluster(t)
	ctx := context.Background()
	name := fmt.Sprintf("t_%s_%d", runID, seq.Add(1))
	admin, err := pgx.Connect(ctx, c.URL)
	if err != nil {
		t.Fatalf("pgtest: connect: %v", err)
	}
	defer admin.Close(ctx)
	var lastErr error
	for try := 0; try < 20; try++ {
		// CREATE DATABASE fails while another session is connected to the
		// template; retry briefly rather than serialise every test.
		_, lastErr = admin.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s_%s", name, templateName, runID))
		if lastErr == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if lastErr != nil {
		t.Fatalf("pgtest: create database: %v", lastErr)
	}
	db := &DB{Name: name, URL: c.DSN(name), Slot: "slot_" + name, Publication: "pub_" + name, Cluster: c}
	pool, err := pgxpool.New(ctx, db.URL)
	if err != nil {
		t.Fatalf("pgtest: pool: %v", err)
	}
	db.Pool = pool
	t.Cleanup(func() {
		pool.Close()
		Drop(c, name)
	})
	return db
}

// Drop removes a database and the replication slots that live in it.
func Drop(c *pgcluster.Cluster, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, c.URL)
	if err != nil {
		return
	}
	defer admin.Close(ctx)
	admin.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE database = $1 AND active_pid IS NOT NULL`, name)
	for try := 0; try < 50; try++ {
		_, err := admin.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = $1`, name)
		if err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	admin.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
}

// ReplicationURL returns url with replication=database added, as pglogrepl
// needs for a logical replication connection.
func ReplicationURL(url string) string {
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	return url + sep + "replication=database"
}

// Connect opens a pool on url (a database the test created itself).
func Connect(ctx context.Context, url string) (*pgxpool.Pool, error) {
	return pgxpool.New(ctx, url)
}

// NewEmptyDB creates a database with no schema at all (not cloned from the
// migrated template), for tests of migrating from scratch; it is dropped,
// with its slots, when the test ends. Pool is nil: the caller connects once
// it has what it needs.
func NewEmptyDB(t testing.TB) *DB {
	t.Helper()
	c := Cluster(t)
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, c.URL)
	if err != nil {
		t.Fatalf("pgtest: connect: %v", err)
	}
	defer admin.Close(ctx)
	name := fmt.Sprintf("e_%s_%d", runID, seq.Add(1))
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("pgtest: create database: %v", err)
	}
	t.Cleanup(func() { Drop(c, name) })
	return &DB{Name: name, URL: c.DSN(name), Slot: "slot_" + name, Publication: "pub_" + name, Cluster: c}
}
