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
	// StuckHeld: RUNNING or COMPENSATING, and its step (or compensation)
	// has failed for longer than HoldAfter with an error that is not the
	// step's answer (a missing privilege or table, a connection failure,
	// a participant not listening): the runner keeps retrying and never
	// compensates on its own; someone must fix the cause, or cancel.
	StuckHeld = "held"
)

// Filter selects instances for List. Zero fields select everything.
type Filter struct {
	// Status, when set, must be a valid saga.Status.
	Status saga.Status
	// Saga is a saga name.
	Saga string
	// Tenant restricts to one tenant (on top of any ForTenant scope).
	Tenant uuid.NullUUID
	// Version is a saga version; 0 means any.
	Version int
	// Step is the name of the step the instance stands at (current_step),
	// by the registered definition or, failing that, by its step record.
	Step string
	// ErrorContains keeps instances whose last error contains this text
	// (case-insensitive).
	ErrorContains string
	// CreatedAfter and CreatedBefore bound created_at (exclusive); zero
	// means unbounded.
	CreatedAfter, CreatedBefore time.Time
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
	// StuckFailed, StuckHeld, StuckOverdue, StuckUnregistered; StuckDetail says it in
	// words, with what to do.
	StuckReason    string     `json:"stuck_reason"`
	StuckDetail    string     `json:"stuck_detail"`
	LeaseExpiresAt *time.Time `json:"lease_expires_at"`
	CreatedAt      time.Time  `json:"created_at"`
	UpdatedAt      time.Time  `json:"updated_at"`
	// StepSummary says where the instance stands or how it ended, for a
	// person: the step's name while RUNNING ("score_brief", "score_brief ·
	// waiting for a reply"), "compensating score_brief", "completed 4/4",
	// "compensated after score_brief", "timed out after score_brief",
	// "compensation of score_brief failed".
	StepSummary string `json:"step_summary"`
	// Reason is why a FAILED, COMPENSATING, COMPENSATED or TIMED_OUT
	// instance is where it is (the compensation's cause, else the last
	// error), or the last error of a RUNNING one; uncut.
	Reason string `json:"reason"`
	// AwaitingReply: a step waits for a reply event.
	AwaitingReply bool `json:"awaiting_reply"`
	// HistoryDeletedAt is set on a tombstone: retention deleted the
	// instance's steps, journal and context at that time and kept the row
	// (ids, status, times) so that its trigger never starts it again.
	HistoryDeletedAt *time.Time `json:"history_deleted_at"`
	// HeldSince is when the current run of failures that hold the
	// instance began (see StuckHeld); nil when it is not held.
	HeldSince *time.Time `json:"held_since"`

	leaseLive          bool
	compensationReason string
}

// Terminal reports whether the instance has ended: it has no next attempt.
func (it Item) Terminal() bool {
	switch it.Status {
	case saga.StatusCompleted, saga.StatusCompensated, saga.StatusTimedOut:
		return true
	}
	return false
}

// Page is one page of List. NextCursor is empty on the last page.
type Page struct {
	Items      []Item `json:"items"`
	NextCursor string `json:"next_cursor"`
}

// MarshalJSON writes every key, always: items is [] when empty and
// next_cursor null on the last page, as docs/http-api.md documents.
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

// Check says whether f is well formed, as List would, without a database:
// its status, version, time range, limit and the form of its cursor (not
// whether the cursor was issued for these filters). A CLI calls it before it
// connects, so that a bad flag value is a usage error.
func (f Filter) Check() error {
	if err := f.validate(); err != nil {
		return err
	}
	if f.Cursor != "" {
		if _, err := parseCursor(f.Cursor); err != nil {
			return err
		}
	}
	return nil
}

