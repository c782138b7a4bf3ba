package cdc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/compensa/compensa/outbox"
)

// Querier is what Preflight, Setup and QueryLag need: a *pgx.Conn, a
// *pgxpool.Pool or a pgx.Tx.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Field positions, in the order of outbox.Fields.
const (
	fID = iota
	fTenantID
	fAggregateType
	fAggregateID
	fEventType
	fPayload
	fHeaders
	fCorrelationID
	fCausationID
	fCreatedAt
	nFields
)

func init() {
	if len(outbox.Fields) != nFields {
		panic("cdc: outbox.Fields changed; update the field positions in catalog.go")
	}
}

// requiredFields cannot be left out: without them an event means nothing.
var requiredFields = []int{fID, fEventType, fPayload}

// fieldTypes are the base types the relay can read for each field.
var fieldTypes = [nFields][]string{
	fID:            {"uuid", "text", "varchar"},
	fTenantID:      {"uuid", "text", "varchar"},
	fAggregateType: {"text", "varchar"},
	fAggregateID:   {"text", "varchar", "uuid", "int2", "int4", "int8"},
	fEventType:     {"text", "varchar"},
	fPayload:       {"jsonb", "json", "text", "varchar", "bytea"},
	fHeaders:       {"jsonb", "json", "text", "varchar"},
	fCorrelationID: {"uuid", "text", "varchar"},
	fCausationID:   {"uuid", "text", "varchar"},
	fCreatedAt:     {"timestamptz", "timestamp"},
}

// Type OIDs the decoder treats specially.
const (
	oidBytea       = 17
	oidText        = 25
	oidJSON        = 114
	oidVarchar     = 1043
	oidTimestamp   = 1114
	oidTimestamptz = 1184
	oidUUID        = 2950
	oidJSONB       = 3802
)

type columnInfo struct {
	typ     string // as declared, for messages
	base    string // base type name (domains resolved)
	baseOID uint32
}

// tableInfo is the outbox table as the catalog describes it.
type tableInfo struct {
	oid       uint32
	name      outbox.TableName // schema always set
	relkind   string
	owner     bool // current_user may act as the owner (CREATE PUBLICATION)
	ownerName string
	canSelect bool
	canDelete bool
	cols      map[string]columnInfo
	// field → column name, "" when the table lacks an optional field.
	fieldCol [nFields]string
}

func (t *tableInfo) quoted() string { return t.name.Quoted() }

const sqlTable = `
SELECT c.oid, n.nspname, c.relname, c.relkind::text,
       pg_has_role(c.relowner, 'USAGE'),
       has_table_privilege(c.oid, 'SELECT'), has_table_privilege(c.oid, 'DELETE'),
       pg_get_userbyid(c.relowner)::text
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.oid = to_regclass($1)`

const sqlColumns = `
SELECT a.attname, format_type(a.atttypid, a.atttypmod), bt.typname, bt.oid
FROM pg_attribute a
JOIN pg_type t ON t.oid = a.atttypid
JOIN pg_type bt ON bt.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END
WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped`

