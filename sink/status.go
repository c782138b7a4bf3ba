package sink

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Status is one sink as `relay sinks list` and GET /v1/sinks show it.
type Status struct {
	Name      string `json:"name"`
	Kind      string `json:"kind"`
	State     string `json:"state"`
	Reason    string `json:"reason"`
	Delivered int64  `json:"delivered"`
	// Filtered is how many events the sink's filter rejected (dropped for
	// this sink, never parked).
	Filtered int64 `json:"filtered"`
	Parked   int64 `json:"parked"`
	// OldestParkedSeconds is the age of the oldest parked event; nil when
	// nothing is parked.
	OldestParkedSeconds *float64 `json:"oldest_parked_seconds"`
	// LastReason is the reason of the sink's most recent failed delivery
	// (a refusal of one event included); it stays after the sink recovers.
	LastReason string `json:"last_reason"`
}

// Querier is what List and RequestRetry need: a pool, a connection or a tx.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// ErrUnknownSink is returned for a name no relay has registered.
var ErrUnknownSink = errors.New("no such sink")

// List reads every sink a relay registered, with its parked backlog. It
// works without a running relay.
func List(ctx context.Context, q Querier) ([]Status, error) {
	rows, err := q.Query(ctx, sqlList)
	if err != nil {
		return nil, fmt.Errorf("sink: list sinks: %w", err)
	}
	out := []Status{}
	var s Status
	_, err = pgx.ForEachRow(rows, []any{&s.Name, &s.Kind, &s.State, &s.Reason, &s.Delivered, &s.Filtered, &s.Parked, &s.OldestParkedSeconds, &s.LastReason}, func() error {
		out = append(out, s)
		s.OldestParkedSeconds = nil
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("sink: list sinks: %w", err)
	}
	return out, nil
}

// RequestRetry makes every parked event of the sink due now and asks the
// running relay to probe the sink at once (re-enabling a disabled one). It
// returns how many events are parked.
func RequestRetry(ctx context.Context, q Querier, name string) (int64, error) {
	var found, parked int64
	if err := q.QueryRow(ctx, sqlRequestRetry, name).Scan(&found, &parked); err != nil {
		return 0, fmt.Errorf("sink: retry %q: %w", name, err)
	}
	if found == 0 {
		return 0, fmt.Errorf("sink %q: %w (see `relay sinks list`)", name, ErrUnknownSink)
	}
	return parked, nil
}
