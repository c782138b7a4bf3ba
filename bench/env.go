package bench

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/compensa/compensa/internal/pgcluster"
	"github.com/compensa/compensa/internal/pgcluster/pgdocker"
	"github.com/compensa/compensa/migrations"
)

// env is the bench's database: its own database on the given server (or on a
// throwaway cluster), migrated, with a publication over the outbox.
type env struct {
	cluster   *pgcluster.Cluster // nil when the caller gave a server
	adminURL  string
	dbName    string
	url       string
	pool      *pgxpool.Pool
	binDir    string // where pg_recvlogical and pgbench are
	pgVersion string
	pub       string
	// Durable says whether commits wait for the WAL flush (fsync and
	// synchronous_commit on): figures from a server without it flatter
	// everyone alike but are not what production sees.
	durable bool
	// statements: pg_stat_statements is usable.
	statements bool
}

const benchPublication = "compensa_bench_pub"

func openEnv(ctx context.Context, databaseURL string, progress func(string, ...any)) (*env, error) {
	e := &env{adminURL: databaseURL, pub: benchPublication}
	if databaseURL == "" {
		progress("starting a throwaway PostgreSQL (durable: fsync and synchronous_commit on)")
		// pg_stat_statements: the step scenario reports where the server's
		// time goes per statement (its overhead is the same for pgbench).
		c, err := pgdocker.Start(ctx, pgcluster.Options{Durable: true, Settings: map[string]string{"shared_preload_libraries": "pg_stat_statements"}})
		if err != nil {
			return nil, err
		}
		e.cluster, e.adminURL = c, c.URL
	}
	if err := e.init(ctx); err != nil {
		e.close()
		return nil, err
	}
	return e, nil
}

func (e *env) init(ctx context.Context) error {
	admin, err := pgx.Connect(ctx, e.adminURL)
	if err != nil {
		return fmt.Errorf("bench: connect to the server: %w", err)
	}
	defer admin.Close(context.WithoutCancel(ctx))
	var walLevel, fsync, syncCommit string
	if err := admin.QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('wal_level'),
		current_setting('fsync'), current_setting('synchronous_commit')`).Scan(&e.pgVersion, &walLevel, &fsync, &syncCommit); err != nil {
		return fmt.Errorf("bench: read server settings: %w", err)
	}
	if walLevel != "logical" {
		return fmt.Errorf("bench: the server has wal_level=%s; logical replication needs wal_level=logical (ALTER SYSTEM SET wal_level = logical, then restart)", walLevel)
	}
	e.durable = fsync == "on" && syncCommit != "off"
	e.dbName = fmt.Sprintf("compensa_bench_%d", os.Getpid())
	if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+e.dbName+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("bench: drop stale database %s: %w", e.dbName, err)
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+e.dbName); err != nil {
		return fmt.Errorf("bench: create database %s (the bench works in a database of its own; the role needs CREATEDB): %w", e.dbName, err)
	}
	e.url, err = withDatabase(e.adminURL, e.dbName)
	if err != nil {
		return err
	}
	cfg, err := pgxpool.ParseConfig(e.url)
	if err != nil {
		return fmt.Errorf("bench: database URL: %w", err)
	}
	cfg.MaxConns = 32
	if e.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return err
	}
	if _, err := migrations.Apply(ctx, e.pool, migrations.Options{}); err != nil {
		return fmt.Errorf("bench: migrate: %w", err)
	}
	for _, q := range []string{
		"CREATE PUBLICATION " + e.pub + " FOR TABLE outbox",
		sqlLoadProcedure,
		sqlEmitProcedure,
		sqlPgbenchTables,
	} {
		if _, err := e.pool.Exec(ctx, q); err != nil {
			return fmt.Errorf("bench: prepare database: %w", err)
		}
	}
	e.binDir = findClientBinDir()
	// Optional: a server without the library preloaded has no statement
	// statistics, and the step scenario says so.
	if _, err := e.pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err == nil {
		var ok bool
		e.statements = e.pool.QueryRow(ctx, `SELECT true FROM pg_stat_statements LIMIT 1`).Scan(&ok) == nil
	}
	return nil
}

// close drops the bench database (and its slots) and stops a throwaway
// cluster.
func (e *env) close() {
	if e.pool != nil {
		e.pool.Close()
	}
	// A throwaway cluster goes with its databases, but Start may have
	// returned an existing server (RELAY_TEST_DATABASE_URL): drop ours.
	if e.dbName != "" && (e.cluster == nil || e.cluster.Kind != pgcluster.KindLocal) {
		dropDatabase(e.adminURL, e.dbName)
	}
	if e.cluster != nil {
		e.cluster.Stop()
	}
}

func dropDatabase(adminURL, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return
	}
	defer admin.Close(ctx)
	admin.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE database = $1 AND active_pid IS NOT NULL`, name)
	for range 50 {
		if _, err := admin.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = $1`, name); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	admin.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
}

// withDatabase points a URL or key=value DSN at another database.
func withDatabase(dsn, db string) (string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", fmt.Errorf("bench: --database-url is not a valid URL")
		}
		u.Path = "/" + db
		return u.String(), nil
	}
	// In a key=value DSN the last occurrence of a key wins.
	return strings.TrimSpace(dsn) + " dbname=" + db, nil
}

// findClientBinDir finds pg_recvlogical and pgbench: next to the server
// binaries, else on PATH ("" then).
func findClientBinDir() string {
	if dir, err := pgcluster.FindBinDir(); err == nil && isExecutable(filepath.Join(dir, "pgbench")) {
		return dir
	}
	if p, err := exec.LookPath("pgbench"); err == nil {
		return filepath.Dir(p)
	}
	return ""
}

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

func (e *env) tool(name string) (string, error) {
	if e.binDir != "" {
		if p := filepath.Join(e.binDir, name); isExecutable(p) {
			return p, nil
		}
	}
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("bench: %s not found: install the PostgreSQL client programs (Debian: postgresql-client)", name)
}

// reset empties the tables the scenarios fill and drops the bench's slots,
// then checkpoints so that no checkpoint left over from loading falls into
// the next measurement (CHECKPOINT needs superuser or pg_checkpoint; without
// it the bench goes on).
func (e *env) reset(ctx context.Context) error {
	if err := e.dropSlots(ctx); err != nil {
		return err
	}
	if _, err := e.pool.Exec(ctx, sqlReset); err != nil {
		return fmt.Errorf("bench: reset tables: %w", err)
	}
	e.checkpoint(ctx)
	return nil
}

func (e *env) checkpoint(ctx context.Context) {
	e.pool.Exec(ctx, "CHECKPOINT")
}

func (e *env) dropSlots(ctx context.Context) error {
	e.pool.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE database = current_database() AND active_pid IS NOT NULL`)
	var err error
	for range 50 {
		if _, err = e.pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = current_database()`); err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("bench: drop slots: %w", err)
}

// slotName is unique on the server: slots are cluster-wide.
func (e *env) slotName(role string) string { return e.dbName + "_" + role }

// createSlot creates a pgoutput slot and records a checkpoint at its
// consistent point, so that the relay's stream resumes from the slot like a
// relay that has run before (no first-start snapshot of rows that are not
// this scenario's).
func (e *env) createSlot(ctx context.Context, slot string, withCheckpoint bool) (pglogrepl.LSN, error) {
	var lsnText string
	if err := e.pool.QueryRow(ctx, `SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')`, slot).Scan(&lsnText); err != nil {
		return 0, fmt.Errorf("bench: create slot %s: %w", slot, err)
	}
	if withCheckpoint {
		if _, err := e.pool.Exec(ctx, `INSERT INTO relay_checkpoints (slot_name, lsn) VALUES ($1, $2::pg_lsn)
			ON CONFLICT (slot_name) DO UPDATE SET lsn = EXCLUDED.lsn`, slot, lsnText); err != nil {
			return 0, fmt.Errorf("bench: checkpoint for slot %s: %w", slot, err)
		}
	}
	return pglogrepl.ParseLSN(lsnText)
}

