package sink

import (
	"context"
	"fmt"
	"path"
	"time"

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
