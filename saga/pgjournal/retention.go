package pgjournal

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/compensa/compensa/saga"
)

// RetentionConfig says what the janitor deletes and when. A zero duration
// keeps that kind of row forever.
type RetentionConfig struct {
	// History: the step records, journal events and inbox rows of an
	// instance that ended COMPLETED or COMPENSATED longer ago than this are
	// deleted and its row becomes a tombstone. Re-driven dead letters and
	// skipped sink deliveries older than this are deleted too.
	History time.Duration
	// Failed: the same for FAILED and TIMED_OUT instances, and for dead
	// letters nobody re-drove. Zero keeps them until an operator acts.
	Failed time.Duration
	// DedupeWindow: a tombstone is deleted once its instance ended longer
	// ago than this, and so is an inbox row no instance took. Until then the
	// unique start index recognises its trigger when it is read again.
	DedupeWindow time.Duration
	// ResyncSlot and ResyncMargin, when the slot is re-created by a resync
	// from the outbox (cdc.SlotLostResync): a tombstone created after the
	// slot's checkpoint time minus the margin is kept whatever its age,
	// since the resync would re-read its trigger.
	ResyncSlot   string
	ResyncMargin time.Duration
	// BatchSize is the most rows one transaction deletes (default 500);
	// Interval how often a round runs (default 30s); Pause the breath
	// between two batches (default 20ms).
	BatchSize int
	Interval  time.Duration
	Pause     time.Duration
	// CompactCounts, when set, runs at the end of every round: it folds
	// the status-count changes (saga_status_deltas) into the totals, so
	// that the deltas table stays small whether or not anyone reads the
	// overview.
	CompactCounts func(context.Context) (int64, error)
	// OnDeleted is told how many rows of a table a batch deleted;
	// OnOldestKept, after each round, the age of the oldest row kept per
	// table (0 when none). Either may be nil.
	OnDeleted    func(table string, n int64)
	OnOldestKept func(table string, age time.Duration)
	Logger       *slog.Logger
}

// Tables the janitor reports on, as the metrics label them.
const (
	TableSteps     = "saga_steps"
	TableEvents    = "saga_events"
	TableInbox     = "relay_inbox"
	TableInstances = "saga_instances"
	TableDeadLet   = "relay_dead_letters"
	TableSkipped   = "relay_sink_skipped"
	TableDeltas    = "saga_status_deltas"
)

// RetentionApplicationName is the application_name of the janitor's
// session: its deleting statements run on the session that holds its lock,
// so an operator (or a test) finds them, and whom they block, in
// pg_stat_activity.
const RetentionApplicationName = "compensa-retention"

// Retention is the janitor: one relay at a time (a session advisory lock
// elects it) deletes, in short transactions of at most BatchSize rows, the
// history RetentionConfig says is no longer kept.
type Retention struct {
	pool *pgxpool.Pool
	cfg  RetentionConfig
}

// retentionDB is what a round needs: the pool (RunOnce) or the session
// that holds the janitor's lock (Run).
type retentionDB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// RetentionRound is what one round deleted, by table, and how many
// instances it turned into tombstones.
type RetentionRound struct {
	Tombstoned int64
	Deleted    map[string]int64
}

// NewRetention returns the janitor over pool.
func NewRetention(pool *pgxpool.Pool, cfg RetentionConfig) (*Retention, error) {
	if pool == nil {
		return nil, saga.Errorf(saga.ErrInvalid, "pgjournal: the pool is nil")
	}
	for name, d := range map[string]time.Duration{"History": cfg.History, "Failed": cfg.Failed,
		"DedupeWindow": cfg.DedupeWindow, "ResyncMargin": cfg.ResyncMargin, "Interval": cfg.Interval, "Pause": cfg.Pause} {
		if d < 0 {
			return nil, saga.Errorf(saga.ErrInvalid, "pgjournal: RetentionConfig.%s is %s: durations must not be negative", name, d)
		}
	}
	if cfg.BatchSize < 0 {
		return nil, saga.Errorf(saga.ErrInvalid, "pgjournal: RetentionConfig.BatchSize is %d: give a positive number", cfg.BatchSize)
	}
	cfg.BatchSize = cmp.Or(cfg.BatchSize, 500)
	cfg.Interval = cmp.Or(cfg.Interval, 30*time.Second)
	cfg.Pause = cmp.Or(cfg.Pause, 20*time.Millisecond)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Retention{pool: pool, cfg: cfg}, nil
}

