package sink

import (
	"context"
	"errors"
	"fmt"
	"path"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/compensa/compensa/cdc"
	"github.com/compensa/compensa/internal/backoff"
	"github.com/compensa/compensa/outbox"
)

// ReplayRequest selects the outbox rows a replay re-delivers to one sink.
type ReplayRequest struct {
	// Since (inclusive) and Until (exclusive; zero: now) bound created_at.
	Since, Until time.Time
	// AggregateType, when set, selects one aggregate type.
	AggregateType string
	// EventType, when set, is a glob (path.Match syntax) on the event type.
	EventType string
	// DryRun only counts.
	DryRun bool
	// IncludeSkipped re-delivers the events an operator skipped for this
	// sink (relay_sink_skipped) too; by default they are left out, since a
	// skipped event is one someone decided must never be delivered.
	IncludeSkipped bool
	// Table and Columns name the outbox table (default: outbox, default
	// columns).
	Table   outbox.TableName
	Columns outbox.ColumnMap
}

// ReplayResult is what a replay found and delivered.
type ReplayResult struct {
	Sink string `json:"sink"`
	// Found counts the rows in the window that the request and the sink's
	// match select.
	Found     int  `json:"found"`
	Delivered int  `json:"delivered"`
	DryRun    bool `json:"dry_run"`
	// Skipped counts the rows left out because an operator skipped them
	// for this sink (see ReplayRequest.IncludeSkipped).
	Skipped int `json:"skipped"`
}

// ErrReplayRunning: another replay of the same sink is under way (in this
// relay or any other process on the database); one runs at a time.
var ErrReplayRunning = errors.New("a replay of this sink is already running")

// connAcquirer is a pool a replay can take a connection of its own from,
// to hold the sink's replay lock for as long as it runs.
type connAcquirer interface {
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

// sqlReplayLock and sqlReplayUnlock take and free a sink's replay lock: a
// session advisory lock keyed by the sink's name, so that one replay of a
// sink runs at a time across relays and the CLI, and a process that dies
// frees it with its session.
const (
	sqlReplayLock   = `SELECT pg_try_advisory_lock(hashtextextended('compensa-sink-replay:' || $1, 0))`
	sqlReplayUnlock = `SELECT pg_advisory_unlock(hashtextextended('compensa-sink-replay:' || $1, 0))`
	// sqlSkippedOf lists which of the ids $2 an operator skipped for sink $1.
	sqlSkippedOf = `SELECT event_id FROM relay_sink_skipped WHERE sink = $1 AND event_id = ANY($2::text[])`
)

// lockReplay takes the sink's replay lock on a connection of db's own, or
// returns ErrReplayRunning; unlock frees it.
func lockReplay(ctx context.Context, db cdc.Querier, name string) (unlock func(), err error) {
	p, ok := db.(connAcquirer)
	if !ok {
		return func() {}, nil
	}
	c, err := p.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("sink %s: replay: %w", name, err)
	}
	var got bool
	if err := c.QueryRow(ctx, sqlReplayLock, name).Scan(&got); err != nil {
		c.Release()
		return nil, fmt.Errorf("sink %s: replay: take the replay lock: %w", name, err)
	}
	if !got {
		c.Release()
		return nil, fmt.Errorf("sink %s: %w; wait for it to end", name, ErrReplayRunning)
	}
	return func() {
		if _, err := c.Exec(context.WithoutCancel(ctx), sqlReplayUnlock, name); err != nil {
			// The lock must not go back into the pool with the connection.
			c.Hijack().Close(context.WithoutCancel(ctx))
			return
		}
		c.Release()
	}, nil
}

