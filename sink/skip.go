package sink

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ParkedEvent is one event parked for a sink, as `relay sinks parked` and
// GET /v1/sinks/{name}/parked show it.
type ParkedEvent struct {
	EventID       string `json:"event_id"`
	TenantID      string `json:"tenant_id"`
	AggregateType string `json:"aggregate_type"`
	AggregateID   string `json:"aggregate_id"`
	EventType     string `json:"event_type"`
	// Reason is why it is parked: the last delivery failure, or why it
	// waits ("queued behind a parked event of its aggregate").
	Reason   string `json:"reason"`
	Attempts int    `json:"attempts"`
	// Head: the first parked event of its aggregate, the one the others
	// of the aggregate wait behind. Only a head is ever attempted.
	Head       bool      `json:"head"`
	ParkedAt   time.Time `json:"parked_at"`
	AgeSeconds float64   `json:"age_seconds"`
	// NextAttemptAt is when the drainer tries a head again; nil for an
	// event held for the operator (until `relay sinks retry`).
	NextAttemptAt *time.Time `json:"next_attempt_at"`
}

// ParkedFilter narrows ListParked.
type ParkedFilter struct {
	// Tenant, when valid, keeps the events of that tenant only (an event
	// without a tenant is then left out).
	Tenant uuid.NullUUID
	// Limit bounds the answer (default DefaultParkedLimit, at most
	// MaxParkedLimit).
	Limit int
}

// Limits of ListParked.
const (
	DefaultParkedLimit = 100
	MaxParkedLimit     = 1000
	// MaxSkipReason bounds the reason of a skip, in characters.
	MaxSkipReason = 1000
)

// Errors of ListParked and Skip a caller can test with errors.Is.
var (
	// ErrNotParked: no event with that id is parked for that sink (or, for
	// a caller scoped to a tenant, none of that tenant's).
	ErrNotParked = errors.New("not parked")
	// ErrInvalid: the request is malformed (no reason, a bad limit).
	ErrInvalid = errors.New("invalid request")
)

