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

// The resync marker (migration 0015): written before the lost slot is
// replaced, cleared once the window was re-read.
const (
	sqlResyncPending = `SELECT resync_since, resync_checkpoint::text FROM relay_checkpoints
WHERE slot_name = $1 AND resync_checkpoint IS NOT NULL`
	sqlResyncBegin = `UPDATE relay_checkpoints SET resync_since = $2, resync_checkpoint = lsn WHERE slot_name = $1`
	sqlResyncDone  = `UPDATE relay_checkpoints SET resync_since = NULL, resync_checkpoint = NULL WHERE slot_name = $1`
)

// Resyncs counts the slots this stream re-created with a resync from the
// outbox table.
func (s *Stream) Resyncs() uint64 { return s.resyncs.Load() }

// pendingResync is a resync that began and whose marker is still there:
// since is where its window starts (zero: the whole table), checkpoint the
// checkpoint's LSN when it began.
type pendingResync struct {
	since      time.Time
	checkpoint pglogrepl.LSN
}

// readPendingResync reads the slot's resync marker; nil when there is none.
// A schema without the marker (the table or its columns missing: a stream
// used without the relay's migrations) has none.
func (s *Stream) readPendingResync(ctx context.Context, pool *pgxpool.Pool) (*pendingResync, error) {
	var since *time.Time
	var lsn string
	err := pool.QueryRow(ctx, sqlResyncPending, s.cfg.Slot).Scan(&since, &lsn)
	switch {
	case errors.Is(err, pgx.ErrNoRows), undefinedObject(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("cdc: read the resync marker of slot %q: %w", s.cfg.Slot, err)
	}
	at, err := pglogrepl.ParseLSN(lsn)
	if err != nil {
		return nil, errorf(ErrProtocol, "slot %q: resync marker's checkpoint %q: %v", s.cfg.Slot, lsn, err)
	}
	p := &pendingResync{checkpoint: at}
	if since != nil {
		p.since = *since
	}
	return p, nil
}

// undefinedObject reports a missing table (42P01) or column (42703).
func undefinedObject(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "42703")
}

// resumeResync decides what a resync marker found at the start of a session
// means. The re-read's last batch moves the checkpoint past the one the
// marker recorded: then the re-read finished and only clearing the marker
// was missing. Otherwise the relay stopped (or was killed) in the middle of
// the re-read, and the slot it finds, if any, is the one that resync
// created: streaming from it would skip the window. It reports whether the
// re-read must be resumed.
func (s *Stream) resumeResync(ctx context.Context, pool *pgxpool.Pool, p *pendingResync, ckpt pglogrepl.LSN, hasCkpt bool) (bool, error) {
	if hasCkpt && ckpt > p.checkpoint {
		if _, err := pool.Exec(ctx, sqlResyncDone, s.cfg.Slot); err != nil {
			return false, fmt.Errorf("cdc: clear the resync marker of slot %q: %w", s.cfg.Slot, err)
		}
		s.log.Info("the previous resync finished its re-read before the relay stopped: resync marker cleared", "checkpoint", ckpt.String(), "marker_checkpoint", p.checkpoint.String())
		return false, nil
	}
	return true, nil
}

