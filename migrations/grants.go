package migrations

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Feature is a part of `relay run` that needs privileges of its own; the
// run-time check asks only for the features a relay's flags turn on, and
// `relay migrate --grant-to` grants every feature's.
type Feature string

const (
	// FeatureRunner is always on: the step workers (claim, advance, journal,
	// the outbox rows steps emit) and the monitor's reads (the overview's
	// counts, dead letters, sinks).
	FeatureRunner Feature = "the step runner and the monitor"
	// FeatureStream is the replication stream and the correlator (every
	// relay not run with --no-stream).
	FeatureStream Feature = "the stream"
	// FeatureRetention is --outbox-retention.
	FeatureRetention Feature = "--outbox-retention"
	// FeatureHistoryRetention is --saga-retention (on by default) and
	// --failed-retention: the janitor that deletes finished instances'
	// history, their tombstones after --dedupe-window, and old dead letters
	// and skipped deliveries.
	FeatureHistoryRetention Feature = "--saga-retention"
	// FeatureSinks is --sinks.
	FeatureSinks Feature = "--sinks"
	// FeatureSagas is --sagas: declared sagas pinned in saga_definitions.
	FeatureSagas Feature = "--sagas"
	// FeatureAPI is what a token (--api-token, --api-tokens) lets the API
	// change beyond the runner's tables: POST /v1/events and
	// POST /v1/sinks/{name}/retry.
	FeatureAPI Feature = "the API's token-authorised writes"
	// FeatureOperations is what the operators' commands run as the same
	// role need: `relay deadletters retry` and `relay migrate` on an
	// up-to-date schema (a no-op that reads compensa_schema_migrations).
	FeatureOperations Feature = "relay migrate and relay deadletters retry"
)

// AllFeatures is every feature, in the order the checks report them.
var AllFeatures = []Feature{FeatureRunner, FeatureStream, FeatureRetention, FeatureHistoryRetention, FeatureSinks, FeatureSagas, FeatureAPI, FeatureOperations}

// Grant is what one feature needs on one table of the relay's schema (or on
// the configured outbox table when Outbox is set). It is the single list of
// what `relay run` needs: every table a migration creates appears here (a
// test holds the list to the catalog), and the sequences behind serial
// columns of a table the role inserts into are found in the catalog, so that
// a new one needs no entry. Identity columns need no grant on their sequence.
type Grant struct {
	Feature    Feature
	Table      string
	Outbox     bool
	Privileges []string
}

