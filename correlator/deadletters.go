package correlator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/compensa/compensa/cdc"
	"github.com/compensa/compensa/outbox"
)

// ErrDeadLetterNotFound is returned for an unknown dead-letter id.
var ErrDeadLetterNotFound = errors.New("dead letter not found")

// ErrStillPoison is returned by Retry when the event is still unusable.
var ErrStillPoison = errors.New("event is still unusable")

// DeadLetter is one parked event.
type DeadLetter struct {
	ID         int64           `json:"id"`
	EventID    string          `json:"event_id"`
	EventType  string          `json:"event_type"`
	LSN        string          `json:"lsn"`
	Reason     string          `json:"reason"`
	Raw        json.RawMessage `json:"raw"`
	ParkedAt   time.Time       `json:"parked_at"`
	RetriedAt  *time.Time      `json:"retried_at,omitempty"`
	RetryCount int             `json:"retry_count"`
	// RedrivenFrom says which version of the event the last retry used:
	// SourceStored or SourceOutbox. Empty in lists.
	RedrivenFrom string `json:"-"`
}

// Which version of a parked event a retry re-drives.
const (
	// SourceStored is the whole decoded event stored when it was parked.
	SourceStored = "the event stored when it was parked"
	// SourceOutbox is the outbox row with the event's id as it is now.
	SourceOutbox = "the current outbox row"
	// SourceStoredRowGone is SourceStored when the current row was asked
	// for but the outbox no longer holds it.
	SourceStoredRowGone = "the event stored when it was parked (the outbox row is gone)"
)

// OutboxReader reads an event's current outbox row by its id (as text); ok
// is false when the row no longer exists. cdc.ReadEvent, bound to a table
// and a column map, is one.
type OutboxReader func(ctx context.Context, q cdc.Querier, rawID string) (ev outbox.Event, ok bool, err error)

// DefaultDeadLetterLimit and MaxDeadLetterLimit bound one ListDeadLetters.
const (
	DefaultDeadLetterLimit = 100
	MaxDeadLetterLimit     = 1000
)

// ListDeadLetters returns parked events, newest first. pending limits the list
// to those not yet re-driven. limit is at most MaxDeadLetterLimit; 0 means
// DefaultDeadLetterLimit.
func (c *Correlator) ListDeadLetters(ctx context.Context, pending bool, limit int) ([]DeadLetter, error) {
	if limit <= 0 {
		limit = DefaultDeadLetterLimit
	}
	limit = min(limit, MaxDeadLetterLimit)
	rows, err := c.pool.Query(ctx, `
		SELECT id, event_id, event_type, lsn::text, reason, raw, parked_at, retried_at, retry_count
		FROM relay_dead_letters
		WHERE NOT $1 OR retried_at IS NULL
		ORDER BY id DESC LIMIT $2`, pending, limit)
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeadLetter, error) {
		var d DeadLetter
		err := r.Scan(&d.ID, &d.EventID, &d.EventType, &d.LSN, &d.Reason, &d.Raw, &d.ParkedAt, &d.RetriedAt, &d.RetryCount)
		return d, err
	})
}

// RetryDeadLetter re-drives a parked event through routing and validation, as
// if it had just been streamed: once the cause is fixed (a new saga version
// that accepts the payload, say) it starts its sagas or is delivered as a
// reply. A still unusable event stays parked (ErrStillPoison, with the new
// reason) and its retry count goes up. Starting twice is impossible: the
// unique index absorbs a retry of an event that did start.
func (c *Correlator) RetryDeadLetter(ctx context.Context, id int64) (DeadLetter, error) {
	return c.retryDeadLetter(ctx, id, nil)
}

// RetryDeadLetterFromOutbox is RetryDeadLetter on the event's current outbox
// row, read with read, when the row still exists (a producer corrected it in
// place); otherwise on the stored event. DeadLetter.RedrivenFrom says which.
func (c *Correlator) RetryDeadLetterFromOutbox(ctx context.Context, id int64, read OutboxReader) (DeadLetter, error) {
	return c.retryDeadLetter(ctx, id, read)
}