func (f *Filter) validate() error {
	if f.Status != "" {
		f.Status = saga.Status(strings.ToUpper(string(f.Status)))
		if !f.Status.Valid() {
			return saga.Errorf(saga.ErrInvalid, "status %q is not one of RUNNING, COMPLETED, COMPENSATING, COMPENSATED, FAILED, TIMED_OUT", f.Status)
		}
	}
	if f.Version < 0 {
		return saga.Errorf(saga.ErrInvalid, "version must be a positive integer, got %d", f.Version)
	}
	if !f.CreatedAfter.IsZero() && !f.CreatedBefore.IsZero() && !f.CreatedAfter.Before(f.CreatedBefore) {
		return saga.Errorf(saga.ErrInvalid, "created_after (%s) must be before created_before (%s)", f.CreatedAfter.Format(time.RFC3339), f.CreatedBefore.Format(time.RFC3339))
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
	fmt.Fprintf(h, "%s\x00%s\x00%v\x00%v\x00%t\x00%d\x00%s\x00%s\x00%d\x00%d", f.Status, f.Saga, f.Tenant, scope, f.Stuck,
		f.Version, f.Step, f.ErrorContains, f.CreatedAfter.UnixMicro(), f.CreatedBefore.UnixMicro())
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

// parseCursor reads a cursor's form.
func parseCursor(s string) (cursor, error) {
	var c cursor
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err == nil {
		err = json.Unmarshal(b, &c)
	}
	if err != nil || c.ID == uuid.Nil {
		return c, saga.Errorf(saga.ErrInvalid, "cursor is malformed: pass next_cursor from the previous page unchanged")
	}
	return c, nil
}

func decodeCursor(s string, fp uint32) (cursor, error) {
	c, err := parseCursor(s)
	if err != nil {
		return c, err
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
	q := a.selection(f)
	if f.Cursor != "" {
		c, err := decodeCursor(f.Cursor, fp)
		if err != nil {
			return Page{}, err
		}
		q.add(sqlWhereBefore, time.UnixMicro(c.CreatedAt), c.ID)
	}
	q.close(f)
	// One row more than asked tells whether a next page exists.
	q.add(sqlListTail, f.Limit+1)

	rows, err := a.cfg.Pool.Query(ctx, q.sql.String(), q.args...)
	if err != nil {
		return Page{}, fmt.Errorf("admin: list instances: %w", err)
	}
	items, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Item, error) {
		return a.scanItem(r)
	})
	if err != nil {
		return Page{}, fmt.Errorf("admin: list instances: %w", err)
	}
	if err := a.summarize(ctx, nil, items); err != nil {
		return Page{}, err
	}
	page := Page{Items: items}
	if len(items) > f.Limit {
		page.Items = items[:f.Limit]
		last := page.Items[f.Limit-1]
		page.NextCursor = encodeCursor(cursor{CreatedAt: last.CreatedAt.UnixMicro(), ID: last.ID, Filter: fp})
	}
	return page, nil
}

// query is a statement being assembled from the constant fragments of
// sql.go; every value is a bind parameter.
type query struct {
	sql  strings.Builder
	args []any
}

// add appends a fragment whose %d verbs take the next bind parameters.
func (q *query) add(fragment string, vals ...any) {
	nums := make([]any, len(vals))
	for i, v := range vals {
		q.args = append(q.args, v)
		nums[i] = len(q.args)
	}
	fmt.Fprintf(&q.sql, fragment, nums...)
}

// selection starts the statement that selects the instances f (and the
// scope) match: sqlListHead and every filter's where clause. close ends the
// inner query; the caller adds its own ordering.
func (a *Admin) selection(f Filter) *query {
	names, versions, known := a.registered()
	q := &query{args: []any{a.thresholds(), names, versions, known}}
	q.sql.WriteString(sqlListHead)
	if f.Status != "" {
		q.add(sqlWhereStatus, string(f.Status))
	}
	if f.Saga != "" {
		q.add(sqlWhereSaga, f.Saga)
	}
	if f.Version != 0 {
		q.add(sqlWhereVersion, f.Version)
	}
	if f.Step != "" {
		sn, sv, seq := a.stepsNamed(f.Step)
		q.add(sqlWhereStep, sn, sv, seq, f.Step)
	}
	if f.ErrorContains != "" {
		q.add(sqlWhereErrorContains, f.ErrorContains)
	}
	if !f.CreatedAfter.IsZero() {
		q.add(sqlWhereCreatedAfter, f.CreatedAfter)
	}
	if !f.CreatedBefore.IsZero() {
		q.add(sqlWhereCreatedBefore, f.CreatedBefore)
	}
	if f.Tenant.Valid {
		q.add(sqlWhereTenant, f.Tenant.UUID)
	}
	if a.scope.Valid {
		q.add(sqlWhereTenant, a.scope.UUID)
	}
	return q
}

// close ends the inner query of selection, keeping only stuck rows when f
// asks for them.
func (q *query) close(f Filter) {
	if f.Stuck {
		q.sql.WriteString(sqlWhereMaybeStuck)
		q.sql.WriteString(sqlListStuckOnly)
	} else {
		q.sql.WriteString(sqlListAll)
	}
}

// stepsNamed lists the registered (saga, version, step index) triples whose
// step is called name, as parallel arrays for SQL.
func (a *Admin) stepsNamed(name string) (sagas []string, versions, seqs []int32) {
	sagas, versions, seqs = []string{}, []int32{}, []int32{}
	if a.cfg.Registry == nil {
		return
	}
	for _, d := range a.cfg.Registry.Definitions() {
		for i, st := range d.Steps {
			if st.Name == name {
				sagas, versions, seqs = append(sagas, d.Name), append(versions, int32(d.Version)), append(seqs, int32(i))
			}
		}
	}
	return
}

// scanItem reads sqlItemColumns.
func (a *Admin) scanItem(r pgx.Row, extra ...any) (Item, error) {
	var it Item
	var status string
	var dbNow time.Time
	dest := []any{&it.ID, &it.TenantID, &it.SagaName, &it.SagaVersion, &status, &it.CurrentStep, &it.Attempt,
		&it.NextAttemptAt, &it.TimeoutAt, &it.LastError, &it.LeaseExpiresAt, &it.leaseLive,
		&it.CreatedAt, &it.UpdatedAt, &dbNow, &it.StuckReason, &it.compensationReason, &it.AwaitingReply,
		&it.HistoryDeletedAt, &it.HeldSince}
	if err := r.Scan(append(dest, extra...)...); err != nil {
		return it, err
	}
	it.Status = saga.Status(status)
	it.CurrentStepName = a.stepName(it.SagaName, it.SagaVersion, it.CurrentStep)
	it.StuckDetail = a.stuckDetail(it, dbNow)
	it.Reason = it.LastError
	switch it.Status {
	case saga.StatusCompensating, saga.StatusCompensated, saga.StatusTimedOut:
		if it.compensationReason != "" {
			it.Reason = it.compensationReason
		}
	case saga.StatusFailed:
		if it.Reason == "" {
			it.Reason = it.compensationReason
		}
	}
	return it, nil
}

// summarize fills StepSummary for items read by scanItem: one query for all
// of them (the steps they recorded, where their compensation started).
func (a *Admin) summarize(ctx context.Context, db pgx.Tx, items []Item) error {
	if len(items) == 0 {
		return nil
	}
	ids := make([]uuid.UUID, len(items))
	for i := range items {
		ids[i] = items[i].ID
	}
	var rows pgx.Rows
	var err error
	if db != nil {
		rows, err = db.Query(ctx, sqlItemEnds, ids)
	} else {
		rows, err = a.cfg.Pool.Query(ctx, sqlItemEnds, ids)
	}
	if err != nil {
		return fmt.Errorf("admin: read how instances ended: %w", err)
	}
	type end struct {
		steps, compStep       int
		compName, currentName string
	}
	ends := make(map[uuid.UUID]end, len(items))
	var id uuid.UUID
	var e end
	if _, err := pgx.ForEachRow(rows, []any{&id, &e.steps, &e.compStep, &e.compName, &e.currentName}, func() error {
		ends[id] = e
		return nil
	}); err != nil {
		return fmt.Errorf("admin: read how instances ended: %w", err)
	}
	for i := range items {
		it := &items[i]
		e := ends[it.ID]
		named := func(seq int, recorded string) string {
			if n := a.stepName(it.SagaName, it.SagaVersion, seq); n != "" {
				return n
			}
			if recorded != "" {
				return recorded
			}
			return fmt.Sprintf("step %d", seq)
		}
		current := named(it.CurrentStep, e.currentName)
		if it.HistoryDeletedAt != nil {
			it.StepSummary = strings.ToLower(string(it.Status)) + " · history deleted"
			continue
		}
		after := ""
		if e.compStep >= 0 {
			after = " after " + named(e.compStep, e.compName)
		}
		switch it.Status {
		case saga.StatusCompleted:
			n := e.steps
			if a.cfg.Registry != nil {
				if d, ok := a.cfg.Registry.Lookup(it.SagaName, it.SagaVersion); ok {
					n = len(d.Steps)
				}
			}
			it.StepSummary = fmt.Sprintf("completed %d/%d", n, n)
		case saga.StatusCompensated:
			it.StepSummary = "compensated" + after
		case saga.StatusTimedOut:
			it.StepSummary = "timed out" + after
		case saga.StatusFailed:
			it.StepSummary = "compensation of " + current + " failed"
		case saga.StatusCompensating:
			it.StepSummary = "compensating " + current
		default:
			it.StepSummary = current
			if it.AwaitingReply {
				it.StepSummary += " · waiting for a reply"
			}
		}
	}
	return nil
}

// stuckDetail says why an instance is stuck and what a person can do.
func (a *Admin) stuckDetail(it Item, now time.Time) string {
	switch it.StuckReason {
	case StuckFailed:
		return fmt.Sprintf("the compensation of step %s exhausted its attempts; fix the cause, then retry: it re-runs that compensation and then the ones below it", a.describeStep(it))
	case StuckOverdue:
		return fmt.Sprintf("step %s was due at %s (%s ago, more than the stuck-after %s) and no runner holds a lease; check that a relay is running, then retry to run it now",
			a.describeStep(it), it.NextAttemptAt.UTC().Format(time.RFC3339), now.Sub(it.NextAttemptAt).Round(time.Second), a.cfg.StuckAfter)
	case StuckHeld:
		what := "step " + a.describeStep(it)
		if it.Status == saga.StatusCompensating {
			what = "the compensation of step " + a.describeStep(it)
		}
		since := ""
		if it.HeldSince != nil {
			since = fmt.Sprintf(" for %s", now.Sub(*it.HeldSince).Round(time.Second))
		}
		return fmt.Sprintf("%s has failed%s with an error an operator or the database must fix (%s); it is retried and never compensated on its own: fix the cause (a grant, a table, a connection, the participant) and it goes on by itself, or cancel it",
			what, since, it.LastError)
	case StuckUnregistered:
		return fmt.Sprintf("no definition of saga %s version %d is defined in this binary or stored in saga_definitions, so no relay can advance it; deploy a relay that registers that version", it.SagaName, it.SagaVersion)
	}
	return ""
}

func (a *Admin) describeStep(it Item) string {
	if it.CurrentStepName != "" {
		return fmt.Sprintf("%d (%s)", it.CurrentStep, it.CurrentStepName)
	}
	return fmt.Sprint(it.CurrentStep)
}
