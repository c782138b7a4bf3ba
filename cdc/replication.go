package cdc

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/compensa/compensa/outbox"
)

// startStreaming opens a replication connection and starts streaming. A slot
// still held by another walsender (the one of a leader that lost its lock
// but has not noticed yet) is waited for, then that walsender is terminated:
// we hold the lock, so it cannot be a legitimate streamer.
func (s *Stream) startStreaming(ctx context.Context, pool *pgxpool.Pool, from pglogrepl.LSN) (*pgconn.PgConn, error) {
	var busySince, lastKill time.Time
	for {
		repl, err := s.connectReplication(ctx)
		if err != nil {
			return nil, err
		}
		err = s.startReplication(ctx, repl, from)
		if err == nil {
			return repl, nil
		}
		s.closeConn(repl)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "55006" {
			return nil, err
		}
		now := time.Now()
		if busySince.IsZero() {
			busySince = now
			s.log.Info("slot is still held by a previous streamer; waiting for it to let go")
		}
		if now.Sub(busySince) > 2*s.cfg.LeaderPollInterval+time.Second && now.Sub(lastKill) > 2*time.Second {
			lastKill = now
			_, kerr := pool.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, s.cfg.Slot)
			s.log.Warn("terminated the walsender still holding the slot after this relay took the leadership", "err", kerr)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// startReplication sends START_REPLICATION from position from, or, when the
// slot's confirmed_flush_lsn is later (always with from 0/0), from there:
// the server skips every transaction that committed before it. We only ever
// move confirmed_flush_lsn to what the sink committed, and from is never
// past the sink's checkpoint.
func (s *Stream) startReplication(ctx context.Context, repl *pgconn.PgConn, from pglogrepl.LSN) error {
	args := []string{
		// Version 1 never streams in-progress transactions: a transaction
		// reaches us whole, at its commit.
		"proto_version '1'",
		"publication_names " + quoteLiteral(pgx.Identifier{s.cfg.Publication}.Sanitize()),
	}
	if serverMajor(repl) >= 14 {
		args = append(args, "messages 'true'") // heartbeats and outbox messages
	}
	err := pglogrepl.StartReplication(ctx, repl, s.cfg.Slot, from, pglogrepl.StartReplicationOptions{
		Mode: pglogrepl.LogicalReplication, PluginArgs: args,
	})
	if err != nil {
		return fmt.Errorf("cdc: start replication on slot %q: %w", s.cfg.Slot, err)
	}
	return nil
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

func serverMajor(c *pgconn.PgConn) int {
	v := c.ParameterStatus("server_version")
	end := strings.IndexFunc(v, func(r rune) bool { return r < '0' || r > '9' })
	if end >= 0 {
		v = v[:end]
	}
	n, _ := strconv.Atoi(v)
	return n
}

// receiver owns the replication connection: it decodes, assembles batches
// and reports positions. The sink runs in its own goroutine so that status
// updates keep flowing while a batch commits.
type receiver struct {
	s       *Stream
	conn    *pgconn.PgConn
	rels    *relations
	batches chan Batch
	// committed is the end LSN of the newest whole transaction the sink
	// committed.
	committed atomic.Uint64

	inTx bool
	tx   struct {
		xid        uint32
		commitLSN  pglogrepl.LSN
		commitTime time.Time
		events     []outbox.Event
		bytes      int
		parts      int
		heartbeat  bool
	}
	// queuedEnd is the end LSN of the newest whole transaction handed to the
	// sink; nothing is in flight when committed has reached it and no
	// transaction is open.
	queuedEnd pglogrepl.LSN
	// idle is the newest position known to hold nothing for the sink: a
	// keepalive's WAL end received outside a transaction, or the end of a
	// transaction without outbox rows. It may be reported only when nothing
	// is in flight.
	idle pglogrepl.LSN
	// pending holds whole transactions that arrived while the sink was busy,
	// merged into one batch (see hold); it is handed over as soon as the
	// sink can take it, unless the stream is catching up (see holdBack).
	pending      *Batch
	pendingBytes int
	// pendingSince is when the pending batch began: while the stream is
	// catching up it is held back at most catchUpWait (see holdBack).
	pendingSince time.Time
	// lastHandedOver is the number of events of the pending batch handed
	// over last: the next one that grows gets room for as many at once.
	lastHandedOver int
	// replayUntil: transactions ending at or before it are replays of work
	// the sink already committed; they are never merged (see hold).
	replayUntil pglogrepl.LSN
	// lastTxEvents is the number of outbox rows of the previous
	// transaction: the next one's events get room for as many at once,
	// since transactions of one application tend to be alike.
	lastTxEvents int
	// gate holds back what a failover slot confirms until the standbys
	// have the relay's work for it (nil before PostgreSQL 17).
	gate *standbyGate
	// cols is parseInsert's buffer, reused for every insert.
	cols       []tupleColumn
	received   pglogrepl.LSN
	sent       pglogrepl.LSN
	nextStatus time.Time
}

// replicate streams from start until ctx ends or something fails.
//
// Transactions ending at or before replayUntil (the sink's checkpoint, when it
// is ahead of the slot) are replays: each is handed over alone, never merged
// with a new one, so that the sink recognises it whole.
func (s *Stream) replicate(ctx context.Context, pool *pgxpool.Pool, repl *pgconn.PgConn, t *tableInfo, start, replayUntil pglogrepl.LSN) (progressed bool, err error) {
	began := time.Now()
	s.flushed.Store(uint64(start))
	// Whatever a previous session left unhandled comes again after start.
	s.handledThrough(^pglogrepl.LSN(0))
	defer s.handledThrough(^pglogrepl.LSN(0))
	r := &receiver{s: s, conn: repl, rels: newRelations(t), batches: make(chan Batch, 1),
		queuedEnd: start, idle: start, received: start, sent: start, nextStatus: time.Now(), replayUntil: replayUntil}
	r.committed.Store(uint64(start))
	if serverMajor(repl) >= failoverMajor {
		r.gate = newStandbyGate(ctx, pool, start)
	}
	if !s.sinkFailed.Load() {
		s.throttle.Recovered(keySession, "stream recovered: streaming again", "from", start.String())
	}
	s.sessionInfo("streaming", "from", start.String())
	s.health.streaming()

	rctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	// The sink's context outlives a graceful stop for up to ShutdownTimeout,
	// so that the batch being committed is not thrown away.
	sinkCtx, sinkCancel := context.WithCancel(context.WithoutCancel(ctx))
	defer sinkCancel()
	var handled atomic.Int64
	sinkDone := make(chan struct{})
	go func() {
		defer close(sinkDone)
		s.runSink(sinkCtx, rctx, r.batches, &r.committed, &handled, stop)
	}()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		select {
		case <-sinkDone:
			return
		case <-rctx.Done():
		}
		graceful := ctx.Err() != nil && errors.Is(context.Cause(ctx), context.Canceled) && !s.hardStop.Load()
		if graceful {
			select {
			case <-sinkDone:
			case <-time.After(s.cfg.ShutdownTimeout):
			}
		}
		sinkCancel()
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.heartbeat(rctx, pool)
	}()
	if r.gate != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.gate.run(rctx)
		}()
	}
	if s.cfg.Retention > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.retain(rctx, pool, t)
		}()
	}

	err = r.receive(rctx)
	stop(err)
	close(r.batches)
	<-sinkDone
	wg.Wait()
	// A connection pgconn closed on a failed or cancelled read (the server
	// died, a failover) is still being torn down in the background: writing
	// to it would race with that.
	if !s.hardStop.Load() && !repl.IsClosed() {
		// Report what the sink finished before going, so that a restart
		// replays as little as possible.
		_ = r.sendStatus()
	}
	s.closeConn(repl)
	if cause := context.Cause(rctx); cause != nil && (err == nil || isCtxErr(err)) {
		err = cause
	}
	// A session counts as progress (the backoff starts over) when it ran a
	// while, or handed batches over and did not end on a sink failure: a
	// sink that fails every time must not be retried in a tight loop just
	// because heartbeats got through.
	var sf *sinkFailure
	progressed = time.Since(began) > 30*time.Second || handled.Load() > 0 && !errors.As(err, &sf)
	return progressed, err
}

func isCtxErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// receive reads the stream until ctx ends or the connection fails.
func (r *receiver) receive(ctx context.Context) error {
	rd := newReadDeadline(r.conn.Conn())
	defer rd.release()
	release := context.AfterFunc(ctx, rd.interrupt)
	defer release()
	for {
		if !time.Now().Before(r.nextStatus) {
			if err := r.sendStatus(); err != nil {
				return err
			}
		}
		deadline := r.nextStatus
		if r.pending != nil {
			if r.holdBack() > 0 {
				// Catching up: the next messages are on their way. (The
				// deadline is the same for every message until then:
				// setting a new one costs a timer update.)
				deadline = minTime(deadline, r.pendingSince.Add(r.s.catchUpWait))
			} else if r.offer() {
				continue
			} else {
				// The sink is busy: look again soon, since nothing else
				// wakes this loop when it frees up.
				deadline = minTime(deadline, time.Now().Add(pendingPoll))
			}
		}
		// The wait is bounded by the connection's read deadline rather than
		// a context per message: a message costs no context, timer and
		// watcher then, and the stream reads one per outbox row.
		if !rd.set(deadline) {
			return context.Cause(ctx)
		}
		msg, err := r.conn.ReceiveMessage(context.Background())
		if err != nil {
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			if pgconn.Timeout(err) {
				continue
			}
			return fmt.Errorf("cdc: receive from the replication stream: %w", err)
		}
		switch m := msg.(type) {
		case *pgproto3.CopyData:
			if err := r.copyData(ctx, m.Data); err != nil {
				return err
			}
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("cdc: replication stream: %w", pgconn.ErrorResponseToPgError(m))
		case *pgproto3.CopyDone:
			return errors.New("cdc: the server ended the replication stream")
		}
	}
}

