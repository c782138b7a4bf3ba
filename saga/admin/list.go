package admin

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/compensa/compensa/saga"
)

// Limits of a page.
const (
	DefaultLimit = 50
	MaxLimit     = 500
)

// Stuck reasons, as List and Show report them.
const (
	// StuckFailed: a compensation exhausted its attempts; the instance waits
	// for a person.
	StuckFailed = "failed"
	// StuckOverdue: RUNNING or COMPENSATING, next attempt overdue by more
	// than StuckAfter and no live lease: no runner is picking it up.
	StuckOverdue = "overdue"
	// StuckUnregistered: no definition of the instance's (saga, version) is
	// registered here, so no runner here can advance it.
	StuckUnregistered = "unregistered_version"
)

// Filter selects instances for List. Zero fields select everything.
type Filter struct {
	// Status, when set, must be a valid saga.Status.
	Status saga.Status
	// Saga is a saga name.
	Saga string
	// Tenant restricts to one tenant (on top of any ForTenant scope).
	Tenant uuid.NullUUID
	// Stuck keeps only stuck instances.
	Stuck bool
	// Limit is the page size: 0 means DefaultLimit; at most MaxLimit.
	Limit int
	// Cursor is Page.NextCursor of the previous page, "" for the first.
	Cursor string
}

// Item is one instance as List shows it.
type Item struct {
	ID          uuid.UUID   `json:"id"`
	TenantID    uuid.UUID   `json:"tenant_id"`
	SagaName    string      `json:"saga_name"`
	SagaVersion int         `json:"saga_version"`
	Status      saga.Status `json:"status"`
	CurrentStep int         `json:"current_step"`
	// CurrentStepName is "" when the definition is not registered here.
	CurrentStepName string     `json:"current_step_name"`
	Attempt         int        `json:"attempt"`
	NextAttemptAt   time.Time  `json:"next_attempt_at"`
	TimeoutAt       *time.Time `json:"timeout_at"`
	LastError       string     `json:"last_error"`
	// StuckReason is "" when the instance is not stuck, else one of
	// StuckFailed, StuckOverdue, StuckUnregistered; StuckDetail says it in
	// words, with what to do.
	StuckReason    string     `json:"stuck_reason"`
	StuckDetail    string     `json:"stuck_detail"`
	LeaseExpiresAt *time.Time `json:"lease_expires_at"`
	CreatedAt      time.Time  `json:"created_at"`
	UpdatedAt      time.Time  `json:"updated_at"`

	leaseLive bool
}

// Page is one page of List. NextCursor is empty on the last page.
type Page struct {
	Items      []Item `json:"items"`
	NextCursor string `json:"next_cursor"`
}

// MarshalJSON writes every key, always: items is [] when empty and
// next_cursor null on the last page, as the README documents.
func (p Page) MarshalJSON() ([]byte, error) {
	items := p.Items
	if items == nil {
		items = []Item{}
	}
	var next *string
	if p.NextCursor != "" {
		next = &p.NextCursor
	}
	return json.Marshal(struct {
		Items      []Item  `json:"items"`
		NextCursor *string `json:"next_cursor"`
	}{items, next})
}

func (f *Filter) validate() error {
	if f.Status != "" {
		f.Status = saga.Status(strings.ToUpper(string(f.Status)))
		if !f.Status.Valid() {
			return saga.Errorf(saga.ErrInvalid, "status %q is not one of RUNNING, COMPLETED, COMPENSATING, COMPENSATED, FAILED, TIMED_OUT", f.Status)
		}
	}
	if f.Limit < 0 || f.Limit > MaxLimit {
		return saga.Errorf(saga.ErrInvalid, "limit must be between 1 and %d, got %d", MaxLimit, f.Limit)
	}
	if f.Limit == 0 {
		f.Limit = DefaultLimit
	}
	return nil
}

// fingerprint binds a cursor to the filters it was issued for: a cursor
// reused with other filters would silently page through the wrong rows.
func (f Filter) fingerprint(scope uuid.NullUUID) uint32 {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%v\x00%v\x00%t", f.Status, f.Saga, f.Tenant, scope, f.Stuck)
	return binary.BigEndian.Uint32(h.Sum(nil))
}

// cursor is the keyset position: the last row of the previous page.
type cursor struct {
	CreatedAt int64     `json:"t"` // unix microseconds: timestamptz's precision
	ID        uuid.UUID `json:"i"`
	Filter    uint32    `json:"f"`
}

