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

// Limits of a bulk action.
const (
	// DefaultBulkLimit is how many instances a real bulk run acts on when
	// the request does not say.
	DefaultBulkLimit = 1000
	// MaxBulkLimit bounds one call; a larger backlog takes several calls,
	// each of which acts on what is left.
	MaxBulkLimit = 10000
	// SampleSize is how many matching ids a dry run shows.
	SampleSize = 20
	// bulkBatch is how many ids are selected at a time.
	bulkBatch = 200
)

// Bulk outcomes, the keys of BulkResult.Outcomes.
const (
	OutcomeRetried          = "retried"
	OutcomeCancelled        = "cancelled"
	OutcomePaused           = "paused"
	OutcomeResumed          = "resumed"
	OutcomeAlreadyRequested = "already_requested"
	OutcomeConflict         = "conflict"
)

// BulkRequest is a bulk retry, cancel, pause or resume. Filter.Limit and Filter.Cursor are
// ignored: Limit is the bound of a real run.
type BulkRequest struct {
	Filter Filter
	// Reason is required (for cancel too: acting on many instances at once
	// always says why); it is journaled on every instance with Actor.
	Reason string
	Actor  string
	// DryRun only counts and samples; nothing changes.
	DryRun bool
	// Limit: how many instances a real run acts on at most; 0 means
	// DefaultBulkLimit, at most MaxBulkLimit.
	Limit int
}

// BulkResult answers a bulk action. A dry run has Sample (the first
// SampleSize matching ids, in the order a real run takes them: oldest
// first); a real run has Outcomes (how many instances ended each way).
//
// Matched counts every instance the filter matches; Applicable those the
// action can act on (a retry: RUNNING, COMPENSATING or FAILED, not held by a
// runner, of a registered version; a cancel: RUNNING; a pause: RUNNING or
// COMPENSATING; a resume: PAUSED); Skipped the rest,
// which the action leaves alone. Sample and a real run take only applicable
// instances.
type BulkResult struct {
	DryRun     bool             `json:"dry_run"`
	Matched    int64            `json:"matched"`
	Applicable int64            `json:"applicable"`
	Skipped    int64            `json:"skipped"`
	Sample     []uuid.UUID      `json:"sample,omitempty"`
	Outcomes   map[string]int64 `json:"outcomes,omitempty"`
}

// MarshalJSON writes the answer's documented shape: a dry run always has
// "sample" (an empty list when nothing matched, which omitempty would drop),
// a real run always has "outcomes".
func (r BulkResult) MarshalJSON() ([]byte, error) {
	if r.DryRun {
		if r.Sample == nil {
			r.Sample = []uuid.UUID{}
		}
		return json.Marshal(struct {
			DryRun     bool        `json:"dry_run"`
			Matched    int64       `json:"matched"`
			Applicable int64       `json:"applicable"`
			Skipped    int64       `json:"skipped"`
			Sample     []uuid.UUID `json:"sample"`
		}{true, r.Matched, r.Applicable, r.Skipped, r.Sample})
	}
	if r.Outcomes == nil {
		r.Outcomes = map[string]int64{}
	}
	return json.Marshal(struct {
		DryRun     bool             `json:"dry_run"`
		Matched    int64            `json:"matched"`
		Applicable int64            `json:"applicable"`
		Skipped    int64            `json:"skipped"`
		Outcomes   map[string]int64 `json:"outcomes"`
	}{false, r.Matched, r.Applicable, r.Skipped, r.Outcomes})
}

// errNoLongerMatches: between selection and row lock, the instance stopped
// matching the bulk filter (another operator or a runner moved it).
var errNoLongerMatches = errors.New("admin: instance no longer matches the filter")

// RetryMatching retries every instance f matches, oldest first, at most
// req.Limit of them. Each one goes through exactly what Retry does (its own
// transaction, its row lock, the same refusals), after the filter is checked
// again under that lock. Outcomes: retried, already_requested, conflict (a
// refusal Retry would answer 409 to, or an instance that stopped matching
// meanwhile). Matched counts the instances matching when the call began.
func (a *Admin) RetryMatching(ctx context.Context, req BulkRequest) (BulkResult, error) {
	return a.bulk(ctx, req, OutcomeRetried, sqlRetryable, retryRule, func(ctx context.Context, id uuid.UUID, reason, actor string) error {
		return a.cfg.Journal.RequestRetry(ctx, id, reason, actor)
	})
}