// readDeadline bounds the receive loop's reads with the connection's read
// deadline, and interrupts a read when the loop's context ends (from another
// goroutine, hence the lock: a deadline set by the loop must not undo the
// interruption).
type readDeadline struct {
	mu          sync.Mutex
	conn        net.Conn
	interrupted bool
	// last is the deadline set last: the loop sets the same one for many
	// messages in a row, and setting it again would cost a timer update.
	last time.Time
}

func newReadDeadline(conn net.Conn) *readDeadline { return &readDeadline{conn: conn} }

// set makes reads time out at t; it reports false once interrupted.
func (d *readDeadline) set(t time.Time) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.interrupted {
		return false
	}
	if !t.Equal(d.last) {
		_ = d.conn.SetReadDeadline(t)
		d.last = t
	}
	return true
}

// interrupt makes the current read, and every later one, time out now.
func (d *readDeadline) interrupt() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.interrupted {
		return // or released: the loop is over
	}
	d.interrupted = true
	_ = d.conn.SetReadDeadline(time.Now())
}

// release leaves the connection without a read deadline, for what is sent
// and read on it after the loop (the last status update).
func (d *readDeadline) release() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.interrupted = true
	_ = d.conn.SetReadDeadline(time.Time{})
}

func (r *receiver) copyData(ctx context.Context, data []byte) error {
	if len(data) == 0 {
		return nil
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return wrapf(ErrProtocol, err, "keepalive")
		}
		r.s.observeServerLSN(ka.ServerWALEnd)
		r.received = max(r.received, ka.ServerWALEnd)
		if !r.inTx {
			// Everything before the server's WAL end has been sent to us, and
			// we are between transactions.
			r.idle = max(r.idle, ka.ServerWALEnd)
		}
		if ka.ReplyRequested {
			return r.sendStatus()
		}
	case pglogrepl.XLogDataByteID:
		x, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return wrapf(ErrProtocol, err, "XLogData")
		}
		r.s.observeServerLSN(x.ServerWALEnd)
		r.received = max(r.received, x.WALStart)
		return r.message(ctx, x.WALData)
	}
	return nil
}