// Grants lists, per feature, the privileges `relay run` needs on each table.
// A migration that adds a table adds its entries here.
var Grants = []Grant{
	{FeatureRunner, "saga_instances", false, []string{"SELECT", "UPDATE"}},
	{FeatureRunner, "saga_steps", false, []string{"SELECT", "INSERT", "UPDATE"}},
	{FeatureRunner, "saga_events", false, []string{"SELECT", "INSERT"}},
	// Written by the triggers on saga_instances; the monitor folds the
	// deltas into the counts.
	{FeatureRunner, "saga_status_counts", false, []string{"SELECT", "INSERT", "UPDATE"}},
	{FeatureRunner, "saga_status_deltas", false, []string{"SELECT", "INSERT", "DELETE"}},
	{FeatureRunner, "relay_dead_letters", false, []string{"SELECT"}},
	{FeatureRunner, "relay_sinks", false, []string{"SELECT"}},
	{FeatureRunner, "relay_sink_parked", false, []string{"SELECT"}},
	{FeatureRunner, "saga_definitions", false, []string{"SELECT"}}, // the monitor knows every stored declared saga
	{FeatureRunner, "", true, []string{"INSERT"}},                  // the rows steps emit
	// Steps' rate limits (rate: 50/s), shared by every relay.
	{FeatureRunner, "saga_step_rates", false, []string{"SELECT", "INSERT", "UPDATE"}},

	{FeatureStream, "", true, []string{"SELECT"}}, // the first start's snapshot
	// UPDATE: the checkpoint, and the resync marker (resync_since,
	// resync_checkpoint) written and cleared by --on-slot-lost=resync.
	{FeatureStream, "relay_checkpoints", false, []string{"SELECT", "INSERT", "UPDATE"}},
	{FeatureStream, "saga_instances", false, []string{"SELECT", "INSERT", "UPDATE"}},
	{FeatureStream, "saga_events", false, []string{"SELECT", "INSERT"}},
	{FeatureStream, "saga_status_deltas", false, []string{"INSERT"}},
	{FeatureStream, "relay_dead_letters", false, []string{"SELECT", "INSERT"}},
	{FeatureStream, "relay_inbox", false, []string{"SELECT", "INSERT"}},

	{FeatureRetention, "", true, []string{"SELECT", "DELETE"}},

	// Tombstoning updates the instance row; deleting a tombstone fires the
	// triggers that delete its children and append a status delta.
	{FeatureHistoryRetention, "saga_instances", false, []string{"SELECT", "UPDATE", "DELETE"}},
	{FeatureHistoryRetention, "saga_steps", false, []string{"SELECT", "DELETE"}},
	{FeatureHistoryRetention, "saga_events", false, []string{"SELECT", "DELETE"}},
	{FeatureHistoryRetention, "relay_inbox", false, []string{"SELECT", "DELETE"}},
	{FeatureHistoryRetention, "relay_checkpoints", false, []string{"SELECT"}},
	{FeatureHistoryRetention, "saga_status_deltas", false, []string{"SELECT", "INSERT", "DELETE"}},
	{FeatureHistoryRetention, "saga_status_counts", false, []string{"SELECT", "INSERT", "UPDATE"}},
	{FeatureHistoryRetention, "relay_dead_letters", false, []string{"SELECT", "DELETE"}},
	{FeatureHistoryRetention, "relay_sink_skipped", false, []string{"SELECT", "DELETE"}},

	{FeatureSinks, "relay_sinks", false, []string{"SELECT", "INSERT", "UPDATE"}},
	{FeatureSinks, "relay_sink_parked", false, []string{"SELECT", "INSERT", "UPDATE", "DELETE"}},

	{FeatureSagas, "saga_definitions", false, []string{"SELECT", "INSERT"}},
	{FeatureSagas, "saga_instances", false, []string{"SELECT"}},

	{FeatureAPI, "", true, []string{"SELECT", "INSERT"}}, // POST /v1/events and /v1/sagas: written once per id
	{FeatureAPI, "relay_sinks", false, []string{"SELECT", "UPDATE"}},
	{FeatureAPI, "relay_sink_parked", false, []string{"SELECT", "UPDATE", "DELETE"}},
	{FeatureAPI, "relay_sink_skipped", false, []string{"SELECT", "INSERT"}}, // skip a parked event
	// POST /v1/sagas: the secret of a start's id, and whether the id's
	// instance is there already.
	{FeatureAPI, "relay_secrets", false, []string{"SELECT"}},
	{FeatureAPI, "saga_instances", false, []string{"SELECT"}},

	{FeatureOperations, "compensa_schema_migrations", false, []string{"SELECT"}},
	{FeatureOperations, "relay_dead_letters", false, []string{"SELECT", "UPDATE"}},
	{FeatureOperations, "", true, []string{"SELECT"}},
	{FeatureOperations, "relay_sinks", false, []string{"SELECT"}},
	{FeatureOperations, "saga_definitions", false, []string{"SELECT"}}, // relay sagas: the stored declared sagas
	{FeatureOperations, "relay_sink_parked", false, []string{"SELECT", "DELETE"}},
	{FeatureOperations, "relay_sink_skipped", false, []string{"SELECT", "INSERT"}}, // relay sinks skip
}

// Privilege is one privilege on one object, and the feature that needs it.
type Privilege struct {
	// Kind is "table", "sequence" or "schema".
	Kind string
	// Object is the object's name as a GRANT statement spells it.
	Object    string
	Privilege string
	Feature   Feature
}

// Statement is the GRANT that gives role this privilege.
func (p Privilege) Statement(role string) string {
	kw := ""
	switch p.Kind {
	case "sequence":
		kw = "SEQUENCE "
	case "schema":
		kw = "SCHEMA "
	}
	return fmt.Sprintf("GRANT %s ON %s%s TO %s;", p.Privilege, kw, p.Object, pgx.Identifier{role}.Sanitize())
}

