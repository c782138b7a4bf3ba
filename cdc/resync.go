package cdc

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// What Run does with a lost slot (Config.OnSlotLost).
const (
	SlotLostStop   = "stop"
	SlotLostResync = "resync"
)

// DefaultResyncMargin is Config.ResyncMargin's default.
const DefaultResyncMargin = 10 * time.Minute

const sqlCheckpointTime = `SELECT updated_at FROM relay_checkpoints WHERE slot_name = $1`

// Resyncs counts the slots this stream re-created with a resync from the
// outbox table.
func (s *Stream) Resyncs() uint64 { return s.resyncs.Load() }

// resync replaces a lost slot without skipping what the outbox table still
// holds: it creates a new slot with an exported snapshot and, before
// streaming from it, hands the sink the outbox rows created since the last
// checkpoint's time minus ResyncMargin that the snapshot sees (committed
// before the new slot's consistent point; later ones come through the
// slot). The sink handles them as it handles a replay: starts are absorbed
// by the unique index, sinks deliver again with the same dedupe ids. Rows
// already deleted (by their own transaction, or by retention) cannot be
// recovered.
func (s *Stream) resync(ctx context.Context, pool *pgxpool.Pool, t *tableInfo, major int, ckpt pglogrepl.LSN, hasCkpt bool) (bool, error) {
	var since, ckptTime time.Time
	err := pool.QueryRow(ctx, sqlCheckpointTime, s.cfg.Slot).Scan(&ckptTime)
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		since = ckptTime.Add(-s.cfg.ResyncMargin)
	case errors.Is(err, pgx.ErrNoRows), errors.As(err, &pgErr) && pgErr.Code == "42P01":
		// No checkpoint time to start from: the whole table.
	default:
		return false, fmt.Errorf("cdc: read the checkpoint time of slot %q: %w", s.cfg.Slot, err)
	}
	if t.fieldCol[fCreatedAt] == "" {
		since = time.Time{} // without created_at, only the whole table is safe
	}
	window := "the whole outbox table"
	if !since.IsZero() {
		window = "rows created since " + since.UTC().Format(time.RFC3339Nano)
	}
	s.log.Warn("replication slot lost: re-creating it and re-reading the outbox (--on-slot-lost=resync); rows deleted meanwhile cannot be recovered",
		"checkpoint", ckpt.String(), "has_checkpoint", hasCkpt, "checkpoint_time", ckptTime, "margin", s.cfg.ResyncMargin, "window", window)
	repl, res, at, err := s.newSlot(ctx)
	if err != nil {
		return false, err
	}
	if err := s.readSnapshot(ctx, pool, t, res.SnapshotName, at, since); err != nil {
		s.closeConn(repl)
		// Unfinished, the new slot would let the next session skip the
		// window: drop it so that the next session resyncs again.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if _, derr := pool.Exec(dctx, `SELECT pg_drop_replication_slot($1)`, s.cfg.Slot); derr != nil {
			s.log.Error("resync failed and the new slot could not be dropped: drop it by hand before the next start, or events of the window may be skipped", "err", derr)
		}
		return false, err
	}
	s.resyncs.Add(1)
	s.log.Info("resync handed over: streaming from the new slot", "window", window, "consistent_point", at.String())
	if err := s.startReplication(ctx, repl); err != nil {
		s.closeConn(repl)
		return false, err
	}
	s.warnFailover(ctx, pool, major)
	return s.replicate(ctx, pool, repl, t, at, 0)
}