func encodeCursor(c cursor) string {
	b, _ := json.Marshal(c)
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeCursor(s string, fp uint32) (cursor, error) {
	var c cursor
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err == nil {
		err = json.Unmarshal(b, &c)
	}
	if err != nil || c.ID == uuid.Nil {
		return c, saga.Errorf(saga.ErrInvalid, "cursor is malformed: pass next_cursor from the previous page unchanged")
	}
	if c.Filter != fp {
		return c, saga.Errorf(saga.ErrInvalid, "cursor was issued for other filters: keep the filters of the first page, or start again without a cursor")
	}
	return c, nil
}

// List returns one page of instances, newest first.
func (a *Admin) List(ctx context.Context, f Filter) (Page, error) {
	if err := f.validate(); err != nil {
		return Page{}, err
	}
	fp := f.fingerprint(a.scope)
	names, versions, known := a.registered()
	args := []any{a.cfg.StuckAfter, names, versions, known}
	var q strings.Builder
	q.WriteString(sqlListHead)
	add := func(fragment string, vals ...any) {
		nums := make([]any, len(vals))
		for i, v := range vals {
			args = append(args, v)
			nums[i] = len(args)
		}
		fmt.Fprintf(&q, fragment, nums...)
	}
	if f.Status != "" {
		add(sqlWhereStatus, string(f.Status))
	}
	if f.Saga != "" {
		add(sqlWhereSaga, f.Saga)
	}
	if f.Tenant.Valid {
		add(sqlWhereTenant, f.Tenant.UUID)
	}
	if a.scope.Valid {
		add(sqlWhereTenant, a.scope.UUID)
	}
	if f.Cursor != "" {
		c, err := decodeCursor(f.Cursor, fp)
		if err != nil {
			return Page{}, err
		}
		add(sqlWhereBefore, time.UnixMicro(c.CreatedAt), c.ID)
	}
	if f.Stuck {
		q.WriteString(sqlWhereMaybeStuck)
		q.WriteString(sqlListStuckOnly)
	} else {
		q.WriteString(sqlListAll)
	}
	// One row more than asked tells whether a next page exists.
	add(sqlListTail, f.Limit+1)

	rows, err := a.cfg.Pool.Query(ctx, q.String(), args...)
	if err != nil {
		return Page{}, fmt.Errorf("admin: list instances: %w", err)
	}
	items, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Item, error) {
		return a.scanItem(r)
	})
	if err != nil {
		return Page{}, fmt.Errorf("admin: list instances: %w", err)
	}
	page := Page{Items: items}
	if len(items) > f.Limit {
		page.Items = items[:f.Limit]
		last := page.Items[f.Limit-1]
		page.NextCursor = encodeCursor(cursor{CreatedAt: last.CreatedAt.UnixMicro(), ID: last.ID, Filter: fp})
	}
	return page, nil
}

// scanItem reads sqlItemColumns.
func (a *Admin) scanItem(r pgx.Row, extra ...any) (Item, error) {
	var it Item
	var status string
	var dbNow time.Time
	dest := []any{&it.ID, &it.TenantID, &it.SagaName, &it.SagaVersion, &status, &it.CurrentStep, &it.Attempt,
		&it.NextAttemptAt, &it.TimeoutAt, &it.LastError, &it.LeaseExpiresAt, &it.leaseLive,
		&it.CreatedAt, &it.UpdatedAt, &dbNow, &it.StuckReason}
	if err := r.Scan(append(dest, extra...)...); err != nil {
		return it, err
	}
	it.Status = saga.Status(status)
	it.CurrentStepName = a.stepName(it.SagaName, it.SagaVersion, it.CurrentStep)
	it.StuckDetail = a.stuckDetail(it, dbNow)
	return it, nil
}

// stuckDetail says why an instance is stuck and what a person can do.
func (a *Admin) stuckDetail(it Item, now time.Time) string {
	switch it.StuckReason {
	case StuckFailed:
		return fmt.Sprintf("the compensation of step %s exhausted its attempts; fix the cause, then retry: it re-runs that compensation and then the ones below it", a.describeStep(it))
	case StuckOverdue:
		return fmt.Sprintf("step %s was due at %s (%s ago, more than the stuck-after %s) and no runner holds a lease; check that a relay is running, then retry to run it now",
			a.describeStep(it), it.NextAttemptAt.UTC().Format(time.RFC3339), now.Sub(it.NextAttemptAt).Round(time.Second), a.cfg.StuckAfter)
	case StuckUnregistered:
		return fmt.Sprintf("no definition of saga %s version %d is registered in this relay, so no runner here can advance it; deploy a relay that registers that version", it.SagaName, it.SagaVersion)
	}
	return ""
}

func (a *Admin) describeStep(it Item) string {
	if it.CurrentStepName != "" {
		return fmt.Sprintf("%d (%s)", it.CurrentStep, it.CurrentStepName)
	}
	return fmt.Sprint(it.CurrentStep)
}
