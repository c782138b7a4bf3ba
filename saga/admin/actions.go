package admin

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/compensa/compensa/saga"
)

// MaxReasonLen bounds a reason, in characters.
const MaxReasonLen = 1000

// DefaultCancelReason is journaled when a cancel gives none.
const DefaultCancelReason = "cancelled by an operator"

// Result is the outcome of Retry or Cancel: the instance as it stands after
// the request, and whether an identical request was already pending (then
// nothing was written).
type Result struct {
	Instance         Item `json:"instance"`
	AlreadyRequested bool `json:"already_requested"`
}

// Retry asks the runner to resume an instance exactly where it stands:
//
//   - FAILED: back to COMPENSATING at the compensation that failed (its
//     attempt count reset); the runner re-runs it, then the compensations
//     below it in reverse order.
//   - RUNNING or COMPENSATING, not held by a runner: its current step (or
//     compensation) becomes due now with its attempt count reset.
//
// It never marks a step done or moves current_step. reason and actor are
// journaled with the time. A retry that is still pending (journaled, not yet
// claimed) is answered with the same state and AlreadyRequested. Errors:
// ErrNotFound (unknown or another tenant's), ErrInvalid (empty reason or
// actor), ErrConflict (COMPLETED, COMPENSATED, TIMED_OUT; a runner holds a
// live lease; the version is not registered here).
func (a *Admin) Retry(ctx context.Context, id uuid.UUID, reason, actor string) (Result, error) {
	reason, err := checkRequest(reason, actor, true)
	if err != nil {
		return Result{}, err
	}
	return a.act(ctx, id, retryRule(id), func(ctx context.Context) error {
		return a.cfg.Journal.RequestRetry(ctx, id, reason, actor)
	})
}

// retryRule is Retry's decision for an instance it holds locked: refuse it,
// call it already requested, or go ahead.
func retryRule(id uuid.UUID) func(Instance) (bool, error) {
	return func(inst Instance) (bool, error) {
		switch inst.Status {
		case saga.StatusCompleted, saga.StatusCompensated, saga.StatusTimedOut:
			return false, saga.Errorf(saga.ErrConflict, "saga instance %s is %s: it has finished, there is nothing to retry", id, inst.Status)
		}
		if inst.StuckReason == StuckUnregistered {
			return false, saga.Errorf(saga.ErrConflict, "saga instance %s is pinned to %s version %d, which no relay can run (neither defined in this binary nor stored in saga_definitions): a retry would not run; deploy a relay that registers it", id, inst.SagaName, inst.SagaVersion)
		}
		if inst.Status == saga.StatusFailed {
			return false, nil
		}
		if inst.Status == saga.StatusPaused {
			return false, saga.Errorf(saga.ErrConflict, "saga instance %s is PAUSED: resume it (relay sagas resume %s --reason …), it then continues where it stood", id, id)
		}
		if inst.lastKind == string(saga.EventRetryRequested) && inst.Attempt == 0 && inst.due && !inst.leaseLive {
			return true, nil
		}
		if inst.leaseLive {
			return false, saga.Errorf(saga.ErrConflict, "saga instance %s is being worked on by a runner (lease until %s): it is not stuck; retry it if it still does not move after the lease expires",
				id, inst.LeaseExpiresAt.UTC().Format("2006-01-02T15:04:05Z07:00"))
		}
		return false, nil
	}
}

// Cancel starts the compensation of a RUNNING instance: the steps that
// completed or may have acted are compensated in reverse order. A live lease
// is revoked (the runner's commit is then fenced out). A cancel still
// pending is answered with AlreadyRequested. Errors as for Retry;
// ErrConflict for any status but RUNNING.
func (a *Admin) Cancel(ctx context.Context, id uuid.UUID, reason, actor string) (Result, error) {
	reason, err := checkRequest(reason, actor, false)
	if err != nil {
		return Result{}, err
	}
	return a.act(ctx, id, cancelRule(id), func(ctx context.Context) error {
		return a.cfg.Journal.RequestCancel(ctx, id, reason, actor)
	})
}

