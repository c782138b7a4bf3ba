package correlator

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/compensa/compensa/cdc"
	"github.com/compensa/compensa/internal/tracing"
	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/saga"
)

// WakeChannel is the LISTEN/NOTIFY channel on which the correlator tells
// runners in other processes that instances became due.
const WakeChannel = "compensa_runner_wake"

// DefaultConsumer names this correlator in relay_inbox.
const DefaultConsumer = "compensa.correlator"

// Config configures a Correlator. Registry is required.
type Config struct {
	Registry *saga.Registry
	// Consumer keys the reply inbox; replicas of one deployment share it.
	Consumer string
	// Wake is called after a commit that started instances or delivered
	// replies (in-process runner wake-up). Optional.
	Wake func()
	// Notify also sends pg_notify(WakeChannel) in the batch's transaction,
	// for runners in other processes. Default true; see DisableNotify.
	DisableNotify bool
	// OnStarted is told, after each commit, how many instances of each saga
	// the batch started (for per-saga metrics). Optional.
	OnStarted func(saga string, n int)
	// InBatchTx, when set, is called inside each fresh batch's transaction
	// (after the checkpoint moved, before the commit; not for a replayed
	// batch), so that other owners' rows (the sinks' parked deliveries)
	// commit with the checkpoint or not at all. ctx is the one HandleBatch
	// received. An error rolls the batch back and stops the stream.
	InBatchTx func(ctx context.Context, tx pgx.Tx, b cdc.Batch) error
	Logger    *slog.Logger
	// TracerProvider makes the spans of the events' handling and of saga
	// starts (nil: no spans, no trace context stored with instances).
	TracerProvider trace.TracerProvider
}

func (c *Config) withDefaults() Config {
	out := *c
	out.Consumer = cmp.Or(out.Consumer, DefaultConsumer)
	if out.Logger == nil {
		out.Logger = slog.New(slog.DiscardHandler)
	}
	return out
}

func (c *Config) validate() error {
	if c.Registry == nil {
		return errors.New("correlator: Config.Registry is nil: register saga definitions and pass the registry")
	}
	return nil
}

// Stats are the correlator's counters since start.
type Stats struct {
	EventsSeen       uint64
	Batches          uint64
	BatchesReplayed  uint64
	SagasStarted     uint64
	DuplicateStarts  uint64
	RepliesDelivered uint64
	LateReplies      uint64
	EventsParked     uint64
	// What became of each event the stream handed over (they add up to
	// EventsSeen): it started sagas, went to reply correlation, concerned
	// no saga (ignored, by design: most outbox events are not triggers), or
	// was parked.
	OutcomeStarted uint64
	OutcomeReply   uint64
	OutcomeIgnored uint64
	// OutcomeFiltered: a trigger matched the event's type but its filter
	// said no.
	OutcomeFiltered uint64
	OutcomeParked   uint64
}

// Correlator is the stream's Sink: see the package documentation.
type Correlator struct {
	pool   *pgxpool.Pool
	cfg    Config
	routes routes
	// routesGen is the registry generation routes were built from: a
	// registry changed since (declared sagas reloaded) rebuilds them at the
	// next batch. Batches are handled one at a time.
	routesGen uint64
	// routesKeyed: some saga routed to has a concurrency key, so batches do
	// not stream their starts (streamStarts).
	routesKeyed bool
	tracer      trace.Tracer // nil: tracing off
	// guardedLeft is how many more batches start their sagas with ON
	// CONFLICT DO NOTHING since one met a trigger started before (see
	// HandleBatch); batches are handled one at a time.
	guardedLeft int

	eventsSeen, batches, replayed, started, dupStarts, delivered, late, parked atomic.Uint64
	outStarted, outReply, outIgnored, outFiltered, outParked                   atomic.Uint64
}

var _ cdc.Sink = (*Correlator)(nil)

