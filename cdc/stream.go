package cdc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	backoffpkg "github.com/compensa/compensa/internal/backoff"
	"github.com/compensa/compensa/internal/logthrottle"
	"github.com/compensa/compensa/internal/redact"
)

// Stream streams the outbox table's committed inserts to a Sink. Create it
// with NewStream and call Run once.
type Stream struct {
	cfg  Config
	sink Sink
	log  *slog.Logger
	red  redactor
	conn *pgconn.Config // parsed DatabaseURL, copied for each connection

	running atomic.Bool
	// hardStop makes the next stop behave like a crash (tests): no final
	// status update, no grace for the batch in flight.
	hardStop atomic.Bool
	// catchUpWait is how long a batch waits for more while the stream
	// catches up (see receiver.holdBack): catchUpWait, longer in tests.
	catchUpWait time.Duration

	// health is what Health reports; throttle keeps a failure that
	// repeats (a reconnect loop, a batch that keeps failing) to one log
	// line per interval.
	health   health
	throttle *logthrottle.Throttle

	leader     atomic.Bool
	flushed    atomic.Uint64 // LSN last reported as flushed
	serverLSN  atomic.Uint64 // newest server WAL position seen
	lastCommit atomic.Int64  // unix nanoseconds, source commit time
	resyncs    atomic.Uint64 // slots re-created with a resync from the outbox
	// sinkFailed: the last session ended because the sink failed. Its
	// recovery is then a batch that commits, not the reconnect.
	sinkFailed atomic.Bool

	// unhandled lists the transactions received for the sink and not yet
	// committed by it, oldest first: their age is the lag.
	unhandledMu sync.Mutex
	unhandled   []txMark
}

// txMark is a transaction handed towards the sink: its commit LSN and
// source commit time.
type txMark struct {
	commitLSN pglogrepl.LSN
	at        time.Time
}

// received records a transaction on its way to the sink.
func (s *Stream) received(commitLSN pglogrepl.LSN, at time.Time) {
	s.unhandledMu.Lock()
	defer s.unhandledMu.Unlock()
	if n := len(s.unhandled); n > 0 && s.unhandled[n-1].commitLSN >= commitLSN {
		return // a part of a transaction already recorded, or a replay
	}
	s.unhandled = append(s.unhandled, txMark{commitLSN: commitLSN, at: at})
}

// handledThrough forgets the transactions the sink committed: those whose
// commit lies before end.
func (s *Stream) handledThrough(end pglogrepl.LSN) {
	s.unhandledMu.Lock()
	defer s.unhandledMu.Unlock()
	i := 0
	for i < len(s.unhandled) && s.unhandled[i].commitLSN < end {
		i++
	}
	s.unhandled = append(s.unhandled[:0], s.unhandled[i:]...)
}

// oldestUnhandled is the commit time of the oldest transaction received and
// not yet committed by the sink; zero when there is none.
func (s *Stream) oldestUnhandled() time.Time {
	s.unhandledMu.Lock()
	defer s.unhandledMu.Unlock()
	if len(s.unhandled) == 0 {
		return time.Time{}
	}
	return s.unhandled[0].at
}

// NewStream checks cfg and returns a stream that hands batches to sink.
func NewStream(cfg Config, sink Sink) (*Stream, error) {
	if sink == nil {
		return nil, errorf(ErrConfig, "NewStream: sink is nil")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.validate(true); err != nil {
		return nil, err
	}
	pc, err := pgconn.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		return nil, errorf(ErrConfig, "Config.DatabaseURL is not a valid PostgreSQL URL or keyword/value DSN")
	}
	s := &Stream{cfg: cfg, sink: sink, red: newRedactor(pc.Password), conn: pc, catchUpWait: catchUpWait}
	s.log = slog.New(redact.Handler(cfg.Logger.Handler(), s.red.redactFunc())).With("slot", cfg.Slot)
	s.throttle = logthrottle.New(s.log, 0)
	return s, nil
}

// Lag returns the stream's in-memory view of its lag.
func (s *Stream) Lag() Lag {
	l := Lag{
		Slot:      s.cfg.Slot,
		Leader:    s.leader.Load(),
		FlushLSN:  pglogrepl.LSN(s.flushed.Load()),
		ServerLSN: pglogrepl.LSN(s.serverLSN.Load()),
	}
	if l.ServerLSN > l.FlushLSN {
		l.Bytes = uint64(l.ServerLSN - l.FlushLSN)
	}
	if ns := s.lastCommit.Load(); ns != 0 {
		l.LastCommit = time.Unix(0, ns)
	}
	if at := s.oldestUnhandled(); !at.IsZero() {
		l.Seconds = max(time.Since(at).Seconds(), 0)
	}
	return l
}