func (c *Correlator) retryDeadLetter(ctx context.Context, id int64, read OutboxReader) (DeadLetter, error) {
	tx, err := c.pool.Begin(ctx)
	if err != nil {
		return DeadLetter{}, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	var d DeadLetter
	err = tx.QueryRow(ctx, `
		SELECT id, event_id, event_type, lsn::text, reason, raw, parked_at, retried_at, retry_count
		FROM relay_dead_letters WHERE id = $1 FOR UPDATE`, id).
		Scan(&d.ID, &d.EventID, &d.EventType, &d.LSN, &d.Reason, &d.Raw, &d.ParkedAt, &d.RetriedAt, &d.RetryCount)
	if errors.Is(err, pgx.ErrNoRows) {
		return d, fmt.Errorf("%w: no dead letter with id %d (see `relay deadletters list`)", ErrDeadLetterNotFound, id)
	}
	if err != nil {
		return d, err
	}
	ev, reason := eventFromRaw(d)
	d.RedrivenFrom = SourceStored
	if read != nil && !ev.Message { // a message has no outbox row
		cur, ok, err := read(ctx, tx, d.EventID)
		if err != nil {
			return d, err
		}
		if ok {
			ev, reason, d.RedrivenFrom = cur, cur.Poison, SourceOutbox
		} else {
			d.RedrivenFrom = SourceStoredRowGone
		}
	}
	var p plan
	if reason != "" {
		ev.Poison = reason
	}
	p.add(c.routes, &ev)
	if len(p.deadReason) > 0 {
		reason := p.deadReason[0]
		if _, err := tx.Exec(ctx, `UPDATE relay_dead_letters SET retry_count = retry_count + 1, reason = $2 WHERE id = $1`, id, reason); err != nil {
			return d, err
		}
		if err := tx.Commit(ctx); err != nil {
			return d, err
		}
		d.RetryCount++
		d.Reason = reason
		return d, fmt.Errorf("%w: %s", ErrStillPoison, reason)
	}
	var out outcome
	if !p.empty() {
		if err := c.applyEffects(ctx, tx, cdc.Batch{}, &p, time.Time{}, false, &out); err != nil {
			return d, err
		}
	}
	if err := tx.QueryRow(ctx, `UPDATE relay_dead_letters SET retried_at = now(), retry_count = retry_count + 1
		WHERE id = $1 RETURNING retried_at, retry_count`, id).Scan(&d.RetriedAt, &d.RetryCount); err != nil {
		return d, err
	}
	if err := tx.Commit(ctx); err != nil {
		return d, err
	}
	c.started.Add(uint64(out.started))
	c.delivered.Add(uint64(out.delivered))
	if out.started > 0 || out.delivered > 0 {
		if c.cfg.Wake != nil {
			c.cfg.Wake()
		}
	}
	return d, nil
}

// eventFromRaw rebuilds an event from a parked raw row (keyed by our field
// names). It returns a reason when the row itself cannot be read.
func eventFromRaw(d DeadLetter) (outbox.Event, string) {
	var raw map[string]any
	if err := json.Unmarshal(d.Raw, &raw); err != nil {
		return outbox.Event{}, "raw row is not a JSON object"
	}
	if raw["source"] == "message" {
		return eventFromMessageRaw(d, raw)
	}
	str := func(k string) string {
		switch v := raw[k].(type) {
		case string:
			return v
		case nil:
			return ""
		default:
			b, _ := json.Marshal(v)
			return string(b)
		}
	}
	ev := outbox.Event{
		RawID: str("id"), EventType: str("event_type"), AggregateType: str("aggregate_type"),
		AggregateID: str("aggregate_id"), Raw: raw,
	}
	if ev.EventType == "" {
		ev.EventType = d.EventType
	}
	if ev.RawID == "" {
		ev.RawID = d.EventID
	}
	if ev.RawID != "" {
		ev.ID = outbox.EventIDFromText(ev.RawID)
	}
	if t := str("tenant_id"); t != "" {
		u, err := uuid.Parse(t)
		if err != nil {
			return ev, "tenant_id " + strconv.Quote(t) + " is not a UUID"
		}
		ev.TenantID = u
	}
	for _, f := range []struct {
		key string
		dst *uuid.NullUUID
	}{{"correlation_id", &ev.CorrelationID}, {"causation_id", &ev.CausationID}} {
		if s := str(f.key); s != "" {
			u, err := uuid.Parse(s)
			if err != nil {
				return ev, f.key + " " + strconv.Quote(s) + " is not a UUID"
			}
			*f.dst = uuid.NullUUID{UUID: u, Valid: true}
		}
	}
	switch v := raw["payload"].(type) {
	case string:
		ev.Payload = json.RawMessage(v)
	case nil:
	default:
		ev.Payload, _ = json.Marshal(v)
	}
	if s := str("created_at"); s != "" {
		ev.CreatedAt, _ = time.Parse(time.RFC3339Nano, s)
	}
	switch v := raw["headers"].(type) {
	case string:
		ev.Headers = json.RawMessage(v)
	case map[string]any:
		ev.Headers, _ = json.Marshal(v)
	}
	return ev, ""
}

// eventFromMessageRaw rebuilds a refused logical decoding message from its
// dead letter (cdc keeps the message as written): a non-transactional one
// stays refused, whatever it holds, since its transaction may have rolled
// back; other content is decoded again, under the id it was parked with.
func eventFromMessageRaw(d DeadLetter, raw map[string]any) (outbox.Event, string) {
	content, _ := raw["content"].(string)
	ev := outbox.EventFromMessage([]byte(content))
	ev.Message, ev.Raw = true, raw
	if ev.ID == uuid.Nil && d.EventID != "" {
		ev.RawID, ev.ID = d.EventID, outbox.EventIDFromText(d.EventID)
	}
	if ev.EventType == "" {
		ev.EventType = d.EventType
	}
	// Parking keeps raw values as text.
	if tx := raw["transactional"]; tx != true && tx != "true" {
		return ev, "a non-transactional message is never an outbox event: its transaction may have rolled back"
	}
	return ev, ev.Poison
}

// DeadLetterFilter selects the dead letters QueryDeadLetters returns.
type DeadLetterFilter struct {
	// Pending keeps those not yet re-driven.
	Pending bool
	// Limit is at most MaxDeadLetterLimit; 0 means DefaultDeadLetterLimit.
	Limit int
	// Tenant, when valid, keeps the dead letters whose stored event names
	// that tenant. A row whose tenant cannot be read (not a UUID, a message
	// that is not JSON) belongs to no tenant and is left out.
	Tenant uuid.NullUUID
}

// QueryDeadLetters returns dead letters, newest first, without a
// correlator: it reads relay_dead_letters through q (the monitor's pool).
func QueryDeadLetters(ctx context.Context, q cdc.Querier, f DeadLetterFilter) ([]DeadLetter, error) {
	if f.Limit <= 0 {
		f.Limit = DefaultDeadLetterLimit
	}
	f.Limit = min(f.Limit, MaxDeadLetterLimit)
	if !f.Tenant.Valid {
		rows, err := q.Query(ctx, sqlListDeadLetters+` ORDER BY id DESC LIMIT $2`, f.Pending, f.Limit)
		if err != nil {
			return nil, fmt.Errorf("list dead letters: %w", err)
		}
		return pgx.CollectRows(rows, scanDeadLetter)
	}
	// Table rows are narrowed by SQL; a message keeps its tenant inside
	// its content, which is decoded here as a retry would decode it.
	rows, err := q.Query(ctx, sqlListDeadLetters+` AND (raw->>'source' = 'message' OR raw->>'tenant_id' = $2)
		ORDER BY id DESC`, f.Pending, f.Tenant.UUID.String())
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	defer rows.Close()
	out := []DeadLetter{}
	for rows.Next() && len(out) < f.Limit {
		d, err := scanDeadLetter(rows)
		if err != nil {
			return nil, fmt.Errorf("list dead letters: %w", err)
		}
		if tenantOf(d) == f.Tenant.UUID {
			out = append(out, d)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	return out, nil
}

const sqlListDeadLetters = `
	SELECT id, event_id, event_type, lsn::text, reason, raw, parked_at, retried_at, retry_count
	FROM relay_dead_letters
	WHERE (NOT $1 OR retried_at IS NULL)`

func scanDeadLetter(r pgx.CollectableRow) (DeadLetter, error) {
	var d DeadLetter
	err := r.Scan(&d.ID, &d.EventID, &d.EventType, &d.LSN, &d.Reason, &d.Raw, &d.ParkedAt, &d.RetriedAt, &d.RetryCount)
	return d, err
}

// tenantOf is the tenant a dead letter's stored event names; uuid.Nil when
// it names none or one that cannot be read.
func tenantOf(d DeadLetter) uuid.UUID {
	var raw map[string]any
	if json.Unmarshal(d.Raw, &raw) != nil {
		return uuid.Nil
	}
	if raw["source"] == "message" {
		content, _ := raw["content"].(string)
		return outbox.EventFromMessage([]byte(content)).TenantID
	}
	s, _ := raw["tenant_id"].(string)
	u, err := uuid.Parse(s)
	if err != nil {
		return uuid.Nil
	}
	return u
}