// New returns a correlator writing through pool. The routes are built once
// from the registry: register every definition before calling New.
func New(pool *pgxpool.Pool, cfg *Config) (*Correlator, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	c := cfg.withDefaults()
	r := buildRoutes(c.Registry)
	return &Correlator{pool: pool, cfg: c, routes: r, routesGen: c.Registry.Generation(), routesKeyed: r.keyed(),
		tracer: tracing.Tracer(c.TracerProvider)}, nil
}

// Stats returns a snapshot of the counters.
func (c *Correlator) Stats() Stats {
	return Stats{
		EventsSeen: c.eventsSeen.Load(), Batches: c.batches.Load(), BatchesReplayed: c.replayed.Load(),
		SagasStarted: c.started.Load(), DuplicateStarts: c.dupStarts.Load(),
		RepliesDelivered: c.delivered.Load(), LateReplies: c.late.Load(), EventsParked: c.parked.Load(),
		OutcomeStarted: c.outStarted.Load(), OutcomeReply: c.outReply.Load(),
		OutcomeIgnored: c.outIgnored.Load(), OutcomeFiltered: c.outFiltered.Load(), OutcomeParked: c.outParked.Load(),
	}
}

// LoadCheckpoint returns the end LSN recorded for slot, if any.
func (c *Correlator) LoadCheckpoint(ctx context.Context, slot string) (pglogrepl.LSN, bool, error) {
	return LoadCheckpoint(ctx, c.pool, slot)
}

// LoadCheckpoint reads relay_checkpoints for slot.
func LoadCheckpoint(ctx context.Context, q interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, slot string) (pglogrepl.LSN, bool, error) {
	var s string
	err := q.QueryRow(ctx, `SELECT lsn::text FROM relay_checkpoints WHERE slot_name = $1`, slot).Scan(&s)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("correlator: read checkpoint of slot %q: %w", slot, err)
	}
	lsn, err := pglogrepl.ParseLSN(s)
	if err != nil {
		return 0, false, fmt.Errorf("correlator: checkpoint of slot %q: %w", slot, err)
	}
	return lsn, true, nil
}

// outcome is what one batch did.
type outcome struct {
	replayed                bool
	started, dup            int
	startedBySaga           map[string]int
	delivered, late, parked int
}

// guardedBatches is how many batches after one that met a trigger started
// before use the guarded start: such triggers come in runs (the parts of a
// large transaction replayed after a crash, outbox rows read again after a
// resync), and each plain attempt among them would cost a transaction.
const guardedBatches = 100