// inspectTable finds the outbox table and checks the column map against it.
func inspectTable(ctx context.Context, q Querier, cfg *Config) (*tableInfo, error) {
	t := &tableInfo{cols: map[string]columnInfo{}}
	err := q.QueryRow(ctx, sqlTable, cfg.Table.Quoted()).Scan(&t.oid, &t.name.Schema, &t.name.Name, &t.relkind, &t.owner, &t.canSelect, &t.canDelete, &t.ownerName)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, errorf(ErrOutboxTable, "outbox table %s does not exist (or is not on the search path): run `relay migrate`, or pass --outbox-table with the schema-qualified name of your outbox table", cfg.Table.Quoted())
	}
	if err != nil {
		return nil, fmt.Errorf("cdc: look up outbox table %s: %w", cfg.Table.Quoted(), err)
	}
	if t.relkind != "r" && t.relkind != "p" {
		return nil, errorf(ErrOutboxTable, "outbox table %s is not a table (relkind %q): logical replication publishes tables only", t.quoted(), t.relkind)
	}
	rows, err := q.Query(ctx, sqlColumns, t.oid)
	if err != nil {
		return nil, fmt.Errorf("cdc: read the columns of %s: %w", t.quoted(), err)
	}
	var name string
	var c columnInfo
	if _, err := pgx.ForEachRow(rows, []any{&name, &c.typ, &c.base, &c.baseOID}, func() error {
		t.cols[name] = c
		return nil
	}); err != nil {
		return nil, fmt.Errorf("cdc: read the columns of %s: %w", t.quoted(), err)
	}
	for i, field := range outbox.Fields {
		col := cfg.Columns[field]
		c, ok := t.cols[col]
		if !ok {
			// A field mapped explicitly, or one we cannot do without, must
			// exist; an optional field under its default name may be absent
			// (an existing outbox table need not have our extras).
			if slices.Contains(requiredFields, i) || col != field {
				return nil, errorf(ErrOutboxColumn, "outbox table %s has no column %q for field %s: add the column or map the field with --outbox-columns %s=<column>", t.quoted(), col, field, field)
			}
			continue
		}
		if !slices.Contains(fieldTypes[i], c.base) {
			return nil, errorf(ErrOutboxColumn, "outbox column %q of %s (field %s) has type %s; the relay reads %s", col, t.quoted(), field, c.typ, strings.Join(fieldTypes[i], ", "))
		}
		t.fieldCol[i] = col
	}
	if cfg.Retention > 0 && t.fieldCol[fCreatedAt] == "" {
		return nil, errorf(ErrOutboxColumn, "outbox retention needs a created_at column, and %s has none: map it with --outbox-columns created_at=<column> or turn retention off", t.quoted())
	}
	return t, nil
}

// checkTablePrivileges names the grant a role lacks.
func checkTablePrivileges(t *tableInfo, cfg *Config, role string) error {
	if !t.canSelect {
		return errorf(ErrPrivilege, "role %q cannot read the outbox table: GRANT SELECT ON %s TO %s (the first start reads the rows written before the slot existed)", role, t.quoted(), pgx.Identifier{role}.Sanitize())
	}
	if cfg.Retention > 0 && !t.canDelete {
		return errorf(ErrPrivilege, "role %q cannot delete from the outbox table, which retention needs: GRANT DELETE ON %s TO %s, or turn retention off", role, t.quoted(), pgx.Identifier{role}.Sanitize())
	}
	return nil
}

const sqlPublication = `
SELECT p.pubinsert, p.puballtables, p.pubviaroot,
       EXISTS (SELECT 1 FROM pg_publication_tables pt
               WHERE pt.pubname = p.pubname AND pt.schemaname = $2 AND pt.tablename = $3)
FROM pg_publication p WHERE p.pubname = $1`

// checkPublication reports whether the publication exists, and an error when
// it exists but cannot serve the outbox table.
func checkPublication(ctx context.Context, q Querier, t *tableInfo, pub string) (bool, error) {
	var insert, all, viaRoot, covers bool
	err := q.QueryRow(ctx, sqlPublication, pub, t.name.Schema, t.name.Name).Scan(&insert, &all, &viaRoot, &covers)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("cdc: look up publication %q: %w", pub, err)
	}
	qp := pgx.Identifier{pub}.Sanitize()
	if !insert {
		return true, errorf(ErrPublication, "publication %s does not publish inserts: ALTER PUBLICATION %s SET (publish = 'insert')", qp, qp)
	}
	if t.relkind == "p" && !viaRoot {
		// Inserts would arrive under the partitions' names, which the stream
		// does not take for the outbox: they would be skipped.
		return true, errorf(ErrPublication, "publication %s publishes the partitions of %s under their own names: ALTER PUBLICATION %s SET (publish_via_partition_root = true)", qp, t.quoted(), qp)
	}
	if !covers && !all {
		return true, errorf(ErrPublication, "publication %s does not include the outbox table %s: ALTER PUBLICATION %s ADD TABLE %s", qp, t.quoted(), qp, t.quoted())
	}
	return true, nil
}

