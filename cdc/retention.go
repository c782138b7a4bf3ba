package cdc

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Outbox retention deletes rows older than Config.Retention that the sink has
// provably handled. A row's own commit LSN is not stored anywhere, and its
// created_at says nothing about when it committed (a long transaction, or a
// producer that sets created_at itself), so age alone cannot prove a row was
// streamed. Instead retention works with marks:
//
//  1. Take a mark: the xmin of a fresh snapshot (every transaction with an
//     older xid has finished) and the WAL insert position W read after it.
//     Every transaction older than the mark's xmin committed before W, since
//     a commit record is written before the transaction stops being running.
//  2. Once the position reported as flushed (what the sink committed, or
//     provably held nothing for it) reaches W, every committed row whose
//     inserting xid precedes the mark's xmin has been handled. Delete those
//     that are also older than Retention, in batches of RetentionBatchSize.
//  3. Take the next mark.
//
// A row is therefore deleted at least Retention after its created_at and at
// least one RetentionInterval after its transaction is known to be handled.
type retentionMark struct {
	xmin uint64
	at   pglogrepl.LSN
}

func (s *Stream) retain(ctx context.Context, pool *pgxpool.Pool, t *tableInfo) {
	tick := time.NewTicker(s.cfg.RetentionInterval)
	defer tick.Stop()
	var mark *retentionMark
	for {
		if mark != nil && pglogrepl.LSN(s.flushed.Load()) >= mark.at {
			n, err := s.deleteHandled(ctx, pool, t, mark.xmin)
			if err != nil && ctx.Err() == nil {
				s.throttle.Warn("retention", "outbox retention failed; will retry", "err", err)
			} else if err == nil {
				s.throttle.Recovered("retention", "outbox retention works again")
			}
			if n > 0 {
				s.log.Info("outbox retention deleted handled rows", "rows", n, "older_than", s.cfg.Retention.String())
			}
			mark = nil
		}
		if mark == nil && ctx.Err() == nil {
			m, err := takeMark(ctx, pool)
			if err != nil && ctx.Err() == nil {
				s.throttle.Warn("retention-mark", "outbox retention could not take a mark; will retry", "err", err)
			} else if err == nil {
				s.throttle.Recovered("retention-mark", "outbox retention takes marks again")
			}
			mark = m
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func takeMark(ctx context.Context, pool *pgxpool.Pool) (*retentionMark, error) {
	var xmin, at string
	err := pool.QueryRow(ctx, `SELECT pg_snapshot_xmin(pg_current_snapshot())::text, pg_current_wal_insert_lsn()::text`).Scan(&xmin, &at)
	if err != nil {
		return nil, fmt.Errorf("cdc: retention mark: %w", err)
	}
	m := &retentionMark{}
	if m.xmin, err = strconv.ParseUint(xmin, 10, 64); err != nil {
		return nil, fmt.Errorf("cdc: retention mark xmin %q: %w", xmin, err)
	}
	if m.at, err = pglogrepl.ParseLSN(at); err != nil {
		return nil, fmt.Errorf("cdc: retention mark lsn %q: %w", at, err)
	}
	return m, nil
}

// deleteHandled deletes, batch by batch, the rows older than Retention whose
// inserting transaction precedes xmin.
func (s *Stream) deleteHandled(ctx context.Context, pool *pgxpool.Pool, t *tableInfo, xmin uint64) (int64, error) {
	col := pgx.Identifier{t.fieldCol[fCreatedAt]}.Sanitize()
	// age(xmin) is our own xid minus the row's (frozen rows: INT_MAX), so
	// "the row's xid precedes the mark" is age(xmin) > our xid - mark.
	sql := `DELETE FROM ` + t.quoted() + ` WHERE ctid = ANY (ARRAY(
		SELECT ctid FROM ` + t.quoted() + `
		WHERE ` + col + ` < now() - $1 * interval '1 microsecond' AND age(xmin) > $2
		LIMIT $3))`
	var total int64
	for {
		n, err := s.deleteBatch(ctx, pool, sql, xmin)
		total += n
		if err != nil || n < int64(s.cfg.RetentionBatchSize) {
			return total, err
		}
		select { // leave room for the application between batches
		case <-ctx.Done():
			return total, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (s *Stream) deleteBatch(ctx context.Context, pool *pgxpool.Pool, sql string, xmin uint64) (int64, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	var cur string
	if err := tx.QueryRow(ctx, `SELECT pg_current_xact_id()::text`).Scan(&cur); err != nil {
		return 0, err
	}
	own, err := strconv.ParseUint(cur, 10, 64)
	if err != nil || own <= xmin {
		return 0, err
	}
	d := min(own-xmin, math.MaxInt32-1)
	tag, err := tx.Exec(ctx, sql, s.cfg.Retention.Microseconds(), int32(d), s.cfg.RetentionBatchSize)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), tx.Commit(ctx)
}
