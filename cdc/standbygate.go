package cdc

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgxpool"
)

// standbyGate keeps a failover slot from confirming a position before the
// relay's own work for that position is on the standbys that may be
// promoted.
//
// The sink commits a batch's effects (saga starts, parked events, the
// checkpoint) in the same database, after the batch's source transaction:
// at a WAL position past the batch's end. A standby synchronizes the slot's
// confirmed position as soon as it has the WAL up to that position, which
// can be before it has the WAL of the relay's commit. Were the primary lost
// then, the promoted standby would hold a slot past transactions whose
// effects it does not have, and they would never be streamed again. So a
// position is reported only once every physical slot named in
// synchronized_standby_slots has flushed the WAL that was written when the
// position was offered (which includes the commit of its effects). Without
// synchronized_standby_slots (or before PostgreSQL 17) nothing is held
// back: the slot does not survive a promotion there anyway.
type standbyGate struct {
	pool *pgxpool.Pool
	// offered is the newest position the receiver would report; safe is
	// the newest one it may report; open says that nothing is held back.
	offered, safe atomic.Uint64
	open          atomic.Bool
	// pending waits for the standbys to flush pendingWAL (poll only).
	pending, pendingWAL pglogrepl.LSN
}

// standbyGateInterval is how often the gate reads the standbys' positions.
const standbyGateInterval = 200 * time.Millisecond

// sqlStandbyFlush reads the current WAL position, whether the primary names
// standbys in synchronized_standby_slots, and the lowest position those
// standbys' physical slots have flushed (NULL while one has none).
const sqlStandbyFlush = `
WITH named AS (
	SELECT btrim(n) AS slot_name
	FROM unnest(string_to_array(nullif(current_setting('synchronized_standby_slots', true), ''), ',')) AS n
)
SELECT pg_current_wal_lsn()::text, EXISTS (SELECT 1 FROM named),
	(SELECT CASE WHEN count(s.restart_lsn) = count(*) THEN min(s.restart_lsn)::text END
	 FROM named n LEFT JOIN pg_replication_slots s ON s.slot_name = n.slot_name AND s.slot_type = 'physical')`

func newStandbyGate(ctx context.Context, pool *pgxpool.Pool, start pglogrepl.LSN) *standbyGate {
	g := &standbyGate{pool: pool}
	g.offered.Store(uint64(start))
	g.safe.Store(uint64(start))
	g.poll(ctx)
	return g
}

// pass returns what of f may be reported now, and offers f for later.
func (g *standbyGate) pass(f pglogrepl.LSN) pglogrepl.LSN {
	if f > pglogrepl.LSN(g.offered.Load()) {
		g.offered.Store(uint64(f))
	}
	if g.open.Load() {
		return f
	}
	return min(f, pglogrepl.LSN(g.safe.Load()))
}

func (g *standbyGate) run(ctx context.Context) {
	t := time.NewTicker(standbyGateInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			g.poll(ctx)
		}
	}
}

func (g *standbyGate) poll(ctx context.Context) {
	// Read the offer before the WAL position: the offer's effects were
	// committed before it was made, so the position read after covers them.
	offered := pglogrepl.LSN(g.offered.Load())
	var walText string
	var named bool
	var flushedText *string
	if err := g.pool.QueryRow(ctx, sqlStandbyFlush).Scan(&walText, &named, &flushedText); err != nil {
		return // the database is unreachable: hold back, the session will end
	}
	wal, err := pglogrepl.ParseLSN(walText)
	if err != nil {
		return
	}
	safe := pglogrepl.LSN(g.safe.Load())
	if !named {
		g.open.Store(true)
		g.safe.Store(uint64(max(safe, offered)))
		g.pending = 0
		return
	}
	g.open.Store(false)
	if g.pending != 0 && flushedText != nil {
		if flushed, err := pglogrepl.ParseLSN(*flushedText); err == nil && flushed >= g.pendingWAL {
			safe = max(safe, g.pending)
			g.safe.Store(uint64(safe))
			g.pending = 0
		}
	}
	if g.pending == 0 && offered > safe {
		g.pending, g.pendingWAL = offered, wal
	}
}