// HandleBatch commits the batch's effects and its checkpoint in one
// transaction. A batch whose end LSN is not past the checkpoint was handled
// before (a replay after a crash): it is skipped.
func (c *Correlator) HandleBatch(ctx context.Context, b cdc.Batch) error {
	if g := c.cfg.Registry.Generation(); g != c.routesGen {
		c.routes, c.routesGen = buildRoutes(c.cfg.Registry), g
		c.routesKeyed = c.routes.keyed()
	}
	p := plan{tr: c.tracer, guarded: c.guardedLeft > 0}
	if c.guardedLeft > 0 {
		c.guardedLeft--
	}
	// A batch with many triggers is planned while its starts stream to
	// PostgreSQL (see streamStarts); any other is planned first.
	stream := !p.guarded && !c.routesKeyed && c.routes.triggers(b.Events, copyStarts)
	if !stream {
		for i := range b.Events {
			p.add(c.routes, &b.Events[i])
		}
	}
	out, err := c.commit(ctx, b, &p, stream)
	if p.seen == 0 {
		// A replay, or a failure before the starts: the retries below need
		// the plan.
		for i := range b.Events {
			p.add(c.routes, &b.Events[i])
		}
	}
	defer func() { p.endSpans(err) }()
	if err != nil && !p.guarded && startedBefore(err) {
		// A trigger of the batch has started its saga before (or comes
		// twice in it): the unique index refused the plain start, and the
		// transaction with it. Start the batch again with the guarded
		// form, which starts nothing for that trigger and the rest as
		// usual, and keep to it for the next batches.
		c.guardedLeft = guardedBatches
		p.guarded = true
		out, err = c.commit(ctx, b, &p, false)
	}
	if err != nil && isDataError(err) {
		p.endSpans(err)
		// A value PostgreSQL refuses got past the checks in plan.add. A
		// replay would fail the same way and stall the stream, so find the
		// events that carry one, park them, and commit the rest.
		var refused int
		if p, refused = c.replanRefused(ctx, b); refused > 0 {
			p.guarded = true
			c.cfg.Logger.Warn("PostgreSQL refused values in a batch: parking the events that carry them",
				"slot", b.Slot, "lsn", b.EndLSN.String(), "count", refused, "err", err)
			out, err = c.commit(ctx, b, &p, false)
		}
	}
	if err != nil && isContentError(err) {
		// Still refused for what an event holds (a value, a size, an index
		// entry): apply the events one by one and park those refused.
		c.cfg.Logger.Warn("PostgreSQL refused a batch for what an event holds: applying its events one by one and parking those refused",
			"slot", b.Slot, "lsn", b.EndLSN.String(), "err", err)
		p, out, err = c.commitOneByOne(ctx, b)
	}
	if err != nil && connectionLost(err) {
		// The database restarted or the network broke: every connection
		// the pool holds from before is as dead as this one was. Dropping
		// them all now lets the replay of this batch, and the runner, start
		// on fresh connections instead of finding the dead ones one failed
		// batch (and one stream reconnect) at a time.
		c.pool.Reset()
	}
	if err != nil {
		return err
	}
	c.batches.Add(1)
	if out.replayed {
		c.replayed.Add(1)
		c.cfg.Logger.Debug("replayed batch skipped", "slot", b.Slot, "lsn", b.EndLSN.String())
		return nil
	}
	c.eventsSeen.Add(uint64(p.seen))
	c.outStarted.Add(uint64(p.outStarted))
	c.outReply.Add(uint64(p.outReply))
	c.outIgnored.Add(uint64(p.outIgnored))
	c.outFiltered.Add(uint64(p.outFiltered))
	c.outParked.Add(uint64(p.outParked))
	c.started.Add(uint64(out.started))
	c.dupStarts.Add(uint64(out.dup))
	c.delivered.Add(uint64(out.delivered))
	c.late.Add(uint64(out.late))
	c.parked.Add(uint64(out.parked))
	if out.parked > 0 {
		c.cfg.Logger.Warn("events parked as dead letters", "slot", b.Slot, "lsn", b.EndLSN.String(), "count", out.parked)
	}
	if c.cfg.OnStarted != nil {
		for name, n := range out.startedBySaga {
			c.cfg.OnStarted(name, n)
		}
	}
	if (out.started > 0 || out.delivered > 0) && c.cfg.Wake != nil {
		c.cfg.Wake()
	}
	return nil
}