// cancelRule is Cancel's decision for an instance it holds locked.
func cancelRule(id uuid.UUID) func(Instance) (bool, error) {
	return func(inst Instance) (bool, error) {
		switch {
		case inst.Status == saga.StatusCompensating && inst.lastKind == string(saga.EventCancelRequested):
			return true, nil
		case inst.Status == saga.StatusCompensating:
			why := inst.CompensationReason
			if why == "" {
				why = "an earlier failure"
			}
			return false, saga.Errorf(saga.ErrConflict, "saga instance %s is already compensating (%s)", id, why)
		case inst.Status == saga.StatusPaused:
			return false, saga.Errorf(saga.ErrConflict, "saga instance %s is PAUSED: resume it first (relay sagas resume %s --reason …), then cancel it", id, id)
		case inst.Status != saga.StatusRunning:
			return false, saga.Errorf(saga.ErrConflict, "saga instance %s is %s: only a RUNNING instance can be cancelled", id, inst.Status)
		}
		return false, nil
	}
}

// Pause stops a RUNNING or COMPENSATING instance where it stands: it
// becomes PAUSED and no runner claims it, through restarts and failovers,
// until Resume. A live lease is revoked, so a runner in the middle of a step
// cannot commit it (the step runs again after the resume, as after a lost
// lease). Its step, attempt count, timers, wait and concurrency key are
// kept. Pausing a PAUSED instance is answered with AlreadyRequested. reason
// is required and journaled with actor. Errors: ErrNotFound, ErrInvalid,
// ErrConflict (any other status).
func (a *Admin) Pause(ctx context.Context, id uuid.UUID, reason, actor string) (Result, error) {
	reason, err := checkRequest(reason, actor, true)
	if err != nil {
		return Result{}, err
	}
	return a.act(ctx, id, pauseRule(id), func(ctx context.Context) error {
		return a.cfg.Journal.RequestPause(ctx, id, reason, actor)
	})
}

// pauseRule is Pause's decision for an instance it holds locked.
func pauseRule(id uuid.UUID) func(Instance) (bool, error) {
	return func(inst Instance) (bool, error) {
		switch inst.Status {
		case saga.StatusPaused:
			return true, nil
		case saga.StatusRunning, saga.StatusCompensating:
			return false, nil
		}
		return false, saga.Errorf(saga.ErrConflict, "saga instance %s is %s: only a RUNNING or COMPENSATING instance can be paused", id, inst.Status)
	}
}

// Resume returns a PAUSED instance to the status it was paused in, due when
// it was due: a wait or a reply timeout that passed while it was paused
// applies at once, and a reply that came meanwhile is used. Resuming an
// instance that is not PAUSED is ErrConflict; the other errors as for Pause.
func (a *Admin) Resume(ctx context.Context, id uuid.UUID, reason, actor string) (Result, error) {
	reason, err := checkRequest(reason, actor, true)
	if err != nil {
		return Result{}, err
	}
	return a.act(ctx, id, resumeRule(id), func(ctx context.Context) error {
		return a.cfg.Journal.RequestResume(ctx, id, reason, actor)
	})
}

// resumeRule is Resume's decision for an instance it holds locked.
func resumeRule(id uuid.UUID) func(Instance) (bool, error) {
	return func(inst Instance) (bool, error) {
		if inst.Status != saga.StatusPaused {
			return false, saga.Errorf(saga.ErrConflict, "saga instance %s is %s, not PAUSED: there is nothing to resume", id, inst.Status)
		}
		return false, nil
	}
}

func checkRequest(reason, actor string, reasonRequired bool) (string, error) {
	reason = strings.TrimSpace(reason)
	if reason == "" {
		if reasonRequired {
			return "", saga.Errorf(saga.ErrInvalid, "reason is required: say why (it is journaled with your name and the time)")
		}
		reason = DefaultCancelReason
	}
	if n := utf8.RuneCountInString(reason); n > MaxReasonLen {
		return "", saga.Errorf(saga.ErrInvalid, "reason is %d characters long; keep it under %d", n, MaxReasonLen)
	}
	if strings.TrimSpace(actor) == "" {
		return "", saga.Errorf(saga.ErrInvalid, "actor is empty: every operator action records who asked")
	}
	return reason, nil
}

// act reads and locks the instance, lets decide refuse it or call it already
// done, performs the request in the same transaction and returns the state
// after it.
func (a *Admin) act(ctx context.Context, id uuid.UUID, decide func(Instance) (already bool, err error), request func(context.Context) error) (Result, error) {
	return a.actIf(ctx, id, nil, decide, request)
}

