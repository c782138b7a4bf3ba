package cdc

import (
	"context"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgxpool"
)

// heartbeat emits a transactional logical message every HeartbeatInterval.
// Its transaction reaches the stream like any other and becomes an empty
// Batch, so the sink's checkpoint and the slot advance while the outbox is
// idle and other tables fill the WAL. The message's LSN also tells Lag where
// the server's WAL is.
func (s *Stream) heartbeat(ctx context.Context, pool *pgxpool.Pool) {
	t := time.NewTicker(s.cfg.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var at string
		err := pool.QueryRow(ctx, `SELECT pg_logical_emit_message(true, $1::text, $2::text)::text`, HeartbeatPrefix, s.cfg.Slot).Scan(&at)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			s.throttle.Warn("heartbeat", "heartbeat failed; the slot may retain WAL while the outbox is idle", "err", err)
			continue
		}
		s.throttle.Recovered("heartbeat", "heartbeats written again")
		if lsn, err := pglogrepl.ParseLSN(at); err == nil {
			s.observeServerLSN(lsn)
		}
	}
}