// message handles one pgoutput message. Its bytes belong to the connection's
// buffer: everything kept is copied (buildEvent does).
func (r *receiver) message(ctx context.Context, data []byte) error {
	// Inserts, and the BEGIN and COMMIT around them, are read here without
	// pglogrepl's parser, which allocates a message each: with one row per
	// transaction they are most of the stream.
	if len(data) > 0 {
		switch data[0] {
		case byte(pglogrepl.MessageTypeInsert):
			return r.insert(ctx, data)
		case byte(pglogrepl.MessageTypeBegin):
			if len(data) < 21 {
				return errorf(ErrProtocol, "a BEGIN message of %d bytes", len(data))
			}
			return r.begin(pglogrepl.LSN(binary.BigEndian.Uint64(data[1:9])), pgTime(data[9:17]), binary.BigEndian.Uint32(data[17:21]))
		case byte(pglogrepl.MessageTypeCommit):
			if len(data) < 26 {
				return errorf(ErrProtocol, "a COMMIT message of %d bytes", len(data))
			}
			return r.commit(ctx, pglogrepl.LSN(binary.BigEndian.Uint64(data[2:10])),
				pglogrepl.LSN(binary.BigEndian.Uint64(data[10:18])), pgTime(data[18:26]))
		}
	}
	msg, err := pglogrepl.Parse(data)
	if err != nil {
		return wrapf(ErrProtocol, err, "decode a pgoutput message")
	}
	switch m := msg.(type) {
	case *pglogrepl.RelationMessage:
		r.rels.add(m)
	case *pglogrepl.LogicalDecodingMessage:
		switch m.Prefix {
		case HeartbeatPrefix:
			if m.Transactional && r.inTx {
				r.tx.heartbeat = true
			}
		case r.s.cfg.MessagePrefix:
			return r.outboxMessage(ctx, m)
		}
	}
	// Update, delete, truncate, type and origin messages carry nothing for
	// us: the publication publishes inserts.
	return nil
}

// pgTime reads a pgoutput timestamp: microseconds since 2000-01-01 UTC.
func pgTime(b []byte) time.Time {
	const y2k = 946684800 * 1000000 // microseconds from the Unix epoch to 2000-01-01
	return time.Unix(0, (int64(binary.BigEndian.Uint64(b))+y2k)*1000)
}

// begin opens a source transaction.
func (r *receiver) begin(finalLSN pglogrepl.LSN, commitTime time.Time, xid uint32) error {
	if r.inTx {
		return errorf(ErrProtocol, "BEGIN of transaction %d inside another transaction", xid)
	}
	r.inTx = true
	r.tx.commitLSN, r.tx.commitTime, r.tx.xid = finalLSN, commitTime, xid
	r.tx.events, r.tx.bytes, r.tx.parts, r.tx.heartbeat = nil, 0, 0, false
	return nil
}

// commit ends a source transaction: its events go towards the sink.
func (r *receiver) commit(ctx context.Context, commitLSN, end pglogrepl.LSN, commitTime time.Time) error {
	if !r.inTx {
		return errorf(ErrProtocol, "COMMIT at %s without BEGIN", commitLSN)
	}
	r.inTx = false
	r.lastTxEvents = len(r.tx.events)
	if len(r.tx.events) == 0 && r.tx.parts == 0 && !r.tx.heartbeat {
		// Nothing for the sink (servers before 15 send every
		// transaction): acknowledge it once nothing is in flight.
		r.idle = max(r.idle, end)
		return nil
	}
	b := Batch{Slot: r.s.cfg.Slot, Events: r.tx.events, CommitLSN: commitLSN, EndLSN: end,
		CommitTime: commitTime, Heartbeat: r.tx.heartbeat && len(r.tx.events) == 0 && r.tx.parts == 0,
		Transactions: 1}
	r.tx.events = nil
	r.queuedEnd = end
	r.s.received(commitLSN, commitTime)
	if r.tx.parts > 0 {
		return r.queue(ctx, b)
	}
	return r.hold(ctx, b)
}