// actIf is act with a condition checked under the row lock, before decide:
// when it says no, the instance is left alone and errNoLongerMatches is
// returned (a bulk action's filter, which may have stopped holding since the
// instance was selected).
func (a *Admin) actIf(ctx context.Context, id uuid.UUID, still func(context.Context, pgx.Tx) (bool, error),
	decide func(Instance) (already bool, err error), request func(context.Context) error) (Result, error) {
	if a.cfg.Journal == nil {
		return Result{}, ErrReadOnly
	}
	var res Result
	err := pgx.BeginFunc(ctx, a.cfg.Pool, func(tx pgx.Tx) error {
		inst, err := a.get(ctx, tx, id, true)
		if err != nil {
			return err
		}
		if inst.HistoryDeletedAt != nil {
			return saga.Errorf(saga.ErrConflict, "saga instance %s is %s and its history was deleted by retention at %s (--saga-retention, --failed-retention): only its tombstone is left, there is nothing to retry or cancel",
				id, inst.Status, inst.HistoryDeletedAt.UTC().Format(time.RFC3339))
		}
		if still != nil {
			ok, err := still(ctx, tx)
			if err != nil {
				return err
			}
			if !ok {
				return errNoLongerMatches
			}
		}
		already, err := decide(inst)
		if err != nil {
			return err
		}
		if already {
			res = Result{Instance: inst.Item, AlreadyRequested: true}
			return nil
		}
		if err := request(saga.ContextWithTx(ctx, tx)); err != nil {
			return err
		}
		after, err := a.get(ctx, tx, id, false)
		if err != nil {
			return err
		}
		res = Result{Instance: after.Item}
		return nil
	})
	if err != nil {
		return Result{}, err
	}
	return res, nil
}

// StuckCount is one line of StuckCounts.
type StuckCount struct {
	Saga   string
	Reason string
	Count  int64
}

// StuckCounts counts stuck instances by saga and reason (for metrics).
func (a *Admin) StuckCounts(ctx context.Context) ([]StuckCount, error) {
	names, versions, known := a.registered()
	rows, err := a.cfg.Pool.Query(ctx, sqlStuckCounts, a.thresholds(), names, versions, known)
	if err != nil {
		return nil, fmt.Errorf("admin: count stuck instances: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (StuckCount, error) {
		var c StuckCount
		return c, r.Scan(&c.Saga, &c.Reason, &c.Count)
	})
	if err != nil {
		return nil, fmt.Errorf("admin: count stuck instances: %w", err)
	}
	// Every registered saga reports every reason, 0 when none is stuck: a
	// series that vanishes cannot be told from one that was never scraped,
	// and an alert on it would not resolve.
	seen := map[[2]string]bool{}
	for _, c := range out {
		seen[[2]string{c.Saga, c.Reason}] = true
	}
	if a.cfg.Registry != nil {
		done := map[string]bool{}
		for _, d := range a.cfg.Registry.Definitions() {
			if done[d.Name] {
				continue
			}
			done[d.Name] = true
			for _, reason := range []string{StuckFailed, StuckHeld, StuckOverdue, StuckUnregistered} {
				if !seen[[2]string{d.Name, reason}] {
					out = append(out, StuckCount{Saga: d.Name, Reason: reason})
				}
			}
		}
	}
	return out, nil
}

// ParkedEvents counts dead letters not yet re-driven.
func (a *Admin) ParkedEvents(ctx context.Context) (int64, error) {
	var n int64
	if err := a.cfg.Pool.QueryRow(ctx, sqlParkedCount).Scan(&n); err != nil {
		return 0, fmt.Errorf("admin: count parked events: %w", err)
	}
	return n, nil
}

// RestartRequest is a retry of a FAILED or COMPENSATED instance from a
// named step.
type RestartRequest struct {
	ID       uuid.UUID
	FromStep string
	// RerunEarlier allows a restart although steps before FromStep were
	// compensated: the new attempt starts at the first of them, so that
	// their effects are made again before FromStep runs.
	RerunEarlier bool
	Reason       string
	Actor        string
}

