package cdc

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

const sqlServer = `
SELECT current_setting('wal_level'), current_user, r.rolreplication, r.rolsuper,
       EXISTS (SELECT 1 FROM pg_roles m WHERE m.rolname = 'rds_replication'
               AND pg_has_role(current_user, m.oid, 'MEMBER')),
       has_database_privilege(current_database(), 'CREATE'), current_database()
FROM pg_roles r WHERE r.rolname = current_user`

type serverInfo struct {
	walLevel, role          string
	replication, super, rds bool
	createInDB              bool
	database                string
}

func inspectServer(ctx context.Context, q Querier) (*serverInfo, error) {
	s := &serverInfo{}
	if err := q.QueryRow(ctx, sqlServer).Scan(&s.walLevel, &s.role, &s.replication, &s.super, &s.rds, &s.createInDB, &s.database); err != nil {
		return nil, fmt.Errorf("cdc: read server settings: %w", err)
	}
	return s, nil
}

func (s *serverInfo) check() error {
	if s.walLevel != "logical" {
		return errorf(ErrWALLevel, "wal_level is %q but logical replication needs 'logical': run ALTER SYSTEM SET wal_level = logical; as a superuser, then restart PostgreSQL", s.walLevel)
	}
	if !s.replication && !s.super && !s.rds {
		r := pgx.Identifier{s.role}.Sanitize()
		return errorf(ErrReplicationPrivilege, "role %q may not use logical replication: run ALTER ROLE %s REPLICATION; as a superuser (no superuser rights are needed otherwise)", s.role, r)
	}
	return nil
}

// Preflight checks, read-only, everything Run needs before it streams, and
// returns the first problem as one line that says how to fix it: wal_level,
// the REPLICATION attribute, the outbox table, each mapped column and its
// type, the grants, the publication, and the slot (ErrSlotLost when it is
// invalidated, or missing while a checkpoint exists). q may be a connection,
// a pool or a transaction. Errors carry the kinds declared in errors.go.
func Preflight(ctx context.Context, q Querier, cfg Config) error {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(false); err != nil {
		return err
	}
	srv, err := inspectServer(ctx, q)
	if err != nil {
		return err
	}
	if err := srv.check(); err != nil {
		return err
	}
	t, err := inspectTable(ctx, q, &cfg)
	if err != nil {
		return err
	}
	if err := checkTablePrivileges(t, &cfg, srv.role); err != nil {
		return err
	}
	exists, err := checkPublication(ctx, q, t, cfg.Publication)
	if err != nil {
		return err
	}
	if !exists && (!t.owner || !srv.createInDB) {
		return missingPublicationError(srv, t, cfg.Publication)
	}
	slot, err := lookupSlot(ctx, q, cfg.Slot)
	if err != nil {
		return err
	}
	if slot != nil {
		if err := slot.usable(cfg.Slot); err != nil {
			return err
		}
	}
	if cfg.RecreateSlot || cfg.OnSlotLost == SlotLostResync {
		return nil // Run re-creates a lost slot
	}
	if slot != nil && slot.lost() {
		return slotLostError(cfg.Slot, slot, 0, false)
	}
	if slot == nil {
		load := cfg.LoadCheckpoint
		if load == nil {
			load = func(ctx context.Context) (pglogrepl.LSN, bool, error) { return readCheckpoint(ctx, q, cfg.Slot) }
		}
		ckpt, ok, err := load(ctx)
		if err != nil {
			return err
		}
		if ok {
			return slotLostError(cfg.Slot, nil, ckpt, true)
		}
	}
	return nil
}

// Setup creates the publication and the slot when they are missing, so that
// nothing written after it returns is missed (`relay migrate
// --create-slot`). Call it on a connection or pool, not inside a transaction
// that has written: PostgreSQL creates a logical slot only outside one.
// A slot that exists and is invalidated is an ErrSlotLost.
func Setup(ctx context.Context, q Querier, cfg Config) error {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(false); err != nil {
		return err
	}
	srv, err := inspectServer(ctx, q)
	if err != nil {
		return err
	}
	if err := srv.check(); err != nil {
		return err
	}
	t, err := inspectTable(ctx, q, &cfg)
	if err != nil {
		return err
	}
	if _, err := ensurePublication(ctx, q, t, cfg.Publication); err != nil {
		return err
	}
	slot, err := lookupSlot(ctx, q, cfg.Slot)
	if err != nil {
		return err
	}
	if slot != nil {
		if err := slot.usable(cfg.Slot); err != nil {
			return err
		}
		if slot.lost() {
			return slotLostError(cfg.Slot, slot, 0, false)
		}
		return nil
	}
	// On PostgreSQL 17 and later the slot is a failover slot, synchronized to
	// standbys that have sync_replication_slots on.
	var major int
	if err := q.QueryRow(ctx, `SELECT current_setting('server_version_num')::int / 10000`).Scan(&major); err != nil {
		return fmt.Errorf("cdc: read the server version: %w", err)
	}
	if major >= failoverMajor {
		_, err = q.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput', false, false, true)`, cfg.Slot)
	} else {
		_, err = q.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, cfg.Slot)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42710" { // created meanwhile by a relay
		return nil
	}
	if err != nil {
		return fmt.Errorf("cdc: create replication slot %q: %w", cfg.Slot, err)
	}
	return nil
}