// CancelMatching cancels every instance f matches, as RetryMatching retries
// them; the outcome of an instance whose compensation started is
// "cancelled".
func (a *Admin) CancelMatching(ctx context.Context, req BulkRequest) (BulkResult, error) {
	return a.bulk(ctx, req, OutcomeCancelled, sqlCancellable, cancelRule, func(ctx context.Context, id uuid.UUID, reason, actor string) error {
		return a.cfg.Journal.RequestCancel(ctx, id, reason, actor)
	})
}

// PauseMatching pauses every instance f matches, as RetryMatching retries
// them (outcome "paused").
func (a *Admin) PauseMatching(ctx context.Context, req BulkRequest) (BulkResult, error) {
	return a.bulk(ctx, req, OutcomePaused, sqlPausable, pauseRule, func(ctx context.Context, id uuid.UUID, reason, actor string) error {
		return a.cfg.Journal.RequestPause(ctx, id, reason, actor)
	})
}

// ResumeMatching resumes every PAUSED instance f matches (outcome
// "resumed").
func (a *Admin) ResumeMatching(ctx context.Context, req BulkRequest) (BulkResult, error) {
	return a.bulk(ctx, req, OutcomeResumed, sqlResumable, resumeRule, func(ctx context.Context, id uuid.UUID, reason, actor string) error {
		return a.cfg.Journal.RequestResume(ctx, id, reason, actor)
	})
}

func (a *Admin) bulk(ctx context.Context, req BulkRequest, done, applicable string, rule func(uuid.UUID) func(Instance) (bool, error),
	request func(ctx context.Context, id uuid.UUID, reason, actor string) error) (BulkResult, error) {
	f := req.Filter
	f.Limit, f.Cursor = 0, ""
	if err := f.validate(); err != nil {
		return BulkResult{}, err
	}
	reason, err := checkRequest(req.Reason, req.Actor, true)
	if err != nil {
		return BulkResult{}, err
	}
	if req.Limit < 0 || req.Limit > MaxBulkLimit {
		return BulkResult{}, saga.Errorf(saga.ErrInvalid, "limit must be between 1 and %d, got %d (a larger backlog takes several calls)", MaxBulkLimit, req.Limit)
	}
	limit := req.Limit
	if limit == 0 {
		limit = DefaultBulkLimit
	}
	if !req.DryRun && a.cfg.Journal == nil {
		return BulkResult{}, ErrReadOnly
	}

	res := BulkResult{DryRun: req.DryRun}
	if res.Matched, err = a.countMatching(ctx, a.cfg.Pool, f, uuid.NullUUID{}, ""); err != nil {
		return BulkResult{}, err
	}
	if res.Applicable, err = a.countMatching(ctx, a.cfg.Pool, f, uuid.NullUUID{}, applicable); err != nil {
		return BulkResult{}, err
	}
	// Counted apart, the two may straddle a change: never report less than
	// nothing skipped.
	res.Skipped = max(res.Matched-res.Applicable, 0)
	if req.DryRun {
		res.Sample, err = a.idsMatching(ctx, f, applicable, SampleSize)
		if res.Sample == nil {
			res.Sample = []uuid.UUID{}
		}
		return res, err
	}

	res.Outcomes = map[string]int64{done: 0, OutcomeAlreadyRequested: 0, OutcomeConflict: 0}
	var afterAt time.Time
	var afterID uuid.UUID
	acted := 0
	for acted < limit {
		ids, err := a.idsMatchingAfter(ctx, f, applicable, afterAt, afterID, min(bulkBatch, limit-acted))
		if err != nil {
			return res, err
		}
		if len(ids) == 0 {
			break
		}
		for _, m := range ids {
			afterAt, afterID = m.createdAt, m.id
			still := func(ctx context.Context, tx pgx.Tx) (bool, error) {
				n, err := a.countMatching(ctx, tx, f, uuid.NullUUID{UUID: m.id, Valid: true}, "")
				return n == 1, err
			}
			id := m.id
			r, err := a.actIf(ctx, id, still, rule(id), func(ctx context.Context) error {
				return request(ctx, id, reason, req.Actor)
			})
			acted++
			switch {
			case err == nil && r.AlreadyRequested:
				res.Outcomes[OutcomeAlreadyRequested]++
			case err == nil:
				res.Outcomes[done]++
			case errors.Is(err, saga.ErrConflict), errors.Is(err, saga.ErrNotFound), errors.Is(err, errNoLongerMatches):
				res.Outcomes[OutcomeConflict]++
			default:
				return res, fmt.Errorf("admin: bulk %s stopped after %d instances at %s: %w", done, acted-1, id, err)
			}
		}
	}
	return res, nil
}