// RetryFromStep starts a new attempt of a FAILED or COMPENSATED instance
// from step FromStep: RUNNING again at that step, with the state and the
// earlier steps' records and outputs kept; journaled (restarted) with the
// reason and the caller. It is refused (ErrConflict) when a step before
// FromStep was compensated (its effect undone: RerunEarlier starts from the
// first such step instead), and when a step from FromStep on completed or
// may have acted and was never compensated (running it again would do it
// twice: its compensation failed, retry that instead). ErrInvalid for a
// step the instance's definition does not have.
func (a *Admin) RetryFromStep(ctx context.Context, req RestartRequest) (Result, error) {
	reason, err := checkRequest(req.Reason, req.Actor, true)
	if err != nil {
		return Result{}, err
	}
	id := req.ID
	var start int
	decide := func(inst Instance) (bool, error) {
		if inst.Status != saga.StatusFailed && inst.Status != saga.StatusCompensated {
			return false, saga.Errorf(saga.ErrConflict, "saga instance %s is %s: only a FAILED or COMPENSATED instance starts again from a step (a running one: relay sagas retry without --from-step)", id, inst.Status)
		}
		if a.cfg.Registry == nil {
			return false, saga.Errorf(saga.ErrConflict, "this process knows no saga definitions: it cannot tell which step %q is", req.FromStep)
		}
		def, ok := a.cfg.Registry.Lookup(inst.SagaName, inst.SagaVersion)
		if !ok {
			return false, saga.Errorf(saga.ErrConflict, "saga instance %s is pinned to %s version %d, which no relay can run: deploy a relay that registers it", id, inst.SagaName, inst.SagaVersion)
		}
		k := slices.IndexFunc(def.Steps, func(s saga.Step) bool { return s.Name == req.FromStep })
		if k < 0 {
			return false, saga.Errorf(saga.ErrInvalid, "%s v%d has no step %q; its steps: %s", inst.SagaName, inst.SagaVersion, req.FromStep, strings.Join(def.StepNames(), ", "))
		}
		start = k
		return false, nil
	}
	check := func(ctx context.Context, tx pgx.Tx) error {
		rows, err := tx.Query(ctx, sqlSteps, id)
		if err != nil {
			return err
		}
		var seq int
		var name, status string
		records := map[int][2]string{}
		var ignore [7]any
		_, err = pgx.ForEachRow(rows, []any{&seq, &name, &status, &ignore[0], &ignore[1], &ignore[2], &ignore[3], &ignore[4], &ignore[5], &ignore[6]}, func() error {
			records[seq] = [2]string{name, status}
			return nil
		})
		if err != nil {
			return err
		}
		var undone []string
		first := -1
		for s := range start {
			if r, ok := records[s]; ok && r[1] == string(saga.StepCompensated) {
				undone = append(undone, r[0])
				if first < 0 {
					first = s
				}
			}
		}
		if len(undone) > 0 {
			if !req.RerunEarlier {
				return saga.Errorf(saga.ErrConflict, "steps before %s were compensated (%s): their effects are undone, and the new attempt would run on without them; add --rerun-earlier to start from %s instead",
					req.FromStep, strings.Join(undone, ", "), undone[0])
			}
			start = first
		}
		for s, r := range records {
			if s >= start && (r[1] == string(saga.StepCompleted) || r[1] == string(saga.StepRunning)) {
				return saga.Errorf(saga.ErrConflict, "step %s is %s and was never compensated: running it again would do it twice; retry the compensation instead (relay sagas retry %s --reason …), or start from a later step", r[0], r[1], id)
			}
		}
		return nil
	}
	if a.cfg.Journal == nil {
		return Result{}, ErrReadOnly
	}
	var res Result
	err = pgx.BeginFunc(ctx, a.cfg.Pool, func(tx pgx.Tx) error {
		inst, err := a.get(ctx, tx, id, true)
		if err != nil {
			return err
		}
		if inst.HistoryDeletedAt != nil {
			return saga.Errorf(saga.ErrConflict, "saga instance %s is %s and its history was deleted by retention at %s: only its tombstone is left, there is nothing to start again",
				id, inst.Status, inst.HistoryDeletedAt.UTC().Format(time.RFC3339))
		}
		if _, err := decide(inst); err != nil {
			return err
		}
		if err := check(ctx, tx); err != nil {
			return err
		}
		if err := a.cfg.Journal.RequestRestart(saga.ContextWithTx(ctx, tx), id, start, reason, req.Actor); err != nil {
			return err
		}
		after, err := a.get(ctx, tx, id, false)
		res = Result{Instance: after.Item}
		return err
	})
	if err != nil {
		return Result{}, err
	}
	return res, nil
}