// insert handles a pgoutput Insert message: one row of the outbox table
// (or of another table the publication covers, which is skipped).
func (r *receiver) insert(ctx context.Context, data []byte) error {
	if !r.inTx {
		return errorf(ErrProtocol, "an insert outside a transaction")
	}
	relID, cols, err := parseInsert(data, r.cols)
	r.cols = cols
	if err != nil {
		return err
	}
	rel, err := r.rels.get(relID)
	if err != nil {
		return err
	}
	if !rel.ours {
		return nil // the publication covers more than the outbox table
	}
	row, err := rel.rowFromTuple(cols)
	if err != nil {
		return err
	}
	ev := buildEvent(&row, &rel.typ, &rel.gone, uint64(r.tx.commitLSN))
	ev.Xid = r.tx.xid
	return r.add(ctx, &ev)
}

// add appends an event (a row or a message) to the open transaction, and
// hands over a part when the transaction has grown past the batch bounds.
func (r *receiver) add(ctx context.Context, ev *outbox.Event) error {
	if r.tx.events == nil {
		r.tx.events = r.room()
	}
	r.tx.events = append(r.tx.events, *ev)
	r.tx.bytes += eventBytes(ev)
	if len(r.tx.events) >= r.s.cfg.MaxBatchEvents || r.tx.bytes >= r.s.cfg.MaxBatchBytes {
		// Bounded memory: hand over a part. Its EndLSN is CommitLSN+1,
		// see Batch.EndLSN.
		b := Batch{Slot: r.s.cfg.Slot, Events: r.tx.events, CommitLSN: r.tx.commitLSN,
			EndLSN: r.tx.commitLSN + 1, CommitTime: r.tx.commitTime, Partial: true}
		r.tx.events, r.tx.bytes = nil, 0
		r.tx.parts++
		r.s.received(r.tx.commitLSN, r.tx.commitTime)
		if err := r.flushPending(ctx); err != nil {
			return err
		}
		return r.queue(ctx, b)
	}
	return nil
}

// pendingPoll is how soon the receive loop looks again whether the sink can
// take the pending batch.
const pendingPoll = time.Millisecond

// While the stream is catching up (the pending batch's newest transaction
// committed more than catchUpAge ago), a free sink does not get the
// pending batch at once, but when it is full (MaxBatchEvents) or has waited
// catchUpWait. Handed over at once, a batch holds what was read while the
// sink took the previous one: on a backlog of single-row transactions a
// fast sink then commits every one or two (14,578 commits for 200,000
// events), the correlator starts a hundred or so sagas a batch at half its
// rate at a thousand, and those commits take the CPU the decoding needs.
// A stream that keeps up is never held, and catchUpWait bounds the delay a
// backlog adds to its newest events, which are a second late already. A
// batch of heartbeats alone is never held: it carries nothing to
// amortize, and it is what lets the slot advance. (The age is read on the
// relay's clock against the server's: a relay whose clock runs catchUpAge
// ahead holds every batch up to catchUpWait; one whose clock runs behind
// batches as if it kept up. pgoutput reports no WAL end to compare
// positions with: its messages carry their own position there.)
const (
	catchUpAge  = time.Second
	catchUpWait = 50 * time.Millisecond
)

// holdBack is how much longer the pending batch waits for more while the
// stream catches up (zero: hand it over when the sink is free).
func (r *receiver) holdBack() time.Duration {
	p := r.pending
	if p.Heartbeat || len(p.Events) >= r.s.cfg.MaxBatchEvents {
		return 0
	}
	now := time.Now()
	if now.Sub(p.CommitTime) < catchUpAge {
		return 0
	}
	return max(0, r.s.catchUpWait-now.Sub(r.pendingSince))
}

// offerCaughtUp offers the pending batch unless it is held back.
func (r *receiver) offerCaughtUp() {
	if r.holdBack() == 0 {
		r.offer()
	}
}

