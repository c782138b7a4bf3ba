package relay

import "github.com/compensa/compensa/cdc"

// Errors New, Start and Err return, for errors.Is. Each comes wrapped in a
// message that says what to do; the underlying driver error, where there is
// one, is reachable with errors.As (a *pgconn.PgError).
var (
	// ErrWALLevel: the server's wal_level is not logical.
	ErrWALLevel = cdc.ErrWALLevel
	// ErrReplicationPrivilege: the role lacks the REPLICATION attribute.
	ErrReplicationPrivilege = cdc.ErrReplicationPrivilege
	// ErrPrivilege: the role lacks a privilege on a table, the schema or the
	// database; the message names it and the GRANT that gives it.
	ErrPrivilege = cdc.ErrPrivilege
	// ErrOutboxTable and ErrOutboxColumn: the outbox table or one of its
	// columns is missing or mistyped.
	ErrOutboxTable  = cdc.ErrOutboxTable
	ErrOutboxColumn = cdc.ErrOutboxColumn
	// ErrPublication: the publication exists but does not publish the outbox
	// table's inserts.
	ErrPublication = cdc.ErrPublication
	// ErrSlotLost: the slot is gone or invalidated while a checkpoint exists:
	// events may have been skipped. The relay never re-creates it on its own.
	ErrSlotLost = cdc.ErrSlotLost
	// ErrSlotUnusable: a slot of that name exists but is not a pgoutput slot
	// of this database.
	ErrSlotUnusable = cdc.ErrSlotUnusable
)
