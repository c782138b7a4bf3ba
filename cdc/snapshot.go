package cdc

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/compensa/compensa/outbox"
)

var snapshotNameRE = regexp.MustCompile(`^[0-9A-Fa-f-]{1,64}$`)

// readSnapshot hands the outbox rows visible in a snapshot to the sink as
// Snapshot batches (Partial ones of MaxBatchEvents, then a last one that
// moves the checkpoint to at). With a name, the snapshot is the one the slot
// exported at its creation, so the rows are exactly those committed before
// the slot's consistent point; without one, it is a fresh snapshot and the
// rows overlap what the slot will stream (the unique indexes absorb that).
//
// A non-zero since reads only the rows created at or after it (a resync).
func (s *Stream) readSnapshot(ctx context.Context, pool *pgxpool.Pool, t *tableInfo, name string, at pglogrepl.LSN, since time.Time) error {
	began := time.Now()
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return fmt.Errorf("cdc: begin the snapshot read: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if name != "" {
		if !snapshotNameRE.MatchString(name) {
			return errorf(ErrProtocol, "the server exported a snapshot named %q, which is not a snapshot name", name)
		}
		if _, err := tx.Exec(ctx, "SET TRANSACTION SNAPSHOT '"+name+"'"); err != nil {
			return fmt.Errorf("cdc: import the slot's snapshot: %w", err)
		}
	}
	sql, fields, typ, args := snapshotQuery(t, since)
	rows, err := tx.Query(ctx, sql, args...)
	if err != nil {
		return fmt.Errorf("cdc: read the outbox table %s: %w", t.quoted(), err)
	}
	defer rows.Close()
	var events []outbox.Event
	total := 0
	bytes := 0
	for rows.Next() {
		raw := rows.RawValues()
		var row [nFields]value
		for i, f := range fields {
			row[f] = value{present: true, null: raw[i] == nil, data: raw[i]}
		}
		ev := buildEvent(&row, &typ, nil, uint64(at))
		events = append(events, ev)
		bytes += eventBytes(&ev)
		total++
		if len(events) >= s.cfg.MaxBatchEvents || bytes >= s.cfg.MaxBatchBytes {
			b := Batch{Slot: s.cfg.Slot, Events: events, CommitLSN: at, EndLSN: at, Partial: true, Snapshot: true}
			events, bytes = nil, 0
			if err := s.handle(ctx, b); err != nil {
				return err
			}
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("cdc: read the outbox table %s: %w", t.quoted(), err)
	}
	rows.Close()
	if err := s.handle(ctx, Batch{Slot: s.cfg.Slot, Events: events, CommitLSN: at, EndLSN: at, Snapshot: true}); err != nil {
		return err
	}
	s.lastCommit.Store(time.Now().UnixNano())
	s.log.Info("snapshot handed over", "rows", total, "lsn", at.String(), "took", time.Since(began).Round(time.Millisecond))
	return nil
}

// snapshotQuery selects the mapped columns as text, the form the WAL carries
// them in, so that one decoder reads both.
func snapshotQuery(t *tableInfo, since time.Time) (string, []int, [nFields]uint32, []any) {
	sql, fields, typ := selectColumns(t)
	var args []any
	if c := t.fieldCol[fCreatedAt]; c != "" {
		if !since.IsZero() {
			sql += " WHERE " + pgx.Identifier{c}.Sanitize() + " >= $1"
			args = append(args, since)
		}
		sql += " ORDER BY " + pgx.Identifier{c}.Sanitize()
	}
	return sql, fields, typ, args
}

// ReadEvent reads the outbox row whose id, as text, is rawID, and decodes it
// as the stream does (a row the relay cannot use comes back with Poison set).
// ok is false when the table holds no such row (any more). It is what
// `relay deadletters retry --from-outbox` re-drives.
func ReadEvent(ctx context.Context, q Querier, table outbox.TableName, cols outbox.ColumnMap, rawID string) (ev outbox.Event, ok bool, err error) {
	t, err := inspectTable(ctx, q, &Config{Table: table, Columns: cols})
	if err != nil {
		return ev, false, err
	}
	sql, fields, typ := selectColumns(t)
	sql += " WHERE " + pgx.Identifier{t.fieldCol[fID]}.Sanitize() + "::text = $1 LIMIT 1"
	rows, err := q.Query(ctx, sql, rawID)
	if err != nil {
		return ev, false, fmt.Errorf("cdc: read outbox row %q of %s: %w", rawID, t.quoted(), err)
	}
	defer rows.Close()
	if !rows.Next() {
		return ev, false, rows.Err()
	}
	raw := rows.RawValues()
	var row [nFields]value
	for i, f := range fields {
		row[f] = value{present: true, null: raw[i] == nil, data: append([]byte(nil), raw[i]...)}
	}
	return buildEvent(&row, &typ, nil, 0), true, rows.Err()
}

// selectColumns selects the mapped columns of t as text.
func selectColumns(t *tableInfo) (string, []int, [nFields]uint32) {
	var cols []string
	var fields []int
	var typ [nFields]uint32
	for f := range nFields {
		c := t.fieldCol[f]
		if c == "" {
			continue
		}
		cols = append(cols, pgx.Identifier{c}.Sanitize()+"::text")
		fields = append(fields, f)
		typ[f] = t.cols[c].baseOID
	}
	return "SELECT " + strings.Join(cols, ", ") + " FROM " + t.quoted(), fields, typ
}