// Missing says which privilege role lacks, what needs it and how to grant
// it, as one line.
func (p Privilege) Missing(role string) string {
	obj := p.Object
	if p.Kind != "table" {
		obj = p.Kind + " " + p.Object
	}
	return fmt.Sprintf("missing privilege: %s on %s, for %s (run: relay migrate --grant-to %s, or %s)",
		p.Privilege, obj, p.Feature, role, strings.TrimSuffix(p.Statement(role), ";"))
}

// Querier is what the privilege functions read the catalog through: a
// *pgx.Conn, a *pgxpool.Pool or a pgx.Tx.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// sqlResolve looks up a table and its schema; the name is read as a
// qualified identifier against the search path.
const sqlResolve = `
SELECT c.oid::regclass::text, quote_ident(n.nspname)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.oid = to_regclass($1)`

// sqlSerialSequences lists the sequences behind the serial columns of a
// table (a column default's nextval checks USAGE; an identity column's does
// not, and is left out).
const sqlSerialSequences = `
SELECT s.oid::regclass::text FROM pg_depend d JOIN pg_class s ON s.oid = d.objid
WHERE d.classid = 'pg_class'::regclass AND d.refclassid = 'pg_class'::regclass
  AND d.refobjid = to_regclass($1) AND d.deptype = 'a' AND s.relkind = 'S'
ORDER BY 1`

// Required returns every privilege the given features need, resolved
// against the catalog: outboxTable is the configured outbox table as an SQL
// name (outbox.TableName.Quoted), the sequences behind serial columns of the
// tables the role inserts into come with USAGE, and each schema of those
// tables with USAGE. A table that does not exist is an error that says to
// run `relay migrate`.
func Required(ctx context.Context, q Querier, outboxTable string, features ...Feature) ([]Privilege, error) {
	var out []Privilege
	seen := map[string]bool{}
	add := func(p Privilege) {
		k := p.Kind + " " + p.Object + " " + p.Privilege
		if !seen[k] {
			seen[k] = true
			out = append(out, p)
		}
	}
	resolved := map[string][2]string{}
	for _, f := range AllFeatures {
		if !slices.Contains(features, f) {
			continue
		}
		for _, g := range Grants {
			if g.Feature != f {
				continue
			}
			name := pgx.Identifier{g.Table}.Sanitize()
			if g.Outbox {
				name = outboxTable
			}
			r, ok := resolved[name]
			if !ok {
				err := q.QueryRow(ctx, sqlResolve, name).Scan(&r[0], &r[1])
				if err == pgx.ErrNoRows && g.Outbox {
					// The stream's own check names a missing outbox
					// table, with what to do about it.
					continue
				}
				if err == pgx.ErrNoRows {
					return nil, fmt.Errorf("the relay's table %s does not exist: run `relay migrate` (as the schema's owner) first", name)
				}
				if err != nil {
					return nil, fmt.Errorf("look up table %s: %w", name, err)
				}
				resolved[name] = r
			}
			add(Privilege{Kind: "schema", Object: r[1], Privilege: "USAGE", Feature: f})
			for _, priv := range g.Privileges {
				add(Privilege{Kind: "table", Object: r[0], Privilege: priv, Feature: f})
			}
			if !slices.Contains(g.Privileges, "INSERT") {
				continue
			}
			seqs, err := serialSequences(ctx, q, name)
			if err != nil {
				return nil, err
			}
			for _, s := range seqs {
				add(Privilege{Kind: "sequence", Object: s, Privilege: "USAGE", Feature: f})
			}
		}
	}
	return out, nil
}

func serialSequences(ctx context.Context, q Querier, table string) ([]string, error) {
	rows, err := q.Query(ctx, sqlSerialSequences, table)
	if err != nil {
		return nil, fmt.Errorf("look up the sequences of %s: %w", table, err)
	}
	seqs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("look up the sequences of %s: %w", table, err)
	}
	return seqs, nil
}

// sqlHas lists the privileges role lacks. Objects are spelt as a GRANT
// spells them; a schema's name is read back from its quoted form, since
// has_schema_privilege takes the name itself, not an identifier.
const sqlHas = `
SELECT t.i FROM unnest($2::text[], $3::text[], $4::text[]) WITH ORDINALITY AS t(kind, obj, priv, i)
WHERE NOT CASE t.kind
    WHEN 'table'    THEN has_table_privilege($1, t.obj, t.priv)
    WHEN 'sequence' THEN has_sequence_privilege($1, t.obj, t.priv)
    ELSE                 has_schema_privilege($1, (parse_ident(t.obj))[1], t.priv) END
ORDER BY t.i`

