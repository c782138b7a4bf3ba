package pgjournal

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/compensa/compensa/saga"
)

// instanceRow scans instanceCols. The uuids scan as [16]byte and
// pgtype.UUID, the JSON columns as bytes and the status as a string: pgx
// copies those, where uuid.UUID, json.RawMessage and saga.Status would go
// through sql.Scanner (the uuid's text parsed back), json.Unmarshal and
// reflection, for every row of every locking read.
type instanceRow struct {
	inst                                    saga.Instance
	status, pausedFrom                      string
	workspace, correlation, lease, awaiting pgtype.UUID
}

// dest appends the scan targets to d.
func (r *instanceRow) dest(d []any) []any {
	i := &r.inst
	return append(d,
		(*[16]byte)(&i.ID), (*[16]byte)(&i.TenantID), &r.workspace, &i.SagaName, &i.SagaVersion, &r.status,
		&i.CurrentStep, (*[16]byte)(&i.TriggerEventID), &r.correlation, (*[]byte)(&i.Context), &i.Attempt, &i.NextAttemptAt,
		&i.TimeoutAt, &i.LastError, &r.lease, &i.LeaseExpiresAt, &i.Version,
		&r.awaiting, &i.AwaitingUntil, (*[]byte)(&i.Reply), &i.CompensationReason,
		&i.CreatedAt, &i.UpdatedAt, &i.CompletedAt, &i.TraceParent, &i.HeldSince, &r.pausedFrom,
		&i.OpenStep,
	)
}

// instance is the scanned row.
func (r *instanceRow) instance() saga.Instance {
	i := r.inst
	i.Status = saga.Status(r.status)
	i.PausedFrom = saga.Status(r.pausedFrom)
	i.WorkspaceID = nullUUID(r.workspace)
	i.CorrelationID = nullUUID(r.correlation)
	i.LeaseID = nullUUID(r.lease)
	i.AwaitingCorrelationID = nullUUID(r.awaiting)
	return normInstance(i)
}

func nullUUID(u pgtype.UUID) uuid.NullUUID {
	return uuid.NullUUID{UUID: u.Bytes, Valid: u.Valid}
}

// uuidArg passes a nullable uuid as pgx encodes it directly (uuid.NullUUID
// would go through driver.Valuer and its text).
func uuidArg(u uuid.NullUUID) pgtype.UUID {
	return pgtype.UUID{Bytes: u.UUID, Valid: u.Valid}
}

// normInstance puts every time in UTC, as the memory journal keeps them.
func normInstance(i saga.Instance) saga.Instance {
	i.NextAttemptAt = i.NextAttemptAt.UTC()
	i.CreatedAt = i.CreatedAt.UTC()
	i.UpdatedAt = i.UpdatedAt.UTC()
	i.TimeoutAt = utc(i.TimeoutAt)
	i.LeaseExpiresAt = utc(i.LeaseExpiresAt)
	i.AwaitingUntil = utc(i.AwaitingUntil)
	i.CompletedAt = utc(i.CompletedAt)
	i.HeldSince = utc(i.HeldSince)
	return i
}

func utc(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

// stepRow scans stepCols, which are all NULL when a LEFT JOIN found no step.
type stepRow struct {
	sequence                        *int
	name, status, lastError         *string
	attempts, compensationAttempts  *int
	output                          json.RawMessage
	started, completed, compensated *time.Time
}

func (s *stepRow) dest() []any { return s.appendDest(nil) }

// appendDest appends the scan targets to d.
func (s *stepRow) appendDest(d []any) []any {
	return append(d, &s.sequence, &s.name, &s.status, &s.attempts, &s.compensationAttempts,
		(*[]byte)(&s.output), &s.lastError, &s.started, &s.completed, &s.compensated)
}

func (s *stepRow) record() *saga.StepRecord {
	if s.sequence == nil {
		return nil
	}
	r := &saga.StepRecord{
		Sequence:             *s.sequence,
		Name:                 *s.name,
		Status:               saga.StepStatus(*s.status),
		Attempts:             *s.attempts,
		CompensationAttempts: *s.compensationAttempts,
		Output:               s.output,
		StartedAt:            utc(s.started),
		CompletedAt:          utc(s.completed),
		CompensatedAt:        utc(s.compensated),
	}
	if s.lastError != nil {
		r.LastError = *s.lastError
	}
	return r
}

// eventRow scans eventCols, which are NULL (but for the instance id in Load)
// when there is no event.
type eventRow struct {
	instanceID uuid.NullUUID
	version    *int64
	globalSeq  *int64
	kind       *string
	step       *int
	payload    []byte
	createdAt  *time.Time
}

func (e *eventRow) dest() []any {
	return []any{&e.instanceID, &e.version, &e.globalSeq, &e.kind, &e.step, &e.payload, &e.createdAt}
}

// event decodes the row; ok is false when the row holds no event.
func (e *eventRow) event() (ev saga.RecordedEvent, ok bool, err error) {
	if e.version == nil {
		return ev, false, nil
	}
	if err := json.Unmarshal(e.payload, &ev.Event); err != nil {
		return ev, false, fmt.Errorf("event %s v%d: payload: %w", e.instanceID.UUID, *e.version, err)
	}
	// The columns are authoritative over the payload's copy.
	ev.Kind = saga.EventKind(*e.kind)
	ev.Step = -1
	if e.step != nil {
		ev.Step = *e.step
	}
	ev.InstanceID = e.instanceID.UUID
	ev.Version = *e.version
	ev.GlobalSeq = *e.globalSeq
	ev.CreatedAt = e.createdAt.UTC()
	return ev, true, nil
}
