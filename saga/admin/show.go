package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/compensa/compensa/saga"
)

// MaxEvents caps the journal events Show returns (the newest ones); an
// instance that retried for days can have many.
const MaxEvents = 1000

// Instance is an instance as Show reports it: the list item plus what only a
// single instance needs.
type Instance struct {
	Item
	TriggerEventID        uuid.UUID       `json:"trigger_event_id"`
	CorrelationID         uuid.NullUUID   `json:"correlation_id"`
	WorkspaceID           uuid.NullUUID   `json:"workspace_id"`
	Context               json.RawMessage `json:"context"`
	Version               int64           `json:"version"`
	AwaitingCorrelationID uuid.NullUUID   `json:"awaiting_correlation_id"`
	AwaitingUntil         *time.Time      `json:"awaiting_until"`
	CompensationReason    string          `json:"compensation_reason"`
	CompletedAt           *time.Time      `json:"completed_at"`

	lastKind string
	due      bool
}

// Step is one saga_steps row, or a step of the definition that has no row
// yet (Status PENDING, Recorded false).
type Step struct {
	Sequence             int             `json:"sequence"`
	Name                 string          `json:"name"`
	Status               saga.StepStatus `json:"status"`
	Attempts             int             `json:"attempts"`
	CompensationAttempts int             `json:"compensation_attempts"`
	Output               json.RawMessage `json:"output"`
	LastError            string          `json:"last_error"`
	StartedAt            *time.Time      `json:"started_at"`
	CompletedAt          *time.Time      `json:"completed_at"`
	CompensatedAt        *time.Time      `json:"compensated_at"`
	// Recorded is false for a step the definition declares and the instance
	// has not reached.
	Recorded bool `json:"recorded"`
}

// Event is one journal entry.
type Event struct {
	Version   int64           `json:"version"`
	GlobalSeq int64           `json:"global_seq"`
	Kind      saga.EventKind  `json:"kind"`
	Step      *int            `json:"step"`
	Payload   json.RawMessage `json:"payload"`
	CreatedAt time.Time       `json:"created_at"`
}

// Detail is everything Show knows about one instance.
type Detail struct {
	Instance Instance `json:"instance"`
	// Registered reports whether the instance's definition is registered
	// here; Steps then also lists the steps not reached yet.
	Registered bool    `json:"registered"`
	Steps      []Step  `json:"steps"`
	Events     []Event `json:"events"`
	// EventsTruncated: only the newest MaxEvents events are in Events.
	EventsTruncated bool `json:"events_truncated"`
}

// Show returns an instance with its steps and journal. Unknown (or another
// tenant's) → saga.ErrNotFound.
func (a *Admin) Show(ctx context.Context, id uuid.UUID) (Detail, error) {
	tx, err := a.cfg.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return Detail{}, fmt.Errorf("admin: show %s: %w", id, err)
	}
	// Read-only: rollback is how it ends.
	defer tx.Rollback(context.WithoutCancel(ctx))
	inst, err := a.get(ctx, tx, id, false)
	if err != nil {
		return Detail{}, err
	}
	d := Detail{Instance: inst}
	if d.Steps, err = a.steps(ctx, tx, inst); err != nil {
		return Detail{}, err
	}
	if a.cfg.Registry != nil {
		_, d.Registered = a.cfg.Registry.Lookup(inst.SagaName, inst.SagaVersion)
	}
	rows, err := tx.Query(ctx, sqlEvents, id, MaxEvents+1)
	if err != nil {
		return Detail{}, fmt.Errorf("admin: journal of %s: %w", id, err)
	}
	d.Events, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Event, error) {
		var e Event
		var kind string
		err := r.Scan(&e.Version, &e.GlobalSeq, &kind, &e.Step, &e.Payload, &e.CreatedAt)
		e.Kind = saga.EventKind(kind)
		return e, err
	})
	if err != nil {
		return Detail{}, fmt.Errorf("admin: journal of %s: %w", id, err)
	}
	if len(d.Events) > MaxEvents {
		d.Events, d.EventsTruncated = d.Events[1:], true
	}
	return d, nil
}

// get reads one instance, locking its row when lock is set.
func (a *Admin) get(ctx context.Context, q pgx.Tx, id uuid.UUID, lock bool) (Instance, error) {
	if lock {
		if _, err := q.Exec(ctx, sqlLock, id, a.scope); err != nil {
			return Instance{}, fmt.Errorf("admin: lock instance %s: %w", id, err)
		}
	}
	names, versions, known := a.registered()
	row := q.QueryRow(ctx, sqlGetItem, a.thresholds(), names, versions, known, id, a.scope)
	var inst Instance
	var err error
	inst.Item, err = a.scanItem(row, &inst.lastKind, &inst.due,
		&inst.TriggerEventID, &inst.CorrelationID, &inst.WorkspaceID, &inst.Context, &inst.Version,
		&inst.AwaitingCorrelationID, &inst.AwaitingUntil, &inst.CompensationReason, &inst.CompletedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return inst, saga.Errorf(saga.ErrNotFound, "saga instance %s does not exist", id)
	}
	if err != nil {
		return inst, fmt.Errorf("admin: read instance %s: %w", id, err)
	}
	one := []Item{inst.Item}
	if err := a.summarize(ctx, q, one); err != nil {
		return inst, err
	}
	inst.Item = one[0]
	return inst, nil
}

// steps merges the recorded steps with the definition's, so that a timeline
// shows the steps not reached yet too.
func (a *Admin) steps(ctx context.Context, tx pgx.Tx, inst Instance) ([]Step, error) {
	rows, err := tx.Query(ctx, sqlSteps, inst.ID)
	if err != nil {
		return nil, fmt.Errorf("admin: steps of %s: %w", inst.ID, err)
	}
	recorded, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Step, error) {
		var s Step
		var status string
		err := r.Scan(&s.Sequence, &s.Name, &status, &s.Attempts, &s.CompensationAttempts, &s.Output,
			&s.LastError, &s.StartedAt, &s.CompletedAt, &s.CompensatedAt)
		s.Status, s.Recorded = saga.StepStatus(status), true
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("admin: steps of %s: %w", inst.ID, err)
	}
	if a.cfg.Registry == nil {
		return recorded, nil
	}
	def, ok := a.cfg.Registry.Lookup(inst.SagaName, inst.SagaVersion)
	if !ok {
		return recorded, nil
	}
	bySeq := make(map[int]Step, len(recorded))
	for _, s := range recorded {
		bySeq[s.Sequence] = s
	}
	out := make([]Step, 0, max(len(def.Steps), len(recorded)))
	for i, st := range def.Steps {
		if s, ok := bySeq[i]; ok {
			out = append(out, s)
			delete(bySeq, i)
			continue
		}
		out = append(out, Step{Sequence: i, Name: st.Name, Status: saga.StepPending})
	}
	// Rows the definition does not explain (should not happen) are shown,
	// not hidden.
	for _, s := range recorded {
		if _, left := bySeq[s.Sequence]; left {
			out = append(out, s)
		}
	}
	return out, nil
}