// Run runs rounds every Interval until ctx ends, while this process holds
// the janitor's lock; otherwise it polls for the lock at the same pace. The
// lock is a session lock on a connection of its own, so a relay that dies
// frees it with its session.
func (r *Retention) Run(ctx context.Context) {
	log := r.cfg.Logger
	waiting := false
	for ctx.Err() == nil {
		conn, err := r.lead(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			log.Warn("retention: could not try the janitor's lock; will retry", "err", err)
		case conn == nil && !waiting && ctx.Err() == nil:
			waiting = true
			log.Info("retention: another relay runs the janitor; standing by")
		case conn != nil:
			waiting = false
			log.Info("retention: this relay runs the janitor", "history", r.cfg.History.String(),
				"failed", r.cfg.Failed.String(), "dedupe_window", r.cfg.DedupeWindow.String())
			r.serve(ctx, conn)
			conn.Close(context.WithoutCancel(ctx))
		}
		select {
		case <-ctx.Done():
		case <-time.After(r.cfg.Interval):
		}
	}
}

// lead returns a connection holding the janitor's lock, or nil when
// another session holds it.
func (r *Retention) lead(ctx context.Context) (*pgx.Conn, error) {
	c, err := r.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	// Out of the pool: a session lock must not go back into it.
	conn := c.Hijack()
	var ok bool
	if err := conn.QueryRow(ctx, sqlRetentionLock).Scan(&ok); err != nil || !ok {
		conn.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	if _, err := conn.Exec(ctx, sqlRetentionSession, RetentionApplicationName); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	return conn, nil
}

// serve runs rounds on conn (the lock's session) while it answers: a
// relay that lost the lock with its session deletes nothing more.
func (r *Retention) serve(ctx context.Context, conn *pgx.Conn) {
	log := r.cfg.Logger
	failing := false
	for {
		round, err := r.round(ctx, conn)
		if err != nil && ctx.Err() == nil {
			if !failing {
				log.Warn("retention round failed; will retry", "err", err)
			}
			failing = true
		} else if err == nil {
			if failing {
				log.Info("retention works again")
			}
			failing = false
			if round.Tombstoned > 0 || len(round.Deleted) > 0 {
				log.Info("retention round", "tombstoned", round.Tombstoned, "deleted", round.Deleted)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(r.cfg.Interval):
		}
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = conn.Ping(pctx)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				log.Warn("retention: lost the session that holds the janitor's lock", "err", err)
			}
			return
		}
	}
}

// RunOnce runs one round now, without the lock (Run takes it): tombstones,
// then deletions, then the status-count compaction and the oldest-kept
// report. It stops at the first error, keeping what committed.
func (r *Retention) RunOnce(ctx context.Context) (RetentionRound, error) {
	return r.round(ctx, r.pool)
}