// missingPublicationError says exactly what keeps the role from creating the
// publication (owning the table, CREATE on the database, or both), and the
// statements that fix it.
func missingPublicationError(srv *serverInfo, t *tableInfo, pub string) error {
	qp := pgx.Identifier{pub}.Sanitize()
	r := pgx.Identifier{srv.role}.Sanitize()
	db := pgx.Identifier{srv.database}.Sanitize()
	create := fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert');", qp, t.quoted())
	switch {
	case !t.owner && !srv.createInDB:
		return errorf(ErrPublication, "publication %s does not exist and role %q may not create it: it does not own %s (%s does) and lacks CREATE on database %s; as %s run %s",
			qp, srv.role, t.quoted(), t.ownerName, db, pgx.Identifier{t.ownerName}.Sanitize(), create)
	case !t.owner:
		return errorf(ErrPublication, "publication %s does not exist and role %q may not create it: it does not own %s (%s does); as %s run %s",
			qp, srv.role, t.quoted(), t.ownerName, pgx.Identifier{t.ownerName}.Sanitize(), create)
	default:
		return errorf(ErrPublication, "publication %s does not exist and role %q, which owns %s, lacks CREATE on database %s: GRANT CREATE ON DATABASE %s TO %s; (as the database owner), then run `relay migrate --create-slot` or %s",
			qp, srv.role, t.quoted(), db, db, r, create)
	}
}

// EnsurePublication creates the publication when it is missing and the
// role may (it owns the outbox table and has CREATE on the database), and
// reports whether it did. When it may not, the ErrPublication error names
// the role that may and the statement to run. `relay migrate --grant-to`
// calls it: the relay's own role, which does not own the outbox table,
// cannot create the publication itself.
func EnsurePublication(ctx context.Context, q Querier, cfg Config) (bool, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(false); err != nil {
		return false, err
	}
	srv, err := inspectServer(ctx, q)
	if err != nil {
		return false, err
	}
	t, err := inspectTable(ctx, q, &cfg)
	if err != nil {
		return false, err
	}
	exists, err := checkPublication(ctx, q, t, cfg.Publication)
	if exists || err != nil {
		return false, err
	}
	if !t.owner || !srv.createInDB {
		return false, missingPublicationError(srv, t, cfg.Publication)
	}
	return ensurePublication(ctx, q, t, cfg.Publication)
}

// ReplicationPrivilege reports whether role may stream (the REPLICATION
// attribute, superuser, or on Amazon RDS membership in rds_replication),
// and when not, the statements that give it.
func ReplicationPrivilege(ctx context.Context, q Querier, role string) (ok bool, fix string, err error) {
	var repl, super, rds, hasRDS bool
	err = q.QueryRow(ctx, `
SELECT r.rolreplication, r.rolsuper,
       EXISTS (SELECT 1 FROM pg_roles m WHERE m.rolname = 'rds_replication' AND pg_has_role(r.oid, m.oid, 'MEMBER')),
       EXISTS (SELECT 1 FROM pg_roles m WHERE m.rolname = 'rds_replication')
FROM pg_roles r WHERE r.rolname = $1`, role).Scan(&repl, &super, &rds, &hasRDS)
	if err != nil {
		return false, "", fmt.Errorf("cdc: look up role %q: %w", role, err)
	}
	if repl || super || rds {
		return true, "", nil
	}
	r := pgx.Identifier{role}.Sanitize()
	fix = fmt.Sprintf("as a superuser: ALTER ROLE %s REPLICATION;", r)
	if hasRDS {
		fix = fmt.Sprintf("as rds_superuser: GRANT rds_replication TO %s;", r)
	}
	return false, fix, nil
}

// CheckWALLevel returns ErrWALLevel, with the fix, when the server's
// wal_level is not logical: checked before anything else, since nothing
// else can be fixed without a restart.
func CheckWALLevel(ctx context.Context, q Querier) error {
	srv, err := inspectServer(ctx, q)
	if err != nil {
		return err
	}
	if srv.walLevel != "logical" {
		return srv.check()
	}
	return nil
}