// hold hands a whole transaction to the sink if it is free (and the stream
// is not catching up, see holdBack), and otherwise merges it into the
// pending batch, so that a burst of small source transactions costs one
// sink transaction instead of one each. The sink commits their effects and
// the checkpoint at the newest end LSN together, which is exactly as safe:
// a replay of any of them is behind the checkpoint. An idle stream hands
// each transaction over at once; memory stays bounded by MaxBatchEvents and
// MaxBatchBytes per batch, with at most one batch in the sink, one queued
// and one pending.
func (r *receiver) hold(ctx context.Context, b Batch) error {
	if b.EndLSN <= r.replayUntil {
		// A replay goes alone, so that the sink sees it as one.
		if err := r.flushPending(ctx); err != nil {
			return err
		}
		return r.queue(ctx, b)
	}
	if p := r.pending; p != nil {
		size := batchBytes(&b)
		if len(p.Events)+len(b.Events) <= r.s.cfg.MaxBatchEvents && r.pendingBytes+size <= r.s.cfg.MaxBatchBytes {
			r.pendingBytes += size
			if n := len(p.Events); len(b.Events) > 0 && n < cap(p.Events) && &p.Events[:n+1][n] == &b.Events[0] {
				// The transaction's events were read into the pending
				// batch's room (see room): they are in place already.
				p.Events = p.Events[:n+len(b.Events)]
			} else {
				if need := n + len(b.Events); need > cap(p.Events) {
					// Double (append grows a large slice by a quarter,
					// which copies a batch of many small transactions
					// many times).
					grown := make([]outbox.Event, n, min(max(2*cap(p.Events), need, 64, r.lastHandedOver), r.s.cfg.MaxBatchEvents))
					copy(grown, p.Events)
					p.Events = grown
				}
				p.Events = append(p.Events, b.Events...)
			}
			p.CommitLSN, p.EndLSN, p.CommitTime = b.CommitLSN, b.EndLSN, b.CommitTime
			p.Heartbeat = p.Heartbeat && b.Heartbeat
			p.Transactions += b.Transactions
			r.offerCaughtUp()
			return nil
		}
		if err := r.flushPending(ctx); err != nil {
			return err
		}
	}
	r.pending, r.pendingBytes, r.pendingSince = &b, batchBytes(&b), time.Now()
	r.offerCaughtUp()
	return nil
}

// room returns an empty slice for the events of a transaction that begins:
// the unused end of the pending batch's events when it has some, so that
// hold merges the transaction without copying its events, else a slice of
// its own sized like the previous transaction's.
func (r *receiver) room() []outbox.Event {
	if p := r.pending; p != nil && len(p.Events) < cap(p.Events) {
		return p.Events[len(p.Events):len(p.Events)]
	}
	return make([]outbox.Event, 0, min(max(r.lastTxEvents, 1), r.s.cfg.MaxBatchEvents))
}

// handOver is the pending batch as the sink gets it: without the unused end
// of its events, into which the receiver may go on reading (see room), so
// that the sink never sees, nor appends into, what is read after it.
func (r *receiver) handOver() Batch {
	b := *r.pending
	b.Events = b.Events[:len(b.Events):len(b.Events)]
	return b
}

// offer hands the pending batch to the sink if it can take it now.
func (r *receiver) offer() bool {
	select {
	case r.batches <- r.handOver():
		r.lastHandedOver, r.pending = len(r.pending.Events), nil
		return true
	default:
		return false
	}
}

// flushPending hands the pending batch over, waiting for the sink if needed.
func (r *receiver) flushPending(ctx context.Context) error {
	if r.pending == nil {
		return nil
	}
	b := r.handOver()
	r.lastHandedOver, r.pending = len(b.Events), nil
	return r.queue(ctx, b)
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// queue hands a batch to the sink goroutine, sending status updates while it
// waits so that a slow sink does not trip wal_sender_timeout.
func (r *receiver) queue(ctx context.Context, b Batch) error {
	for {
		wait := time.Until(r.nextStatus)
		if wait <= 0 {
			if err := r.sendStatus(); err != nil {
				return err
			}
			continue
		}
		t := time.NewTimer(wait)
		select {
		case r.batches <- b:
			t.Stop()
			return nil
		case <-ctx.Done():
			t.Stop()
			return context.Cause(ctx)
		case <-t.C:
		}
	}
}

// flushPos is the position we may report as flushed: the end of the newest
// transaction the sink committed, or, when nothing is in flight, the newest
// idle position. It never moves backwards.
func (r *receiver) flushPos() pglogrepl.LSN {
	f := pglogrepl.LSN(r.committed.Load())
	if !r.inTx && f >= r.queuedEnd {
		f = max(f, r.idle)
	}
	if r.gate != nil {
		f = r.gate.pass(f)
	}
	return max(f, r.sent)
}

// sendStatus reports our position. Write, flush and apply are all set:
// pglogrepl would copy write into a zero flush.
func (r *receiver) sendStatus() error {
	f := r.flushPos()
	if f == 0 {
		return errorf(ErrProtocol, "no position to report")
	}
	err := pglogrepl.SendStandbyStatusUpdate(context.Background(), r.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: max(r.received, f),
		WALFlushPosition: f,
		WALApplyPosition: f,
		ClientTime:       time.Now(),
	})
	if err != nil {
		return fmt.Errorf("cdc: send status update: %w", err)
	}
	r.sent = f
	r.s.flushed.Store(uint64(f))
	r.nextStatus = time.Now().Add(r.s.cfg.StatusInterval)
	r.s.cfg.Metrics.LagObserved(r.s.Lag())
	return nil
}