// Run blocks: it takes the slot's leadership (or waits for it), makes sure
// the publication and the slot exist, reads the first-start snapshot when
// there is no checkpoint, and streams until ctx is cancelled. Transient
// failures reconnect with capped backoff. It returns nil after a clean stop
// on ctx cancellation, and an error of a kind declared in errors.go (for
// example ErrSlotLost) when streaming cannot go on safely.
func (s *Stream) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return errorf(ErrConfig, "Stream.Run is already running: a Stream runs once at a time")
	}
	defer s.running.Store(false)
	pool, err := s.openPool(ctx)
	if err != nil {
		return s.red.err(err)
	}
	defer pool.Close()
	attempt := 0
	for {
		progressed, err := s.session(ctx, pool)
		if ctx.Err() != nil {
			s.log.Info("stream stopped", "flushed_lsn", pglogrepl.LSN(s.flushed.Load()).String())
			return nil
		}
		err = s.red.err(err)
		if fatal(err) {
			s.log.Error("stream cannot go on", "err", err)
			return err
		}
		if progressed {
			attempt = 0
		}
		var sf *sinkFailure
		s.sinkFailed.Store(errors.As(err, &sf))
		wait := backoff(attempt, s.cfg.MaxReconnectWait)
		attempt++
		s.health.sessionEnded(errText(err), time.Now())
		s.throttle.Warn(keySession, "replication session ended; reconnecting", "err", err, "wait", wait.Round(time.Millisecond))
		s.cfg.Metrics.Reconnecting(err, wait)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// backoff is capped exponential with jitter: 100ms, 200ms, ... up to limit,
// each drawn from [d/2, d].
func backoff(attempt int, limit time.Duration) time.Duration {
	return backoffpkg.Policy{Base: 100 * time.Millisecond, Factor: 2, Max: limit, Jitter: 0.5}.Delay(attempt)
}

// keySession is the throttled failure of the stream's sessions. It ends
// when the stream streams again (the database, the network or the slot came
// back: logged at the reconnect, idle outbox or not), or, when the last
// session ended because the sink failed, when a batch commits again.
const keySession = "session"

func errText(err error) string {
	if err == nil {
		return "the session ended"
	}
	return err.Error()
}

// sessionInfo logs a session's routine step at INFO, or at DEBUG while the
// sessions keep failing, so that a reconnect loop does not repeat them.
func (s *Stream) sessionInfo(msg string, args ...any) {
	if s.throttle.Failing(keySession) {
		s.log.Debug(msg, args...)
		return
	}
	s.log.Info(msg, args...)
}

// session is one term: wait for leadership, then lead until something ends
// it. progressed reports whether it got far enough to reset the backoff.
func (s *Stream) session(ctx context.Context, pool *pgxpool.Pool) (progressed bool, err error) {
	lock, err := s.acquireLeadership(ctx)
	if err != nil {
		return false, err
	}
	s.setLeader(true)
	defer s.setLeader(false)
	sctx, cancel := context.WithCancelCause(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.watchLeadership(sctx, lock, cancel)
	}()
	progressed, err = s.lead(sctx, pool)
	cancel(nil)
	wg.Wait()
	s.closeConn(lock.PgConn())
	if ctx.Err() == nil && (err == nil || errors.Is(err, context.Canceled)) {
		if cause := context.Cause(sctx); cause != nil && !errors.Is(cause, context.Canceled) {
			err = cause
		}
	}
	return progressed, err
}

func (s *Stream) setLeader(v bool) {
	if s.leader.Swap(v) != v {
		s.cfg.Metrics.LeaderChanged(v)
		if v {
			s.sessionInfo("leading: this relay streams the slot")
		}
	}
}

// lead prepares the slot and streams.
func (s *Stream) lead(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	// What will not heal by retrying is fatal: check it every session, it
	// costs one query.
	major, err := checkPrimary(ctx, pool)
	if err != nil {
		return false, err
	}
	srv, err := inspectServer(ctx, pool)
	if err != nil {
		return false, err
	}
	if err := srv.check(); err != nil {
		return false, err
	}
	t, err := inspectTable(ctx, pool, &s.cfg)
	if err != nil {
		return false, err
	}
	if err := checkTablePrivileges(t, &s.cfg, srv.role); err != nil {
		return false, err
	}
	created, err := ensurePublication(ctx, pool, t, s.cfg.Publication)
	if err != nil {
		return false, err
	}
	if created {
		s.log.Info("created publication", "publication", s.cfg.Publication, "table", t.name.String())
	}
	ckpt, hasCkpt, err := s.loadCheckpoint(ctx, pool)
	if err != nil {
		return false, err
	}
	slot, err := lookupSlot(ctx, pool, s.cfg.Slot)
	if err != nil {
		return false, err
	}
	if slot != nil {
		if err := slot.usable(s.cfg.Slot); err != nil {
			return false, err
		}
	}
	pending, err := s.readPendingResync(ctx, pool)
	if err != nil {
		return false, err
	}
	if pending != nil {
		resume, err := s.resumeResync(ctx, pool, pending, ckpt, hasCkpt)
		if err != nil {
			return false, err
		}
		if resume {
			// Whatever OnSlotLost says now: the resync began, and the slot
			// it left cannot be streamed from without its window.
			return s.resync(ctx, pool, t, major, ckpt, hasCkpt, slot != nil, pending)
		}
	}
	switch {
	case slot != nil && slot.lost() && s.cfg.OnSlotLost == SlotLostResync:
		return s.resync(ctx, pool, t, major, ckpt, hasCkpt, true, nil)
	case slot == nil && hasCkpt && s.cfg.OnSlotLost == SlotLostResync:
		return s.resync(ctx, pool, t, major, ckpt, hasCkpt, false, nil)
	case slot != nil && slot.lost():
		if !s.cfg.RecreateSlot {
			return false, slotLostError(s.cfg.Slot, slot, ckpt, hasCkpt)
		}
		s.log.Warn("slot was invalidated; dropping and re-creating it because RecreateSlot is set: events committed while it was lost may be skipped", "checkpoint", ckpt.String())
		if _, err := pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, s.cfg.Slot); err != nil {
			return false, fmt.Errorf("cdc: drop invalidated slot %q: %w", s.cfg.Slot, err)
		}
		slot = nil
	case slot == nil && hasCkpt:
		if !s.cfg.RecreateSlot {
			return false, slotLostError(s.cfg.Slot, nil, ckpt, true)
		}
		s.log.Warn("slot is missing although a checkpoint exists; re-creating it because RecreateSlot is set: events committed while it was gone may be skipped", "checkpoint", ckpt.String())
	}

	if slot == nil {
		return s.createAndStream(ctx, pool, t, major)
	}
	s.ensureFailover(ctx, pool, major)
	s.warnFailover(ctx, pool, major)
	start := slot.confirmedFlush
	if !hasCkpt {
		// The slot exists but nothing was ever checkpointed: it was created
		// by Setup, or a first start stopped before its snapshot was handled.
		// Its exported snapshot is gone, so read the table as it is now:
		// rows committed before the slot are in it, later ones come through
		// the slot too, and the unique indexes absorb the overlap.
		s.log.Info("slot exists without a checkpoint: reading the outbox table before streaming", "confirmed_flush", start.String())
		if err := s.readSnapshot(ctx, pool, t, "", start, time.Time{}); err != nil {
			return false, err
		}
	} else {
		attrs := []any{"checkpoint", ckpt.String(), "confirmed_flush", start.String()}
		switch {
		case ckpt > start:
			attrs = append(attrs, "replay_bytes", uint64(ckpt-start))
			s.sessionInfo("resuming at the checkpoint, past the slot's position: the server skips the transactions handled in between", attrs...)
		case start > ckpt:
			attrs = append(attrs, "idle_bytes", uint64(start-ckpt))
			s.sessionInfo("resuming: the slot confirmed WAL past the checkpoint that held no outbox rows", attrs...)
		default:
			s.sessionInfo("resuming", attrs...)
		}
	}
	// Behind the checkpoint, every transaction was handled already (the
	// checkpoint commits with the effects of the batch it ends): a slot that
	// lost its in-memory position (a crash of the server persists it only at
	// checkpoints) resumes at the checkpoint instead of replaying what lies
	// between, one recognised replay at a time. Whatever the server still
	// sends at or behind it is recognised as a replay.
	from := start
	replayUntil := pglogrepl.LSN(0)
	if hasCkpt && ckpt > start {
		from, replayUntil = ckpt, ckpt
	}
	repl, err := s.startStreaming(ctx, pool, from)
	if err != nil {
		return false, err
	}
	return s.replicate(ctx, pool, repl, t, from, replayUntil)
}