// currentLSN is the server's WAL insert position.
func (e *env) currentLSN(ctx context.Context) (pglogrepl.LSN, error) {
	var s string
	if err := e.pool.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&s); err != nil {
		return 0, err
	}
	return pglogrepl.ParseLSN(s)
}

// load commits total outbox rows of evType, perTx per transaction, with
// sequence numbers from firstSeq, asynchronously committed: the load is not
// measured, and the WAL it leaves is the same.
func (e *env) load(ctx context.Context, total, perTx int, evType string, firstSeq int64) error {
	conn, err := e.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SET synchronous_commit = off"); err != nil {
		return err
	}
	defer conn.Exec(context.WithoutCancel(ctx), "RESET synchronous_commit")
	// A procedure that commits must be CALLed outside an explicit
	// transaction block: the simple protocol guarantees that.
	_, err = conn.Exec(ctx, "CALL compensa_bench_load($1, $2, $3, $4)", pgx.QueryExecModeSimpleProtocol, int64(total), perTx, evType, firstSeq)
	if err != nil {
		return fmt.Errorf("bench: load %d outbox rows: %w", total, err)
	}
	return nil
}

// emit is load for the table-less outbox: total events as transactional
// logical decoding messages, perTx per transaction (compensa_bench_emit).
func (e *env) emit(ctx context.Context, total, perTx int, evType string, firstSeq int64) error {
	conn, err := e.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SET synchronous_commit = off"); err != nil {
		return err
	}
	defer conn.Exec(context.WithoutCancel(ctx), "RESET synchronous_commit")
	_, err = conn.Exec(ctx, "CALL compensa_bench_emit($1, $2, $3, $4)", pgx.QueryExecModeSimpleProtocol, int64(total), perTx, evType, firstSeq)
	if err != nil {
		return fmt.Errorf("bench: emit %d outbox messages: %w", total, err)
	}
	return nil
}

var errStalled = errors.New("bench: no progress")