// CountUpTo counts the instances f matches, stopping at most: a page must
// not count millions of COMPLETED rows to label a button. more reports that
// at least most match (n is then most).
func (a *Admin) CountUpTo(ctx context.Context, f Filter, most int64) (n int64, more bool, err error) {
	return a.countUpTo(ctx, f, "", most)
}

// Bulk actions, for CountApplicable.
const (
	ActionRetry  = "retry"
	ActionCancel = "cancel"
	ActionPause  = "pause"
	ActionResume = "resume"
)

// CountApplicable is CountUpTo for the instances f matches that action
// (ActionRetry or ActionCancel) can act on, as RetryMatching and
// CancelMatching select them: what "Retry all N" and "Cancel all N" count.
func (a *Admin) CountApplicable(ctx context.Context, f Filter, action string, most int64) (n int64, more bool, err error) {
	switch action {
	case ActionRetry:
		return a.countUpTo(ctx, f, sqlRetryable, most)
	case ActionCancel:
		return a.countUpTo(ctx, f, sqlCancellable, most)
	case ActionPause:
		return a.countUpTo(ctx, f, sqlPausable, most)
	case ActionResume:
		return a.countUpTo(ctx, f, sqlResumable, most)
	}
	return 0, false, saga.Errorf(saga.ErrInvalid, "action %q is not %s, %s, %s or %s", action, ActionRetry, ActionCancel, ActionPause, ActionResume)
}

func (a *Admin) countUpTo(ctx context.Context, f Filter, applicable string, most int64) (n int64, more bool, err error) {
	f.Limit, f.Cursor = 0, ""
	if err := f.validate(); err != nil {
		return 0, false, err
	}
	q := a.selection(f)
	q.close(f)
	q.sql.WriteString(applicable)
	q.add(sqlLimit, most)
	if err := a.cfg.Pool.QueryRow(ctx, "SELECT count(*) FROM ("+q.sql.String()+") c", q.args...).Scan(&n); err != nil {
		return 0, false, fmt.Errorf("admin: count matching instances: %w", err)
	}
	return n, n >= most, nil
}

// querier is a pool or a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// countMatching counts the instances f matches (and the applicable
// clause, when given); with only set, whether that one instance does.
func (a *Admin) countMatching(ctx context.Context, db querier, f Filter, only uuid.NullUUID, applicable string) (int64, error) {
	q := a.selection(f)
	if only.Valid {
		q.add(sqlWhereID, only.UUID)
	}
	q.close(f)
	q.sql.WriteString(applicable)
	var n int64
	if err := db.QueryRow(ctx, "SELECT count(*) FROM ("+q.sql.String()+") c", q.args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("admin: count matching instances: %w", err)
	}
	return n, nil
}

type matchedID struct {
	id        uuid.UUID
	createdAt time.Time
}

// idsMatchingAfter returns up to n matching instances, oldest first,
// strictly after (afterAt, afterID) when afterID is set.
func (a *Admin) idsMatchingAfter(ctx context.Context, f Filter, applicable string, afterAt time.Time, afterID uuid.UUID, n int) ([]matchedID, error) {
	q := a.selection(f)
	q.close(f)
	q.sql.WriteString(applicable)
	if afterID != uuid.Nil {
		q.add(sqlAfterKey, afterAt, afterID)
	}
	q.add(sqlOldestFirst, n)
	rows, err := a.cfg.Pool.Query(ctx, "SELECT id, created_at FROM ("+q.sql.String()+") b", q.args...)
	if err != nil {
		return nil, fmt.Errorf("admin: select matching instances: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (matchedID, error) {
		var m matchedID
		return m, r.Scan(&m.id, &m.createdAt)
	})
	if err != nil {
		return nil, fmt.Errorf("admin: select matching instances: %w", err)
	}
	return out, nil
}

func (a *Admin) idsMatching(ctx context.Context, f Filter, applicable string, n int) ([]uuid.UUID, error) {
	ms, err := a.idsMatchingAfter(ctx, f, applicable, time.Time{}, uuid.Nil, n)
	ids := make([]uuid.UUID, len(ms))
	for i, m := range ms {
		ids[i] = m.id
	}
	return ids, err
}