// resync replaces a lost slot without skipping what the outbox table still
// holds: it creates a new slot with an exported snapshot and, before
// streaming from it, hands the sink the outbox rows created since the last
// checkpoint's time minus ResyncMargin that the snapshot sees (committed
// before the new slot's consistent point; later ones come through the
// slot). The sink handles them as it handles a replay: starts are absorbed
// by the unique index, sinks deliver again with the same dedupe ids. Rows
// already deleted (by their own transaction, or by retention) cannot be
// recovered, nor can outbox events written as logical decoding messages:
// they were only in the WAL the lost slot held.
//
// A marker in the checkpoint's row records the window before the old slot
// is dropped, and is cleared only once the re-read was handed over: a relay
// killed in between finds the marker at its next start and runs the resync
// again with the marker's window (resume), whatever slot it finds.
// dropSlot: a slot of that name exists (lost, or left by the unfinished
// resync) and goes first.
func (s *Stream) resync(ctx context.Context, pool *pgxpool.Pool, t *tableInfo, major int, ckpt pglogrepl.LSN, hasCkpt, dropSlot bool, resume *pendingResync) (bool, error) {
	var since, ckptTime time.Time
	if resume != nil {
		since = resume.since
	} else {
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
	}
	window := "the whole outbox table"
	if !since.IsZero() {
		window = "rows created since " + since.UTC().Format(time.RFC3339Nano)
	}
	if resume != nil {
		s.log.Warn("resuming a resync that did not finish (the relay stopped during its re-read): re-creating the slot and re-reading the outbox window again",
			"checkpoint", ckpt.String(), "marker_checkpoint", resume.checkpoint.String(), "window", window)
	} else {
		s.log.Warn("replication slot lost: re-creating it and re-reading the outbox (--on-slot-lost=resync); rows deleted meanwhile, and events written as logical decoding messages while the slot was gone, cannot be recovered",
			"checkpoint", ckpt.String(), "has_checkpoint", hasCkpt, "checkpoint_time", ckptTime, "margin", s.cfg.ResyncMargin, "window", window)
		if err := s.markResync(ctx, pool, since, hasCkpt); err != nil {
			return false, err
		}
	}
	if dropSlot {
		if _, err := pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, s.cfg.Slot); err != nil {
			return false, fmt.Errorf("cdc: drop slot %q before re-creating it: %w", s.cfg.Slot, err)
		}
	}
	repl, res, at, err := s.newSlot(ctx)
	if err != nil {
		return false, err
	}
	if err := s.readSnapshot(ctx, pool, t, res.SnapshotName, at, since); err != nil {
		s.closeConn(repl)
		// Unfinished, the new slot would let the next session skip the
		// window if the marker could not be kept (no checkpoint row): drop
		// it so that the next session resyncs again either way.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if _, derr := pool.Exec(dctx, `SELECT pg_drop_replication_slot($1)`, s.cfg.Slot); derr != nil {
			s.log.Error("resync failed and the new slot could not be dropped; the resync marker makes the next start re-read the window", "err", derr)
		}
		return false, err
	}
	// Only now may a restart stream from the new slot without re-reading.
	if _, err := pool.Exec(ctx, sqlResyncDone, s.cfg.Slot); err != nil && !undefinedObject(err) {
		s.closeConn(repl)
		return false, fmt.Errorf("cdc: clear the resync marker of slot %q: %w", s.cfg.Slot, err)
	}
	s.resyncs.Add(1)
	s.log.Info("resync handed over: streaming from the new slot", "window", window, "consistent_point", at.String())
	if err := s.startReplication(ctx, repl, 0); err != nil {
		s.closeConn(repl)
		return false, err
	}
	s.warnFailover(ctx, pool, major)
	return s.replicate(ctx, pool, repl, t, at, 0)
}

// markResync records the resync's window in the checkpoint's row before
// anything is dropped or created. Without a checkpoint row there is nothing
// to lose: a next start that finds a slot and no checkpoint reads the whole
// table anyway. Without the marker's columns (a stream used without the
// relay's migrations) the resync goes on, unprotected, and says so.
func (s *Stream) markResync(ctx context.Context, pool *pgxpool.Pool, since time.Time, hasCkpt bool) error {
	var at *time.Time
	if !since.IsZero() {
		at = &since
	}
	tag, err := pool.Exec(ctx, sqlResyncBegin, s.cfg.Slot, at)
	switch {
	case undefinedObject(err):
		s.log.Warn("cannot record the resync in progress (relay_checkpoints lacks the resync marker: run relay migrate): a crash before the re-read ends would skip its window")
		return nil
	case err != nil:
		return fmt.Errorf("cdc: record the resync of slot %q: %w", s.cfg.Slot, err)
	case tag.RowsAffected() == 0 && hasCkpt:
		s.log.Warn("cannot record the resync in progress (the checkpoint is not kept in relay_checkpoints): a crash before the re-read ends would skip its window")
	}
	return nil
}
