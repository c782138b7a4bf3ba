package cdc

import (
	"context"
	"fmt"
	"hash/fnv"
	"time"

	"github.com/jackc/pgx/v5"
)

// lockKey is the session advisory lock that elects the slot's streamer.
// Advisory locks are per database, and so is a logical slot.
func lockKey(slot string) int64 {
	h := fnv.New64a()
	h.Write([]byte("compensa.cdc.slot:" + slot))
	return int64(h.Sum64())
}

// acquireLeadership returns a connection that holds the slot's session
// advisory lock, polling until it is free. PostgreSQL releases the lock when
// the holder's session ends, so a leader that dies (process killed, network
// gone) frees it without help.
func (s *Stream) acquireLeadership(ctx context.Context) (*pgx.Conn, error) {
	conn, err := s.connect(ctx)
	if err != nil {
		return nil, err
	}
	key := lockKey(s.cfg.Slot)
	waiting := false
	for {
		var ok bool
		if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, key).Scan(&ok); err != nil {
			s.closeConn(conn.PgConn())
			return nil, fmt.Errorf("cdc: try the leadership lock: %w", err)
		}
		if ok {
			return conn, nil
		}
		if !waiting {
			waiting = true
			s.health.standingBy()
			s.log.Info("another relay streams this slot; standing by to take over")
		}
		select {
		case <-ctx.Done():
			s.closeConn(conn.PgConn())
			return nil, ctx.Err()
		case <-time.After(s.cfg.LeaderPollInterval):
		}
	}
}

// watchLeadership checks the lock's connection every LeaderPollInterval; when
// it fails the lock may be gone, so the session ends (lost) and the stream
// stops feeding the sink before a new leader starts.
func (s *Stream) watchLeadership(ctx context.Context, conn *pgx.Conn, lost func(error)) {
	t := time.NewTicker(s.cfg.LeaderPollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, max(5*time.Second, 3*s.cfg.LeaderPollInterval))
		err := conn.Ping(pctx)
		cancel()
		if err != nil && ctx.Err() == nil {
			lost(fmt.Errorf("cdc: lost the connection that holds the leadership lock: %w", err))
			return
		}
	}
}