// round is RunOnce on db.
func (r *Retention) round(ctx context.Context, db retentionDB) (RetentionRound, error) {
	round := RetentionRound{Deleted: map[string]int64{}}
	add := func(table string, n int64) {
		if n == 0 {
			return
		}
		round.Deleted[table] += n
		if r.cfg.OnDeleted != nil {
			r.cfg.OnDeleted(table, n)
		}
	}
	c := r.cfg
	if c.History > 0 {
		if err := r.tombstone(ctx, db, c.History, []string{string(saga.StatusCompleted), string(saga.StatusCompensated)}, &round, add); err != nil {
			return round, err
		}
	}
	if c.Failed > 0 {
		if err := r.tombstone(ctx, db, c.Failed, []string{string(saga.StatusFailed), string(saga.StatusTimedOut)}, &round, add); err != nil {
			return round, err
		}
	}
	if c.DedupeWindow > 0 {
		guard := time.Unix(1<<40, 0) // no resync: no guard
		if c.ResyncSlot != "" {
			if err := db.QueryRow(ctx, sqlResyncGuard, c.ResyncSlot, c.ResyncMargin.Microseconds()).Scan(&guard); err != nil {
				return round, fmt.Errorf("retention: read the resync guard: %w", err)
			}
		}
		if err := r.batches(ctx, db, TableInstances, add, sqlDeleteTombstones, c.DedupeWindow.Microseconds(), guard); err != nil {
			return round, err
		}
		if err := r.batches(ctx, db, TableInbox, add, sqlDeleteUnmatchedInbox, c.DedupeWindow.Microseconds()); err != nil {
			return round, err
		}
	}
	if c.History > 0 {
		if err := r.batches(ctx, db, TableDeadLet, add, sqlDeleteRedriven, c.History.Microseconds()); err != nil {
			return round, err
		}
		if err := r.batches(ctx, db, TableSkipped, add, sqlDeleteSkipped, c.History.Microseconds()); err != nil {
			return round, err
		}
	}
	if c.Failed > 0 {
		if err := r.batches(ctx, db, TableDeadLet, add, sqlDeleteParked, c.Failed.Microseconds()); err != nil {
			return round, err
		}
	}
	if c.CompactCounts != nil {
		n, err := c.CompactCounts(ctx)
		if err != nil {
			return round, err
		}
		add(TableDeltas, n)
	}
	return round, r.reportOldest(ctx, db)
}

// tombstone tombstones batch after batch until a batch comes back short.
func (r *Retention) tombstone(ctx context.Context, db retentionDB, age time.Duration, statuses []string, round *RetentionRound, add func(string, int64)) error {
	for {
		var stones, steps, events, inbox int64
		err := db.QueryRow(ctx, sqlTombstone, age.Microseconds(), statuses, r.cfg.BatchSize).Scan(&stones, &steps, &events, &inbox)
		if err != nil {
			return fmt.Errorf("retention: delete the history of instances %v: %w", statuses, err)
		}
		round.Tombstoned += stones
		add(TableSteps, steps)
		add(TableEvents, events)
		add(TableInbox, inbox)
		if stones < int64(r.cfg.BatchSize) {
			return nil
		}
		if err := r.pause(ctx); err != nil {
			return err
		}
	}
}

// batches runs a deleting statement (its last parameter the batch size)
// until it deletes less than a batch.
func (r *Retention) batches(ctx context.Context, db retentionDB, table string, add func(string, int64), sql string, args ...any) error {
	args = append(args, r.cfg.BatchSize)
	for {
		tag, err := db.Exec(ctx, sql, args...)
		if err != nil {
			return fmt.Errorf("retention: delete from %s: %w", table, err)
		}
		add(table, tag.RowsAffected())
		if tag.RowsAffected() < int64(r.cfg.BatchSize) {
			return nil
		}
		if err := r.pause(ctx); err != nil {
			return err
		}
	}
}

// pause leaves room for the application between two batches.
func (r *Retention) pause(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(r.cfg.Pause):
		return nil
	}
}

func (r *Retention) reportOldest(ctx context.Context, db retentionDB) error {
	if r.cfg.OnOldestKept == nil {
		return nil
	}
	statuses := []string{string(saga.StatusCompleted), string(saga.StatusCompensated)}
	if r.cfg.Failed > 0 {
		statuses = append(statuses, string(saga.StatusFailed), string(saga.StatusTimedOut))
	}
	var history, stones, dead, skipped float64
	if err := db.QueryRow(ctx, sqlOldestKept, statuses).Scan(&history, &stones, &dead, &skipped); err != nil {
		return fmt.Errorf("retention: read the oldest rows kept: %w", err)
	}
	sec := func(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
	for _, t := range []string{TableSteps, TableEvents, TableInbox} {
		r.cfg.OnOldestKept(t, sec(history))
	}
	r.cfg.OnOldestKept(TableInstances, sec(stones))
	r.cfg.OnOldestKept(TableDeadLet, sec(dead))
	r.cfg.OnOldestKept(TableSkipped, sec(skipped))
	return nil
}
