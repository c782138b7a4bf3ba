package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/compensa/compensa/saga"
)

// DefaultReplayLimit is how many instances Replay checks when the request
// does not say.
const DefaultReplayLimit = 1000

// ReplayRequest selects the instances Replay checks: those of the sagas the
// definitions name (Saga narrows to one), of any version (Version narrows to
// the version they ran under), newest first, at most Limit.
type ReplayRequest struct {
	Saga    string
	Version int
	Limit   int
}

// ReplayResult is one instance's replay against a definition.
type ReplayResult struct {
	InstanceID uuid.UUID   `json:"instance_id"`
	Saga       string      `json:"saga"`
	Version    int         `json:"version"`
	Against    int         `json:"against"`
	Status     saga.Status `json:"status"`
	Events     int         `json:"events"`
	// Divergence is where the history and the definition part ways; empty
	// when the definition could have written the history and can continue
	// it.
	Divergence string `json:"divergence,omitempty"`
}

// Replay checks the recorded journals of instances (finished and running)
// against defs, as a new version is checked before it is deployed: for each
// saga the newest version in defs is the candidate, and every selected
// instance of that saga is replayed against it (saga.ReplayVersion, with the
// definition it ran under when the catalog knows it). Instances whose
// history retention deleted are not read. Nothing is written.
func (a *Admin) Replay(ctx context.Context, defs []saga.Definition, req ReplayRequest) ([]ReplayResult, error) {
	if req.Limit < 0 || req.Limit > MaxBulkLimit {
		return nil, saga.Errorf(saga.ErrInvalid, "limit must be between 1 and %d, got %d", MaxBulkLimit, req.Limit)
	}
	limit := req.Limit
	if limit == 0 {
		limit = DefaultReplayLimit
	}
	candidate := map[string]saga.Definition{}
	for _, d := range defs {
		if c, ok := candidate[d.Name]; !ok || d.Version > c.Version {
			candidate[d.Name] = d
		}
	}
	if req.Saga != "" {
		d, ok := candidate[req.Saga]
		if !ok {
			return nil, saga.Errorf(saga.ErrInvalid, "no definition of saga %q was given: give the files that define it", req.Saga)
		}
		candidate = map[string]saga.Definition{req.Saga: d}
	}
	names := make([]string, 0, len(candidate))
	for n := range candidate {
		names = append(names, n)
	}
	rows, err := a.cfg.Pool.Query(ctx, sqlReplaySelect, names, req.Version, a.scope, limit)
	if err != nil {
		return nil, fmt.Errorf("admin: select instances to replay: %w", err)
	}
	var out []ReplayResult
	for rows.Next() {
		var r ReplayResult
		var status string
		if err := rows.Scan(&r.InstanceID, &r.Saga, &r.Version, &status); err != nil {
			rows.Close()
			return nil, err
		}
		r.Status = saga.Status(status)
		r.Against = candidate[r.Saga].Version
		out = append(out, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("admin: select instances to replay: %w", err)
	}
	for i := range out {
		r := &out[i]
		history, err := loadHistory(ctx, a.cfg.Pool, r.InstanceID)
		if err != nil {
			return nil, err
		}
		r.Events = len(history)
		if err := a.replayOne(candidate[r.Saga], r.Saga, r.Version, history); err != nil {
			r.Divergence = err.Error()
		}
	}
	return out, nil
}

// replayOne replays history against def, with the definition it ran under
// when the catalog knows it.
func (a *Admin) replayOne(def saga.Definition, name string, version int, history []saga.RecordedEvent) error {
	var ranUnder *saga.Definition
	if a.cfg.Registry != nil {
		if d, ok := a.cfg.Registry.Lookup(name, version); ok {
			ranUnder = &d
		}
	}
	return saga.ReplayVersion(ranUnder, def, history)
}

// loadHistory reads an instance's journal in version order.
func loadHistory(ctx context.Context, db querier, id uuid.UUID) ([]saga.RecordedEvent, error) {
	rows, err := db.Query(ctx, sqlReplayHistory, id)
	if err != nil {
		return nil, fmt.Errorf("admin: read the journal of %s: %w", id, err)
	}
	var out []saga.RecordedEvent
	var payload []byte
	var ev saga.RecordedEvent
	_, err = pgx.ForEachRow(rows, []any{&ev.Version, &ev.GlobalSeq, &payload, &ev.CreatedAt}, func() error {
		e := saga.RecordedEvent{InstanceID: id, Version: ev.Version, GlobalSeq: ev.GlobalSeq, CreatedAt: ev.CreatedAt}
		if err := json.Unmarshal(payload, &e.Event); err != nil {
			return fmt.Errorf("admin: event %d of %s: %w", ev.Version, id, err)
		}
		out = append(out, e)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("admin: read the journal of %s: %w", id, err)
	}
	return out, nil
}

// UpgradeRequest moves the RUNNING and PAUSED instances of Saga from
// version From to version To.
type UpgradeRequest struct {
	Saga     string
	From, To int
	DryRun   bool
	Reason   string
	Actor    string
	// Limit: how many instances one call moves at most; 0 means
	// DefaultBulkLimit, at most MaxBulkLimit.
	Limit int
}

// UpgradeRefusal is an instance Upgrade leaves on its version, and why.
type UpgradeRefusal struct {
	InstanceID uuid.UUID `json:"instance_id"`
	Reason     string    `json:"reason"`
}

// UpgradeResult answers Upgrade: the instances moved (or, in a dry run,
// that would move) and those refused with the reason.
type UpgradeResult struct {
	DryRun  bool             `json:"dry_run"`
	Saga    string           `json:"saga"`
	From    int              `json:"from_version"`
	To      int              `json:"to_version"`
	Moved   []uuid.UUID      `json:"moved"`
	Refused []UpgradeRefusal `json:"refused"`
}

// Upgrade moves RUNNING and PAUSED instances of req.Saga from version From
// to version To where To can continue their journal (saga.ReplayVersion:
// every step they ran is the step To has at that place, with the same
// kind), in their own transaction each under the row lock. A moved instance
// keeps its step, state, timers and status, and continues with To's later
// steps; a compensation of the steps it ran under From uses To's
// compensations, which Replay checked exist where From compensated. The
// move is journaled as an upgraded event with the reason (a default one
// when empty) and the caller.
// Instances a runner holds (a live lease) are refused for now: call again.
// A dry run changes nothing and lists what would move. Errors: ErrInvalid
// (versions, reason), ErrConflict (To is not registered here).
func (a *Admin) Upgrade(ctx context.Context, req UpgradeRequest) (UpgradeResult, error) {
	if strings.TrimSpace(req.Reason) == "" {
		req.Reason = fmt.Sprintf("upgraded by an operator from version %d to %d", req.From, req.To)
	}
	reason, err := checkRequest(req.Reason, req.Actor, true)
	if err != nil {
		return UpgradeResult{}, err
	}
	if req.Saga == "" || req.From < 1 || req.To < 1 || req.From == req.To {
		return UpgradeResult{}, saga.Errorf(saga.ErrInvalid, "upgrade needs a saga name and two different versions (from %d, to %d)", req.From, req.To)
	}
	if req.Limit < 0 || req.Limit > MaxBulkLimit {
		return UpgradeResult{}, saga.Errorf(saga.ErrInvalid, "limit must be between 1 and %d, got %d (a larger backlog takes several calls)", MaxBulkLimit, req.Limit)
	}
	limit := req.Limit
	if limit == 0 {
		limit = DefaultBulkLimit
	}
	if a.cfg.Registry == nil {
		return UpgradeResult{}, saga.Errorf(saga.ErrConflict, "this process knows no saga definitions: an upgrade needs version %d of %s", req.To, req.Saga)
	}
	to, ok := a.cfg.Registry.Lookup(req.Saga, req.To)
	if !ok {
		return UpgradeResult{}, saga.Errorf(saga.ErrConflict, "%s version %d is not registered: load it first (relay run --sagas with the new file, then SIGHUP; a relay stores it in saga_definitions)", req.Saga, req.To)
	}
	var from *saga.Definition
	if d, ok := a.cfg.Registry.Lookup(req.Saga, req.From); ok {
		from = &d
	}
	if !req.DryRun && a.cfg.Journal == nil {
		return UpgradeResult{}, ErrReadOnly
	}
	res := UpgradeResult{DryRun: req.DryRun, Saga: req.Saga, From: req.From, To: req.To, Moved: []uuid.UUID{}, Refused: []UpgradeRefusal{}}
	rows, err := a.cfg.Pool.Query(ctx, sqlUpgradeSelect, req.Saga, req.From, a.scope, limit)
	if err != nil {
		return res, fmt.Errorf("admin: select instances to upgrade: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return res, fmt.Errorf("admin: select instances to upgrade: %w", err)
	}
	for _, id := range ids {
		refusal, err := a.upgradeOne(ctx, id, req, from, to, reason)
		switch {
		case err != nil:
			return res, err
		case refusal != "":
			res.Refused = append(res.Refused, UpgradeRefusal{InstanceID: id, Reason: refusal})
		default:
			res.Moved = append(res.Moved, id)
		}
	}
	return res, nil
}

// errDryRun rolls a dry run's transaction back.
var errDryRun = errors.New("dry run")

// upgradeOne moves one instance under its row lock, or says why not.
func (a *Admin) upgradeOne(ctx context.Context, id uuid.UUID, req UpgradeRequest, from *saga.Definition, to saga.Definition, reason string) (string, error) {
	var refusal string
	err := pgx.BeginFunc(ctx, a.cfg.Pool, func(tx pgx.Tx) error {
		var status string
		var version int
		var leaseLive bool
		err := tx.QueryRow(ctx, sqlUpgradeLock, id).Scan(&status, &version, &leaseLive)
		if errors.Is(err, pgx.ErrNoRows) {
			refusal = "it no longer exists"
			return nil
		}
		if err != nil {
			return fmt.Errorf("admin: lock instance %s: %w", id, err)
		}
		switch {
		case version != req.From:
			refusal = fmt.Sprintf("it is on version %d now", version)
		case status != string(saga.StatusRunning) && status != string(saga.StatusPaused):
			refusal = fmt.Sprintf("it is %s: only RUNNING and PAUSED instances move", status)
		case leaseLive:
			refusal = "a runner is working on it (live lease): run the upgrade again in a moment"
		}
		if refusal != "" {
			return nil
		}
		history, err := loadHistory(ctx, tx, id)
		if err != nil {
			return err
		}
		if err := saga.ReplayVersion(from, to, history); err != nil {
			var d *saga.Divergence
			if errors.As(err, &d) {
				refusal = d.What
				if d.Step >= 0 {
					refusal = fmt.Sprintf("step %d: %s", d.Step, d.What)
				}
				return nil
			}
			return err
		}
		if req.DryRun {
			return errDryRun
		}
		ev, _ := json.Marshal(saga.Event{Kind: saga.EventUpgraded, Step: -1, Actor: req.Actor,
			Reason: fmt.Sprintf("v%d → v%d: %s", req.From, req.To, reason)})
		tag, err := tx.Exec(ctx, sqlUpgrade, id, req.From, req.To, ev)
		if err != nil {
			return fmt.Errorf("admin: upgrade %s: %w", id, err)
		}
		if tag.RowsAffected() != 1 {
			return fmt.Errorf("admin: upgrade %s: the instance changed under its row lock", id)
		}
		return nil
	})
	if errors.Is(err, errDryRun) {
		err = nil
	}
	return refusal, err
}