// Lacking returns the privileges of want that role does not hold, in
// want's order. A superuser holds them all.
func Lacking(ctx context.Context, q Querier, role string, want []Privilege) ([]Privilege, error) {
	if len(want) == 0 {
		return nil, nil
	}
	var kinds, objs, privs []string
	for _, p := range want {
		kinds, objs, privs = append(kinds, p.Kind), append(objs, p.Object), append(privs, p.Privilege)
	}
	rows, err := q.Query(ctx, sqlHas, role, kinds, objs, privs)
	if err != nil {
		return nil, fmt.Errorf("check the privileges of role %q: %w", role, err)
	}
	idx, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("check the privileges of role %q: %w", role, err)
	}
	var out []Privilege
	for _, i := range idx {
		out = append(out, want[i-1])
	}
	return out, nil
}

// GrantTo grants role every privilege `relay run` needs for every feature
// (and nothing else: no CREATE, no ownership), on the relay's tables, the
// sequences behind their serial columns, their schema and the outbox table
// (outboxTable as in Required). Privileges role already holds are not
// granted again, so that a second call is a no-op. It returns the statements
// it ran. Privileges it could not grant (the migrating role does not own the
// outbox table, for example) are an ErrPrivilege error that names each one
// with its statement.
func GrantTo(ctx context.Context, db Conn, role, outboxTable string) ([]string, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("grant: begin: %w", err)
	}
	defer tx.Rollback(ctx)
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)`, role).Scan(&exists); err != nil {
		return nil, fmt.Errorf("grant: look up role %q: %w", role, err)
	}
	if !exists {
		return nil, fmt.Errorf("--grant-to %s: no such role; create it first (as a superuser or a role with CREATEROLE): CREATE ROLE %s LOGIN REPLICATION PASSWORD '...';",
			role, pgx.Identifier{role}.Sanitize())
	}
	want, err := Required(ctx, tx, outboxTable, AllFeatures...)
	if err != nil {
		return nil, err
	}
	lack, err := Lacking(ctx, tx, role, want)
	if err != nil {
		return nil, err
	}
	// One statement per object, its privileges in the list's order.
	type object struct{ kind, name string }
	var order []object
	privs := map[object][]string{}
	for _, p := range lack {
		o := object{p.Kind, p.Object}
		if _, ok := privs[o]; !ok {
			order = append(order, o)
		}
		if !slices.Contains(privs[o], p.Privilege) {
			privs[o] = append(privs[o], p.Privilege)
		}
	}
	var ran []string
	for _, o := range order {
		st := Privilege{Kind: o.kind, Object: o.name, Privilege: strings.Join(privs[o], ", ")}.Statement(role)
		// A savepoint per statement: one the migrating role may not run
		// is reported with the others below, not in place of them.
		if _, err := tx.Exec(ctx, "SAVEPOINT grant_one"); err != nil {
			return nil, fmt.Errorf("grant: %w", err)
		}
		if _, err := tx.Exec(ctx, st); err != nil {
			if _, rerr := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT grant_one"); rerr != nil {
				return nil, fmt.Errorf("grant: %s: %w", st, err)
			}
			continue
		}
		ran = append(ran, st)
	}
	still, err := Lacking(ctx, tx, role, want)
	if err != nil {
		return nil, err
	}
	var me string
	if err := tx.QueryRow(ctx, `SELECT current_user`).Scan(&me); err != nil {
		return nil, fmt.Errorf("grant: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("grant: commit: %w", err)
	}
	if len(still) > 0 {
		lines := make([]string, 0, len(still))
		for _, p := range still {
			lines = append(lines, fmt.Sprintf("%s on %s %s (as the object's owner: %s)", p.Privilege, p.Kind, p.Object, p.Statement(role)))
		}
		return ran, &privilegeError{
			msg: fmt.Sprintf("role %q could not grant role %q every privilege relay run needs (it does not own these objects, or lacks their grant option): %s",
				me, role, strings.Join(lines, "; ")),
			cause: fmt.Errorf("%d privilege(s) not granted", len(still)),
		}
	}
	return ran, nil
}
