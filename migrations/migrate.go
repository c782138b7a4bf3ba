// Package migrations owns Compensa's schema: embedded, numbered, forward-only SQL
// files applied in order under a transaction-scoped advisory lock and recorded in
// compensa_schema_migrations. Applying twice is a no-op. A released file is never
// edited: a change is a new file with the next number.
//
// The same code runs behind `relay migrate` and behind Apply for applications that
// embed the library.
package migrations

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

//go:embed sql/*.sql
var coreFS embed.FS

//go:embed examples/*.sql
var examplesFS embed.FS

// lockKey serialises concurrent migrators (several relay replicas starting at
// once). The value is arbitrary but fixed forever.
const lockKey int64 = 0x636f6d70656e7361 // "compensa"

// Set names a group of migrations with its own numbering.
type Set string

const (
	// Core is the relay's own schema.
	Core Set = "core"
	// Examples is the example application schema used by the demo
	// (`relay migrate --with-examples`).
	Examples Set = "examples"
)

// Migration is one numbered SQL file.
type Migration struct {
	Set     Set
	Version int
	Name    string
	SQL     string
}

// Options selects what Apply applies. The zero value applies the core schema.
type Options struct {
	WithExamples bool
	// CustomOutbox says the application's outbox is a table of its own (another
	// name, or columns mapped with --outbox-columns): the default `outbox`
	// table is then neither created nor altered, and a table named outbox is
	// left as its owner made it.
	CustomOutbox bool
}

// Applied reports one migration that Apply ran.
type Applied struct {
	Set     Set
	Version int
	Name    string
}

// Conn is what Apply needs: a *pgx.Conn, a *pgxpool.Pool or a pgx.Tx.
type Conn interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// List returns the migrations of the chosen sets in the order Apply runs them.
func List(opts Options) ([]Migration, error) {
	all, err := load(coreFS, "sql", Core)
	if err != nil {
		return nil, err
	}
	if opts.WithExamples {
		ex, err := load(examplesFS, "examples", Examples)
		if err != nil {
			return nil, err
		}
		all = append(all, ex...)
	}
	return all, nil
}

// Apply runs every migration not yet recorded, each in its own transaction,
// under an advisory lock so that concurrent callers apply each file once. It
// returns what it ran; an up-to-date database yields an empty slice.
func Apply(ctx context.Context, db Conn, opts Options) ([]Applied, error) {
	ms, err := List(opts)
	if err != nil {
		return nil, err
	}
	role, err := ensureTable(ctx, db)
	if err != nil {
		return nil, explainPrivilege(role, err)
	}
	var ran []Applied
	for _, m := range ms {
		did, err := applyOne(ctx, db, m, opts)
		if err != nil {
			return ran, explainPrivilege(role, err)
		}
		if did {
			ran = append(ran, Applied{Set: m.Set, Version: m.Version, Name: m.Name})
		}
	}
	return ran, nil
}

// ensureTable creates the table of applied migrations and returns the
// migrating role, for the messages of privilege errors.
func ensureTable(ctx context.Context, db Conn) (role string, err error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return "", fmt.Errorf("migrate: begin: %w", err)
	}
	defer tx.Rollback(ctx)
	if err := tx.QueryRow(ctx, `SELECT current_user`).Scan(&role); err != nil {
		return "", fmt.Errorf("migrate: %w", err)
	}
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, lockKey); err != nil {
		return role, fmt.Errorf("migrate: advisory lock: %w", err)
	}
	// CREATE TABLE IF NOT EXISTS needs CREATE on the schema even when the
	// table exists: a role without it (the relay's own) migrating an
	// up-to-date schema must get a no-op, not "permission denied".
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT to_regclass('compensa_schema_migrations') IS NOT NULL`).Scan(&exists); err != nil {
		return role, fmt.Errorf("migrate: look up compensa_schema_migrations: %w", err)
	}
	if exists {
		return role, tx.Commit(ctx)
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS compensa_schema_migrations (
		set_name   text NOT NULL,
		version    integer NOT NULL,
		name       text NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now(),
		PRIMARY KEY (set_name, version))`); err != nil {
		return role, fmt.Errorf("migrate: create compensa_schema_migrations: %w", err)
	}
	return role, tx.Commit(ctx)
}

func applyOne(ctx context.Context, db Conn, m Migration, opts Options) (bool, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("migrate: begin: %w", err)
	}
	defer tx.Rollback(ctx)
	// The lock is taken before the "already applied?" read so that two
	// migrators cannot both decide to run the same file.
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, lockKey); err != nil {
		return false, fmt.Errorf("migrate: advisory lock: %w", err)
	}
	var done bool
	if err := tx.QueryRow(ctx,
		`SELECT EXISTS (SELECT 1 FROM compensa_schema_migrations WHERE set_name = $1 AND version = $2)`,
		string(m.Set), m.Version).Scan(&done); err != nil {
		return false, fmt.Errorf("migrate: read applied: %w", err)
	}
	if done {
		return false, nil
	}
	custom := "off"
	if opts.CustomOutbox {
		custom = "on"
	}
	// Migrations read the setting (0002); it lasts until the commit.
	if _, err := tx.Exec(ctx, `SELECT set_config('compensa.custom_outbox', $1, true)`, custom); err != nil {
		return false, fmt.Errorf("migrate: %w", err)
	}
	// 0001 creates the default outbox table unconditionally, and a released
	// file is never edited: with an outbox of the application's own, a
	// default table 0001 creates is dropped again in the same transaction,
	// so that nobody ever sees a public.outbox they did not ask for.
	dropDefaultOutbox := false
	if opts.CustomOutbox && m.Set == Core && m.Version == 1 {
		if err := tx.QueryRow(ctx, `SELECT to_regclass('outbox') IS NULL`).Scan(&dropDefaultOutbox); err != nil {
			return false, fmt.Errorf("migrate: look up the outbox table: %w", err)
		}
	}
	if _, err := tx.Exec(ctx, m.SQL); err != nil {
		return false, fmt.Errorf("migrate: %s %04d_%s: %w", m.Set, m.Version, m.Name, err)
	}
	if dropDefaultOutbox {
		if _, err := tx.Exec(ctx, `DROP TABLE outbox`); err != nil {
			return false, fmt.Errorf("migrate: drop the default outbox table 0001 created: %w", err)
		}
	}
	if _, err := tx.Exec(ctx,
		`INSERT INTO compensa_schema_migrations (set_name, version, name) VALUES ($1, $2, $3)`,
		string(m.Set), m.Version, m.Name); err != nil {
		return false, fmt.Errorf("migrate: record %s %04d: %w", m.Set, m.Version, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("migrate: commit %s %04d: %w", m.Set, m.Version, err)
	}
	return true, nil
}

func load(fsys fs.FS, dir string, set Set) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("migrate: read embedded %s: %w", dir, err)
	}
	var out []Migration
	seen := map[int]string{}
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".sql") {
			continue
		}
		base := strings.TrimSuffix(e.Name(), ".sql")
		num, name, ok := strings.Cut(base, "_")
		if !ok {
			return nil, fmt.Errorf("migrate: %s: file name must be NNNN_name.sql", e.Name())
		}
		v, err := strconv.Atoi(num)
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("migrate: %s: file name must start with a positive number", e.Name())
		}
		if prev, dup := seen[v]; dup {
			return nil, fmt.Errorf("migrate: %s and %s share number %d", prev, e.Name(), v)
		}
		seen[v] = e.Name()
		body, err := fs.ReadFile(fsys, path.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		out = append(out, Migration{Set: set, Version: v, Name: name, SQL: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}