// ListParked returns the events parked for the sink, in the order the
// drainer delivers them (commit order, so each aggregate's oldest first).
// It works without a running relay.
func ListParked(ctx context.Context, q Querier, name string, f ParkedFilter) ([]ParkedEvent, error) {
	if f.Limit < 0 || f.Limit > MaxParkedLimit {
		return nil, fmt.Errorf("sink: limit %d: %w: give a limit between 1 and %d", f.Limit, ErrInvalid, MaxParkedLimit)
	}
	if f.Limit == 0 {
		f.Limit = DefaultParkedLimit
	}
	if err := sinkExists(ctx, q, name); err != nil {
		return nil, err
	}
	var tenant *string
	if f.Tenant.Valid {
		s := f.Tenant.UUID.String()
		tenant = &s
	}
	rows, err := q.Query(ctx, sqlListParked, name, tenant, f.Limit)
	if err != nil {
		return nil, fmt.Errorf("sink: list the events parked for %q: %w", name, err)
	}
	out := []ParkedEvent{}
	var p ParkedEvent
	_, err = pgx.ForEachRow(rows, []any{&p.EventID, &p.TenantID, &p.AggregateType, &p.AggregateID, &p.EventType,
		&p.Reason, &p.Attempts, &p.Head, &p.ParkedAt, &p.AgeSeconds, &p.NextAttemptAt}, func() error {
		out = append(out, p)
		p.NextAttemptAt = nil
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("sink: list the events parked for %q: %w", name, err)
	}
	return out, nil
}

func sinkExists(ctx context.Context, q Querier, name string) error {
	var found bool
	if err := q.QueryRow(ctx, sqlSinkExists, name).Scan(&found); err != nil {
		return fmt.Errorf("sink: look up sink %q: %w", name, err)
	}
	if !found {
		return fmt.Errorf("sink %q: %w (see `relay sinks list`)", name, ErrUnknownSink)
	}
	return nil
}

// SkipRequest is one operator's decision to give up on a parked event.
type SkipRequest struct {
	Sink    string
	EventID string
	// Reason says why (required; kept with the skipped event).
	Reason string
	// Actor names who asked: the API token's name, or the CLI's --actor.
	Actor string
	// Tenant, when valid, is the only tenant whose events the caller may
	// skip.
	Tenant uuid.NullUUID
}

// Skipped is a parked event an operator gave up on, as relay_sink_skipped
// keeps it.
type Skipped struct {
	Sink          string    `json:"sink"`
	EventID       string    `json:"event_id"`
	AggregateType string    `json:"aggregate_type"`
	AggregateID   string    `json:"aggregate_id"`
	EventType     string    `json:"event_type"`
	Reason        string    `json:"reason"`
	Attempts      int       `json:"attempts"`
	ParkedAt      time.Time `json:"parked_at"`
	SkippedBy     string    `json:"skipped_by"`
	SkippedRole   string    `json:"skipped_role"`
	SkippedAt     time.Time `json:"skipped_at"`
	SkipReason    string    `json:"skip_reason"`
}

// TxBeginner is what Skip needs: a pool or a connection.
type TxBeginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// skipLockWait bounds how long Skip waits for a drain round of the sink
// that is delivering right now.
const skipLockWait = "10s"

// Skip gives up on one parked event: in one transaction it is deleted from
// relay_sink_parked and kept in relay_sink_skipped with who, when and why.
// The later events of its aggregate are then delivered by the drainer. Skip
// waits for a drain round of the sink in progress, so that an event is not
// skipped while it is being delivered.
func Skip(ctx context.Context, db TxBeginner, req SkipRequest) (Skipped, error) {
	var out Skipped
	req.Reason = strings.TrimSpace(req.Reason)
	switch {
	case req.Reason == "":
		return out, fmt.Errorf("sink: %w: a reason is required: say why this event can never be delivered (it is kept with your name)", ErrInvalid)
	case utf8.RuneCountInString(req.Reason) > MaxSkipReason:
		return out, fmt.Errorf("sink: %w: the reason is longer than %d characters", ErrInvalid, MaxSkipReason)
	case !utf8.ValidString(req.Reason) || strings.ContainsFunc(req.Reason, isControl):
		return out, fmt.Errorf("sink: %w: the reason holds control characters or is not UTF-8; send plain text on one line", ErrInvalid)
	case strings.TrimSpace(req.Actor) == "":
		return out, fmt.Errorf("sink: %w: the actor is empty: every skip records who asked", ErrInvalid)
	case req.EventID == "":
		return out, fmt.Errorf("sink: %w: the event id is empty (see `relay sinks parked %s`)", ErrInvalid, req.Sink)
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return out, fmt.Errorf("sink: skip: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '"+skipLockWait+"'"); err != nil {
		return out, fmt.Errorf("sink: skip: %w", err)
	}
	if _, err := tx.Exec(ctx, sqlSkipLock, req.Sink); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55P03" {
			return out, fmt.Errorf("sink %q: the relay has been delivering its parked events for %s; try again", req.Sink, skipLockWait)
		}
		return out, fmt.Errorf("sink: skip: %w", err)
	}
	if err := sinkExists(ctx, tx, req.Sink); err != nil {
		return out, err
	}
	var tenant string
	err = tx.QueryRow(ctx, sqlSkipFind, req.Sink, req.EventID).Scan(&tenant)
	// Another tenant's event answers as an unknown one does: a scoped
	// caller learns nothing of other tenants' events, not even that they
	// exist.
	notParked := func() error {
		return fmt.Errorf("sink %q: event %q is %w for it (see `relay sinks parked %s`)", req.Sink, req.EventID, ErrNotParked, req.Sink)
	}
	if errors.Is(err, pgx.ErrNoRows) && req.Tenant.Valid {
		return out, notParked()
	}
	if errors.Is(err, pgx.ErrNoRows) {
		var others []string
		if err := tx.QueryRow(ctx, sqlParkedElsewhere, req.EventID).Scan(&others); err != nil {
			return out, fmt.Errorf("sink: skip: %w", err)
		}
		if len(others) > 0 {
			return out, fmt.Errorf("sink %q: event %q is %w for it (it is parked for sink %s; name that sink)", req.Sink, req.EventID, ErrNotParked, strings.Join(others, ", "))
		}
		return out, notParked()
	}
	if err != nil {
		return out, fmt.Errorf("sink: skip: %w", err)
	}
	if req.Tenant.Valid && tenant != req.Tenant.UUID.String() {
		return out, notParked()
	}
	err = tx.QueryRow(ctx, sqlSkip, req.Sink, req.EventID, req.Actor, req.Reason).Scan(&out.Sink, &out.EventID,
		&out.AggregateType, &out.AggregateID, &out.EventType, &out.Reason, &out.Attempts, &out.ParkedAt,
		&out.SkippedBy, &out.SkippedRole, &out.SkippedAt, &out.SkipReason)
	if err != nil {
		return out, fmt.Errorf("sink: skip: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return out, fmt.Errorf("sink: skip: %w", err)
	}
	return out, nil
}

func isControl(r rune) bool { return r < ' ' || r == 0x7f }