// newSlot opens a replication connection and creates the slot on it with an
// exported snapshot; it returns the connection (the snapshot lives until
// its next command), the result and the slot's consistent point.
func (s *Stream) newSlot(ctx context.Context) (*pgconn.PgConn, pglogrepl.CreateReplicationSlotResult, pglogrepl.LSN, error) {
	var res pglogrepl.CreateReplicationSlotResult
	repl, err := s.connectReplication(ctx)
	if err != nil {
		return nil, res, 0, err
	}
	res, err = s.createSlot(ctx, repl)
	if err != nil {
		s.closeConn(repl)
		return nil, res, 0, fmt.Errorf("cdc: create replication slot %q: %w", s.cfg.Slot, err)
	}
	at, err := pglogrepl.ParseLSN(res.ConsistentPoint)
	if err != nil {
		s.closeConn(repl)
		return nil, res, 0, errorf(ErrProtocol, "slot %q: consistent point %q: %v", s.cfg.Slot, res.ConsistentPoint, err)
	}
	return repl, res, at, nil
}

// createAndStream creates the slot with an exported snapshot, hands over the
// outbox rows visible in it, then streams from the slot's consistent point.
func (s *Stream) createAndStream(ctx context.Context, pool *pgxpool.Pool, t *tableInfo, major int) (bool, error) {
	repl, res, at, err := s.newSlot(ctx)
	if err != nil {
		return false, err
	}
	s.log.Info("created replication slot; reading the rows committed before it", "consistent_point", at.String(), "snapshot", res.SnapshotName)
	// The exported snapshot lives until the next command on repl: read it
	// before starting replication on the same connection.
	if err := s.readSnapshot(ctx, pool, t, res.SnapshotName, at, time.Time{}); err != nil {
		s.closeConn(repl)
		return false, err
	}
	if err := s.startReplication(ctx, repl, 0); err != nil {
		s.closeConn(repl)
		return false, err
	}
	s.warnFailover(ctx, pool, major)
	return s.replicate(ctx, pool, repl, t, at, 0)
}