// runSink hands batches to the sink in order. After a failure, or once stop
// is done, it drains the channel without handling anything.
func (s *Stream) runSink(sinkCtx, stop context.Context, batches <-chan Batch, committed *atomic.Uint64, handled *atomic.Int64, fail context.CancelCauseFunc) {
	for b := range batches {
		if stop.Err() != nil {
			continue
		}
		if err := s.handle(sinkCtx, b); err != nil {
			fail(err)
			continue
		}
		handled.Add(1)
		if !b.Partial {
			storeMax(committed, b.EndLSN)
			s.handledThrough(b.EndLSN)
		}
	}
}

// handle calls the sink and records what a committed batch means.
func (s *Stream) handle(ctx context.Context, b Batch) error {
	began := time.Now()
	s.health.handOver(b, began)
	if err := s.sink.HandleBatch(ctx, b); err != nil {
		if ctx.Err() == nil {
			s.health.failed(b, s.red.string(err.Error()))
		}
		return &sinkFailure{fmt.Errorf("cdc: the sink failed on the batch at %s (%d events); nothing past the previous batch is acknowledged and this one will be replayed: %w", b.EndLSN, len(b.Events), err)}
	}
	if !b.Partial && !b.CommitTime.IsZero() {
		s.lastCommit.Store(b.CommitTime.UnixNano())
	}
	s.health.committed(b, time.Now())
	s.throttle.Recovered(keySession, "stream recovered: batches commit again", "lsn", b.EndLSN.String())
	poison := 0
	for i := range b.Events {
		if b.Events[i].Poison != "" {
			poison++
		}
	}
	if poison > 0 {
		s.log.Warn("poison events handed to the sink", "lsn", b.CommitLSN.String(), "count", poison, "first_reason", firstPoison(b.Events))
	}
	s.log.Debug("batch handled", "lsn", b.EndLSN.String(), "events", len(b.Events), "partial", b.Partial, "snapshot", b.Snapshot)
	s.cfg.Metrics.BatchHandled(BatchStats{Events: len(b.Events), Poison: poison, Partial: b.Partial,
		Snapshot: b.Snapshot, Heartbeat: b.Heartbeat, EndLSN: b.EndLSN, Duration: time.Since(began)})
	return nil
}

// sinkFailure marks an error the sink returned.
type sinkFailure struct{ err error }

func (e *sinkFailure) Error() string { return e.err.Error() }
func (e *sinkFailure) Unwrap() error { return e.err }

func firstPoison(evs []outbox.Event) string {
	for i := range evs {
		if evs[i].Poison != "" {
			return evs[i].Poison
		}
	}
	return ""
}

func storeMax(a *atomic.Uint64, v pglogrepl.LSN) {
	for {
		old := a.Load()
		if uint64(v) <= old || a.CompareAndSwap(old, uint64(v)) {
			return
		}
	}
}

func (s *Stream) observeServerLSN(l pglogrepl.LSN) { storeMax(&s.serverLSN, l) }

// eventBytes estimates what an event weighs in a batch: its payload and
// headers, plus a fixed allowance for the other fields.
func eventBytes(ev *outbox.Event) int { return len(ev.Payload) + len(ev.Headers) + 256 }

func batchBytes(b *Batch) int {
	n := 0
	for i := range b.Events {
		n += eventBytes(&b.Events[i])
	}
	return n
}