// commit applies the plan in one transaction with the checkpoint. With
// stream, p is still empty: it is planned while its starts stream
// (streamStarts), or first when the transaction's now() is not known.
func (c *Correlator) commit(ctx context.Context, b cdc.Batch, p *plan, stream bool) (outcome, error) {
	var out outcome
	tx, err := c.pool.Begin(ctx)
	if err != nil {
		return out, fmt.Errorf("correlator: begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))

	// The checkpoint goes first: it locks the slot's row, so two relays that
	// both believe they lead cannot interleave batches, and it tells a replay
	// apart (the row is not past EndLSN when we are behind it).
	fresh, now, err := checkpoint(ctx, tx, b)
	if err != nil {
		return out, err
	}
	if !fresh {
		out.replayed = true
		return out, tx.Commit(ctx)
	}
	startsSent := false
	if stream && !now.IsZero() {
		// Every transaction of the batch, not only the triggers' (the plan
		// is not made yet): each is committed, so the wait is as short.
		if xids := batchXids(b); len(xids) > 0 {
			if err := waitVisible(ctx, tx, xids, visibleWait); err != nil {
				return out, fmt.Errorf("correlator: batch at %s: %w", b.EndLSN, err)
			}
		}
		if err := streamStarts(ctx, tx, c.routes, b, p, now); err != nil {
			return out, fmt.Errorf("correlator: start sagas at %s: %w", b.EndLSN, err)
		}
		startsSent = true
		countStarts(p, &out)
	} else if stream {
		for i := range b.Events {
			p.add(c.routes, &b.Events[i])
		}
	}
	if !p.empty() {
		if err := c.applyEffects(ctx, tx, b, p, now, startsSent, &out); err != nil {
			return out, err
		}
	}
	if c.cfg.InBatchTx != nil {
		if err := c.cfg.InBatchTx(ctx, tx, b); err != nil {
			return out, fmt.Errorf("correlator: batch at %s: %w", b.EndLSN, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return out, fmt.Errorf("correlator: commit batch at %s: %w", b.EndLSN, err)
	}
	return out, nil
}

// batchXids returns the source transactions of b's events, each once.
func batchXids(b cdc.Batch) []int64 {
	var xids []int64
	for i := range b.Events {
		if x := int64(b.Events[i].Xid); x != 0 && (len(xids) == 0 || xids[len(xids)-1] != x) {
			xids = append(xids, x)
		}
	}
	return xids
}

// countStarts records in out the starts of a plan that started every one.
func countStarts(p *plan, out *outcome) {
	out.startedBySaga = map[string]int{}
	for _, name := range p.startSaga {
		out.startedBySaga[name]++
	}
	out.started = len(p.startSaga)
}

// checkpoint moves the slot's checkpoint to the batch's end LSN, or, for a
// partial batch, only checks that the batch is not behind it. It reports
// false for a batch already handled, and the transaction's now() when it
// read it (zero otherwise).
func checkpoint(ctx context.Context, tx pgx.Tx, b cdc.Batch) (bool, time.Time, error) {
	var now time.Time
	if b.Partial {
		// Parts of a large transaction share its end LSN: they are fresh
		// while the checkpoint is still below it.
		var behind bool
		err := tx.QueryRow(ctx, `SELECT lsn >= $2::pg_lsn, now() FROM relay_checkpoints WHERE slot_name = $1 FOR UPDATE`,
			b.Slot, b.EndLSN.String()).Scan(&behind, &now)
		if errors.Is(err, pgx.ErrNoRows) {
			return true, time.Time{}, nil
		}
		if err != nil {
			return false, now, fmt.Errorf("correlator: read checkpoint: %w", err)
		}
		return !behind, now, nil
	}
	var commitTime *time.Time
	if !b.CommitTime.IsZero() {
		commitTime = &b.CommitTime
	}
	err := tx.QueryRow(ctx, sqlCheckpoint, b.Slot, b.EndLSN.String(), commitTime).Scan(&now)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, now, nil
	}
	if err != nil {
		return false, now, fmt.Errorf("correlator: write checkpoint of slot %q at %s: %w", b.Slot, b.EndLSN, err)
	}
	return true, now, nil
}

// applyEffects sends the plan's statements in tx. now is the transaction's
// now() if known (zero: the starts go as sqlStart whatever their number);
// startsSent: the starts went already (streamStarts).
func (c *Correlator) applyEffects(ctx context.Context, tx pgx.Tx, b cdc.Batch, p *plan, now time.Time, startsSent bool, out *outcome) error {
	if len(p.startXids) > 0 && !startsSent {
		if err := waitVisible(ctx, tx, p.startXids, visibleWait); err != nil {
			return fmt.Errorf("correlator: batch at %s: %w", b.EndLSN, err)
		}
	}
	copied := startsSent || !p.guarded && !p.keyed && !now.IsZero() && len(p.startSaga) >= copyStarts
	if copied && !startsSent {
		if err := copyStart(ctx, tx, p, now); err != nil {
			return fmt.Errorf("correlator: start sagas at %s: %w", b.EndLSN, err)
		}
		countStarts(p, out)
	}
	var batch pgx.Batch
	var startQ, replyQ, deadQ *pgx.QueuedQuery
	startSQL, keyedSQL := sqlStart, sqlStartKeyed
	if p.guarded {
		startSQL, keyedSQL = sqlStartGuarded, sqlStartKeyedGuarded
	}
	switch {
	case copied:
	case p.keyed:
		startQ = batch.Queue(keyedSQL, p.startTenant, p.startWorkspace, p.startSaga, p.startVersion,
			p.startTrigger, p.startCorr, p.startContext, p.startDeadline, p.startAggregate, p.startID,
			p.startConcKey, p.startConcLimit, p.startConcLSN, p.startConcOrd, p.startTrace)
	case len(p.startSaga) > 0:
		startQ = batch.Queue(startSQL, p.startTenant, p.startWorkspace, p.startSaga, p.startVersion,
			p.startTrigger, p.startCorr, p.startContext, p.startDeadline, p.startAggregate, p.startID, p.startTrace)
	}
	if len(p.replyEvent) > 0 {
		replyQ = batch.Queue(sqlReplies, p.replyEvent, p.replyCorr, p.replyPayload, c.cfg.Consumer, p.replyTenant)
	}
	if len(p.deadReason) > 0 {
		deadQ = batch.Queue(sqlPark, p.deadEventID, p.deadEventType, p.deadLSN, p.deadReason, p.deadRaw)
	}
	if !c.cfg.DisableNotify && len(p.startSaga)+len(p.replyEvent) > 0 {
		batch.Queue(`SELECT pg_notify($1, '')`, WakeChannel)
	}
	br := tx.SendBatch(ctx, &batch)
	if startQ != nil {
		var err error
		out.startedBySaga = map[string]int{}
		if p.guarded {
			var rows pgx.Rows
			if rows, err = br.Query(); err == nil {
				var name string
				var n int
				_, err = pgx.ForEachRow(rows, []any{&name, &n}, func() error {
					out.startedBySaga[name] += n
					out.started += n
					return nil
				})
			}
		} else {
			// The plain form starts every instance or fails.
			var tag pgconn.CommandTag
			if tag, err = br.Exec(); err == nil && tag.RowsAffected() != int64(len(p.startSaga)) {
				err = fmt.Errorf("%d instances inserted for %d starts", tag.RowsAffected(), len(p.startSaga))
			}
			if err == nil {
				for _, name := range p.startSaga {
					out.startedBySaga[name]++
				}
				out.started = len(p.startSaga)
			}
		}
		if err != nil {
			br.Close()
			return fmt.Errorf("correlator: start sagas at %s: %w", b.EndLSN, err)
		}
		out.dup = len(p.startSaga) - out.started
	}
	var foreign []uuid.UUID
	if replyQ != nil {
		if err := br.QueryRow().Scan(&out.delivered, &out.late, &foreign); err != nil {
			br.Close()
			return fmt.Errorf("correlator: deliver replies at %s: %w", b.EndLSN, err)
		}
	}
	if deadQ != nil {
		if err := br.QueryRow().Scan(&out.parked); err != nil {
			br.Close()
			return fmt.Errorf("correlator: park dead letters at %s: %w", b.EndLSN, err)
		}
	}
	if err := br.Close(); err != nil {
		return fmt.Errorf("correlator: batch at %s: %w", b.EndLSN, err)
	}
	if len(foreign) > 0 {
		return c.parkForeignReplies(ctx, tx, b, p, foreign, out)
	}
	return nil
}

// ReasonForeignReply is the dead letter's reason for a reply whose tenant is
// not the tenant of the instance waiting on its correlation id.
const ReasonForeignReply = "reply from another tenant"

// parkForeignReplies parks the replies that answered another tenant's
// command: they were not delivered, and they are data an operator should see.
func (c *Correlator) parkForeignReplies(ctx context.Context, tx pgx.Tx, b cdc.Batch, p *plan, ids []uuid.UUID, out *outcome) error {
	want := make(map[uuid.UUID]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	var dead plan
	for i := range b.Events {
		ev := &b.Events[i]
		if want[ev.ID] && ev.CorrelationID.Valid {
			delete(want, ev.ID)
			dead.park(ev, ReasonForeignReply)
		}
	}
	if len(dead.deadReason) == 0 {
		return nil
	}
	var n int
	if err := tx.QueryRow(ctx, sqlPark, dead.deadEventID, dead.deadEventType, dead.deadLSN, dead.deadReason, dead.deadRaw).Scan(&n); err != nil {
		return fmt.Errorf("correlator: park replies from another tenant at %s: %w", b.EndLSN, err)
	}
	out.parked += n
	p.outReply -= dead.outParked
	p.outParked += dead.outParked
	c.cfg.Logger.Warn("replies from another tenant parked", "slot", b.Slot, "lsn", b.EndLSN.String(), "count", dead.outParked)
	return nil
}

// startedBefore reports a start refused by saga_instances' unique index:
// some trigger of the batch has started its saga already.
func startedBefore(err error) bool {
	var pgErr *pgconn.PgError
	return outbox.IsDuplicate(err) && errors.As(err, &pgErr) && pgErr.TableName == "saga_instances"
}

// isDataError reports a statement that failed on a value (SQLSTATE class 22,
// data exception), not on the database itself.
func isDataError(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "22")
}

// isContentError reports a statement that failed on what it was given: a
// value (class 22) or a size past a limit (54000, program_limit_exceeded:
// an index entry, a jsonb value too large).
func isContentError(err error) bool {
	var pgErr *pgconn.PgError
	return isDataError(err) || errors.As(err, &pgErr) && pgErr.Code == "54000"
}

// commitOneByOne is commit with each event's effects applied under a
// savepoint of their own: an event whose effects PostgreSQL refuses for
// what it holds is parked with PostgreSQL's message instead, and the rest
// commit. It returns the plan's counts for the whole batch. It costs a few
// round trips per event, on a path only a value every check missed takes.
func (c *Correlator) commitOneByOne(ctx context.Context, b cdc.Batch) (plan, outcome, error) {
	var total plan
	var out outcome
	tx, err := c.pool.Begin(ctx)
	if err != nil {
		return total, out, fmt.Errorf("correlator: begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	fresh, _, err := checkpoint(ctx, tx, b)
	if err != nil {
		return total, out, err
	}
	if !fresh {
		out.replayed = true
		return total, out, tx.Commit(ctx)
	}
	noID := map[uint64]int{} // rows without an id are numbered as in one plan
	var starts int32         // and starts keep their position in the batch
	for i := range b.Events {
		ev := b.Events[i]
		numbered := noID[ev.LSN]
		p := plan{noID: noID, ordBase: starts, guarded: true}
		p.add(c.routes, &ev)
		starts += int32(len(p.startSaga))
		if !p.empty() {
			var o outcome
			sp, err := tx.Begin(ctx)
			if err != nil {
				return total, out, fmt.Errorf("correlator: savepoint: %w", err)
			}
			err = c.applyEffects(ctx, sp, b, &p, time.Time{}, false, &o)
			if err == nil {
				err = sp.Commit(ctx)
			}
			if err != nil && !isContentError(err) {
				return total, out, err
			}
			if err != nil {
				if rerr := sp.Rollback(ctx); rerr != nil {
					return total, out, fmt.Errorf("correlator: roll back to savepoint: %w", rerr)
				}
				var pgErr *pgconn.PgError
				errors.As(err, &pgErr)
				noID[ev.LSN] = numbered // parked below under the number it had
				ev.Poison = "PostgreSQL refused what the event holds: " + pgErr.Message
				p = plan{noID: noID}
				p.add(c.routes, &ev)
				o = outcome{}
				if err := c.applyEffects(ctx, tx, b, &p, time.Time{}, false, &o); err != nil {
					return total, out, err
				}
			}
			out.started += o.started
			out.dup += o.dup
			out.delivered += o.delivered
			out.late += o.late
			out.parked += o.parked
			for name, n := range o.startedBySaga {
				if out.startedBySaga == nil {
					out.startedBySaga = map[string]int{}
				}
				out.startedBySaga[name] += n
			}
		}
		total.seen += p.seen
		total.outStarted += p.outStarted
		total.outReply += p.outReply
		total.outIgnored += p.outIgnored
		total.outFiltered += p.outFiltered
		total.outParked += p.outParked
	}
	if c.cfg.InBatchTx != nil {
		if err := c.cfg.InBatchTx(ctx, tx, b); err != nil {
			return total, out, fmt.Errorf("correlator: batch at %s: %w", b.EndLSN, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return total, out, fmt.Errorf("correlator: commit batch at %s: %w", b.EndLSN, err)
	}
	return total, out, nil
}

// replanRefused asks PostgreSQL, event by event, whether it accepts each
// payload the plan would send as jsonb, and plans the batch again with the
// refused ones marked as poison. It costs a round trip per event, on a path
// that only a value our checks missed can take.
func (c *Correlator) replanRefused(ctx context.Context, b cdc.Batch) (plan, int) {
	events := make([]outbox.Event, len(b.Events))
	copy(events, b.Events)
	refused := 0
	for i := range events {
		ev := &events[i]
		if ev.Poison != "" || len(ev.Payload) == 0 {
			continue
		}
		if _, err := c.pool.Exec(ctx, `SELECT $1::text::jsonb`, string(ev.Payload)); err != nil && isDataError(err) {
			var pgErr *pgconn.PgError
			errors.As(err, &pgErr)
			ev.Poison = "payload refused by PostgreSQL's jsonb: " + pgErr.Message
			refused++
		}
	}
	p := plan{tr: c.tracer}
	for i := range events {
		p.add(c.routes, &events[i])
	}
	return p, refused
}

// visibleWait bounds how long a batch waits for its triggers' transactions to
// become visible; past it the batch fails and the stream retries it.
const visibleWait = 10 * time.Second

// waitVisible returns once every transaction in xids (32-bit ids from the
// stream) is visible to a new snapshot. Logical decoding can deliver a
// commit a moment before a new snapshot sees its rows: the commit record is
// written before the transaction leaves the proc array. Were an instance
// started then, its first step could run in a snapshot that does not see the
// trigger's rows yet. Once a transaction is visible to one snapshot it is to
// every later one, and no runner can claim the instance before this
// transaction commits, so waiting here makes "the first step sees the
// trigger's transaction" hold for every saga, with no retry policy in the
// saga. The statement runs in READ COMMITTED, so each poll takes a fresh
// snapshot; the first one nearly always succeeds.
func waitVisible(ctx context.Context, tx pgx.Tx, xids []int64, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	pause := 200 * time.Microsecond
	for {
		var visible bool
		if err := tx.QueryRow(ctx, sqlTriggersVisible, xids).Scan(&visible); err != nil {
			return fmt.Errorf("check that the triggers' transactions are visible: %w", err)
		}
		if visible {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the triggers' transactions %v are not visible after %s", xids, limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pause):
		}
		pause = min(pause*2, 20*time.Millisecond)
	}
}

// connectionLost reports whether err says the connection it ran on is gone
// (a server that shut down or restarted, a broken network), rather than
// that the batch was refused.
func connectionLost(err error) bool {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return strings.HasPrefix(pg.Code, "08") || strings.HasPrefix(pg.Code, "57P")
	}
	return saga.Unreachable(err) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		strings.Contains(err.Error(), "conn closed")
}