// skippedOf returns the ids of evs an operator skipped for the sink.
func skippedOf(ctx context.Context, db cdc.Querier, name string, evs []*Event) (map[string]bool, error) {
	ids := make([]string, len(evs))
	for i, ev := range evs {
		ids[i] = ev.ID
	}
	rows, err := db.Query(ctx, sqlSkippedOf, name, ids)
	if err != nil {
		return nil, fmt.Errorf("sink %s: replay: read the skipped events: %w", name, err)
	}
	skipped := map[string]bool{}
	var id string
	_, err = pgx.ForEachRow(rows, []any{&id}, func() error {
		skipped[id] = true
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("sink %s: replay: read the skipped events: %w", name, err)
	}
	return skipped, nil
}

// replayAttempts bounds the tries of one page before the replay stops with
// an error (what was delivered so far is reported).
const replayAttempts = 5

// replayBackoff spaces the tries of a page: 200 ms, doubling.
var replayBackoff = backoff.Policy{Base: 200 * time.Millisecond, Max: 5 * time.Second}

// Replay re-delivers to d the outbox rows still in the table that req and
// d's match select, with their original ids (the brokers' and endpoints'
// dedupe ids), in created_at order (then id), so in order per aggregate
// among the replayed rows. It reads page by page with short queries and
// never touches the stream: live deliveries go on beside it. A page whose
// delivery fails is retried with backoff; after replayAttempts the replay
// stops and returns how far it got.
func Replay(ctx context.Context, db cdc.Querier, d Destination, req ReplayRequest) (ReplayResult, error) {
	res := ReplayResult{Sink: d.Spec.Name, DryRun: req.DryRun}
	if req.EventType != "" {
		if _, err := path.Match(req.EventType, ""); err != nil {
			return res, fmt.Errorf("sink: --event-type %q is not a valid glob: %w", req.EventType, err)
		}
	}
	if !req.Until.IsZero() && !req.Until.After(req.Since) {
		return res, fmt.Errorf("sink: the replay window is empty: --until %s is not after --since %s", req.Until.Format(time.RFC3339), req.Since.Format(time.RFC3339))
	}
	if !req.DryRun {
		unlock, err := lockReplay(ctx, db, d.Spec.Name)
		if err != nil {
			return res, err
		}
		defer unlock()
	}
	table := req.Table
	if table.Name == "" {
		table = outbox.TableName{Name: outbox.DefaultTable}
	}
	_, err := cdc.ScanOutbox(ctx, db, table, req.Columns, cdc.OutboxRange{Since: req.Since, Until: req.Until, AggregateType: req.AggregateType}, 500,
		func(page []outbox.Event) error {
			var evs []*Event
			for i := range page {
				ev := FromOutbox(&page[i])
				if req.EventType != "" {
					if ok, _ := path.Match(req.EventType, ev.EventType); !ok {
						continue
					}
				}
				if !d.Spec.Match.Selects(ev) {
					continue
				}
				evs = append(evs, ev)
			}
			if !req.IncludeSkipped && len(evs) > 0 {
				skipped, err := skippedOf(ctx, db, d.Spec.Name, evs)
				if err != nil {
					return err
				}
				if len(skipped) > 0 {
					evs = slices.DeleteFunc(evs, func(ev *Event) bool { return skipped[ev.ID] })
					res.Skipped += len(skipped)
				}
			}
			res.Found += len(evs)
			if req.DryRun || len(evs) == 0 {
				return nil
			}
			for attempt := 1; ; attempt++ {
				errs := d.Sink.Deliver(ctx, evs)
				var failed []*Event
				var first error
				for i, err := range errs {
					if err != nil {
						failed = append(failed, evs[i])
						if first == nil {
							first = err
						}
					}
				}
				res.Delivered += len(evs) - len(failed)
				if len(failed) == 0 {
					return nil
				}
				if attempt == replayAttempts {
					return fmt.Errorf("sink %s: %d events not delivered after %d attempts: %w", d.Spec.Name, len(failed), attempt, first)
				}
				evs = failed // again, in their order
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(replayBackoff.Delay(attempt - 1)):
				}
			}
		})
	return res, err
}