// ensurePublication creates the publication when it is missing: inserts of
// the outbox table only, nothing else leaves the database through it.
func ensurePublication(ctx context.Context, q Querier, t *tableInfo, pub string) (created bool, err error) {
	exists, err := checkPublication(ctx, q, t, pub)
	if exists || err != nil {
		return false, err
	}
	with := "publish = 'insert'"
	if t.relkind == "p" {
		with += ", publish_via_partition_root = true"
	}
	qp := pgx.Identifier{pub}.Sanitize()
	_, err = q.Exec(ctx, "CREATE PUBLICATION "+qp+" FOR TABLE "+t.quoted()+" WITH ("+with+")")
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return true, nil
	case errors.As(err, &pgErr) && pgErr.Code == "42710": // another replica was first
		_, err = checkPublication(ctx, q, t, pub)
		return false, err
	case errors.As(err, &pgErr) && pgErr.Code == "42501":
		return false, errorf(ErrPublication, "publication %s does not exist and this role may not create it (%s): as %s, the owner of %s, with CREATE on the database, run `relay migrate --create-slot` or CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert');",
			qp, pgErr.Message, pgx.Identifier{t.ownerName}.Sanitize(), t.quoted(), qp, t.quoted())
	default:
		return false, fmt.Errorf("cdc: create publication %s: %w", qp, err)
	}
}

// slotInfo is one row of pg_replication_slots.
type slotInfo struct {
	plugin, slotType, database, walStatus *string
	currentDB                             string
	active                                bool
	activePID                             *int32
	confirmedFlush                        pglogrepl.LSN
}

const sqlSlot = `
SELECT plugin, slot_type, database, active, active_pid, wal_status,
       coalesce(confirmed_flush_lsn, '0/0')::text, current_database()
FROM pg_replication_slots WHERE slot_name = $1`

// lookupSlot returns nil when the slot does not exist.
func lookupSlot(ctx context.Context, q Querier, slot string) (*slotInfo, error) {
	s := &slotInfo{}
	var lsn string
	err := q.QueryRow(ctx, sqlSlot, slot).Scan(&s.plugin, &s.slotType, &s.database, &s.active, &s.activePID, &s.walStatus, &lsn, &s.currentDB)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cdc: look up slot %q: %w", slot, err)
	}
	if s.confirmedFlush, err = pglogrepl.ParseLSN(lsn); err != nil {
		return nil, fmt.Errorf("cdc: slot %q: confirmed_flush_lsn %q: %w", slot, lsn, err)
	}
	return s, nil
}

func (s *slotInfo) lost() bool { return s.walStatus != nil && *s.walStatus == "lost" }

// usable says why a slot of our name is not ours to stream.
func (s *slotInfo) usable(slot string) error {
	str := func(p *string) string {
		if p == nil {
			return "none"
		}
		return *p
	}
	switch {
	case str(s.slotType) != "logical":
		return errorf(ErrSlotUnusable, "replication slot %q is a %s slot, not a logical one: pick another --slot", slot, str(s.slotType))
	case str(s.plugin) != "pgoutput":
		return errorf(ErrSlotUnusable, "replication slot %q decodes with plugin %q, not pgoutput: pick another --slot", slot, str(s.plugin))
	case str(s.database) != s.currentDB:
		return errorf(ErrSlotUnusable, "replication slot %q belongs to database %q, not %q: pick another --slot", slot, str(s.database), s.currentDB)
	}
	return nil
}

func slotLostError(slot string, s *slotInfo, ckpt pglogrepl.LSN, hasCkpt bool) error {
	what := fmt.Sprintf("replication slot %q does not exist", slot)
	if s != nil {
		what = fmt.Sprintf("replication slot %q was invalidated by PostgreSQL (wal_status 'lost': it removed WAL the slot still needed, see max_slot_wal_keep_size)", slot)
	}
	since := ""
	if hasCkpt {
		since = fmt.Sprintf(" after the relay's checkpoint %s", ckpt)
	}
	return errorf(ErrSlotLost, "%s: outbox events committed%s may have been skipped; the relay will not re-create it on its own. Check the outbox rows committed since then, then restart with --recreate-slot (rows still in the outbox table are re-read and their duplicates absorbed; deleted rows are lost)", what, since)
}

const sqlCheckpoint = `SELECT lsn::text FROM relay_checkpoints WHERE slot_name = $1`

// readCheckpoint is the default Config.LoadCheckpoint.
func readCheckpoint(ctx context.Context, q Querier, slot string) (pglogrepl.LSN, bool, error) {
	var s string
	err := q.QueryRow(ctx, sqlCheckpoint, slot).Scan(&s)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("cdc: read the checkpoint of slot %q: %w", slot, err)
	}
	lsn, err := pglogrepl.ParseLSN(s)
	if err != nil {
		return 0, false, fmt.Errorf("cdc: checkpoint of slot %q: %w", slot, err)
	}
	return lsn, true, nil
}