func (s *Stream) loadCheckpoint(ctx context.Context, pool *pgxpool.Pool) (pglogrepl.LSN, bool, error) {
	if s.cfg.LoadCheckpoint != nil {
		return s.cfg.LoadCheckpoint(ctx)
	}
	return readCheckpoint(ctx, pool, s.cfg.Slot)
}

// sessionParams make the server's text output the one the decoder reads, on
// the replication connection as on the others.
func (s *Stream) sessionParams(p map[string]string) {
	if _, ok := p["application_name"]; !ok {
		p["application_name"] = "compensa-relay:" + s.cfg.Slot
	}
	p["DateStyle"] = "ISO, MDY"
	p["TimeZone"] = "UTC"
	p["bytea_output"] = "hex"
}

func (s *Stream) openPool(ctx context.Context) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(s.cfg.DatabaseURL)
	if err != nil {
		return nil, errorf(ErrConfig, "Config.DatabaseURL is not a valid PostgreSQL URL or keyword/value DSN")
	}
	// Slot queries, the snapshot, heartbeats and retention: never more than
	// a few at once.
	pc.MaxConns = 4
	pc.MinConns = 0
	s.sessionParams(pc.ConnConfig.RuntimeParams)
	return pgxpool.NewWithConfig(ctx, pc)
}

// connect opens a plain connection (the leadership lock lives on it).
func (s *Stream) connect(ctx context.Context) (*pgx.Conn, error) {
	cc, err := pgx.ParseConfig(s.cfg.DatabaseURL)
	if err != nil {
		return nil, errorf(ErrConfig, "Config.DatabaseURL is not a valid PostgreSQL URL or keyword/value DSN")
	}
	s.sessionParams(cc.RuntimeParams)
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(cctx, cc)
	if err != nil {
		return nil, classifyConnect(err)
	}
	return conn, nil
}

func (s *Stream) connectReplication(ctx context.Context) (*pgconn.PgConn, error) {
	pc := s.conn.Copy()
	s.sessionParams(pc.RuntimeParams)
	pc.RuntimeParams["replication"] = "database"
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	conn, err := pgconn.ConnectConfig(cctx, pc)
	if err != nil {
		return nil, classifyConnect(err)
	}
	return conn, nil
}

// classifyConnect turns the connection failures that will not heal by
// themselves into fatal errors; the rest (server down, restarting, network)
// are retried.
func classifyConnect(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "42501":
			return wrapf(ErrReplicationPrivilege, err, "the role may not open a replication connection: ALTER ROLE <role> REPLICATION")
		case "28000", "28P01":
			return wrapf(ErrPrivilege, err, "cannot log in: check the user and password of the database URL, and pg_hba.conf")
		case "3D000":
			return wrapf(ErrConfig, err, "the database of the database URL does not exist")
		}
	}
	return fmt.Errorf("cdc: connect: %w", err)
}

// closeConn ends a connection: politely, or like a crash when hardStop is
// set.
func (s *Stream) closeConn(c *pgconn.PgConn) {
	if c == nil {
		return
	}
	if s.hardStop.Load() {
		c.Conn().Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c.Close(ctx)
}
