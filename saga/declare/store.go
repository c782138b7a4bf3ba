package declare

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/jackc/pgx/v5"
)

// The store's SQL, in one place.
const (
	// sqlLockDefinitions serialises relays that load at the same time, so
	// that two of them cannot store different bodies under one version.
	sqlLockDefinitions = `SELECT pg_advisory_xact_lock(hashtext('compensa.saga_definitions'))`
	sqlStoreDefinition = `
INSERT INTO saga_definitions (saga_name, saga_version, hash, body, source_file)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (saga_name, saga_version) DO NOTHING`
	sqlStoredDefinitions = `SELECT saga_name, saga_version, hash, body, source_file FROM saga_definitions ORDER BY saga_name, saga_version`
	// An OR, so that the partial indexes saga_claim_idx and saga_failed_idx
	// serve it (migrations 0007 and 0020, saga_paused_idx): finished
	// instances are not read.
	sqlUnfinished = `SELECT DISTINCT saga_name, saga_version FROM saga_instances WHERE status IN ('RUNNING', 'COMPENSATING') OR status = 'FAILED' OR status = 'PAUSED'`
)

// Beginner opens a transaction (a *pgxpool.Pool, a *pgx.Conn).
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Pin stores the loaded sagas the first time they are seen, refuses one whose
// stored body under the same version differs, and returns the set to
// register: the loaded sagas plus the stored older versions their running
// instances still need. A saga whose file was removed is kept, retired (a
// trigger nothing sends), while it has unfinished instances, so that those
// finish on the version that started them.
func Pin(ctx context.Context, db Beginner, loaded []*Saga) ([]*Saga, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("saga definitions: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, sqlLockDefinitions); err != nil {
		return nil, fmt.Errorf("saga definitions: lock: %w", err)
	}
	for _, s := range loaded {
		if _, err := tx.Exec(ctx, sqlStoreDefinition, s.Name, s.Version, s.Hash, string(s.Body), s.File); err != nil {
			return nil, fmt.Errorf("saga definitions: store %s v%d: %w", s.Name, s.Version, err)
		}
	}
	out, probs, err := resolveStored(ctx, tx, loaded)
	if err != nil {
		return nil, err
	}
	if len(probs) > 0 {
		return nil, probs.sorted()
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("saga definitions: commit: %w", err)
	}
	sortSagas(out)
	return out, nil
}

// resolveStored compares the loaded sagas with the stored definitions: a
// loaded version whose stored body differs is a problem, and the stored
// versions that unfinished instances still need are added to the set.
func resolveStored(ctx context.Context, q Querier, loaded []*Saga) ([]*Saga, Problems, error) {
	stored, err := readStoredRows(ctx, q)
	if err != nil {
		return nil, nil, err
	}
	unfinished := map[string]bool{}
	urows, err := q.Query(ctx, sqlUnfinished)
	if err != nil {
		return nil, nil, fmt.Errorf("saga definitions: read instances: %w", err)
	}
	for urows.Next() {
		var n string
		var v int
		if err := urows.Scan(&n, &v); err != nil {
			urows.Close()
			return nil, nil, err
		}
		unfinished[fmt.Sprintf("%s@%d", n, v)] = true
	}
	urows.Close()

	byKey := map[string]*Saga{}
	names := map[string]bool{}
	highest := map[string]int{}
	for _, s := range loaded {
		byKey[fmt.Sprintf("%s@%d", s.Name, s.Version)] = s
		names[s.Name] = true
	}
	for _, r := range stored {
		highest[r.name] = max(highest[r.name], r.version)
	}
	for _, s := range loaded {
		highest[s.Name] = max(highest[s.Name], s.Version)
	}
	var probs Problems
	out := append([]*Saga(nil), loaded...)
	for _, r := range stored {
		key := fmt.Sprintf("%s@%d", r.name, r.version)
		if s, ok := byKey[key]; ok {
			if s.Hash != r.hash {
				probs = append(probs, Problem{File: s.File, Line: s.namePos.Line, Col: s.namePos.Col,
					Msg: fmt.Sprintf("%s version %d changed since it was first loaded; give the new definition version %d", r.name, r.version, max(highest[r.name], s.Version)+1)})
			}
			continue
		}
		if !names[r.name] && !unfinished[key] {
			continue // removed, and nothing of it is left to finish
		}
		src := r.source()
		s, ps := LoadFile(src, []byte(r.body), Options{SkipSchemaFiles: true})
		if ps != nil {
			probs = append(probs, Problem{File: src, Msg: fmt.Sprintf("the stored body no longer loads (%s); fix or finish its instances by hand", ps[0].Msg)})
			continue
		}
		if !names[r.name] {
			s.retire()
		}
		out = append(out, s)
	}
	return out, probs, nil
}

// CheckStored reports, without storing anything, what Pin would refuse: a
// loaded saga whose name and version are stored with another body, and a
// stored version still needed by unfinished instances that no longer
// loads. It needs only SELECT on saga_definitions and saga_instances.
func CheckStored(ctx context.Context, q Querier, loaded []*Saga) error {
	_, probs, err := resolveStored(ctx, q, loaded)
	if err != nil {
		return err
	}
	if len(probs) > 0 {
		return probs.sorted()
	}
	return nil
}

// RetiredEventType is the trigger of a saga whose file was removed while it
// had unfinished instances: no producer writes it, so the saga starts nothing
// new while its instances finish.
const RetiredEventType = "compensa.retired"

func (s *Saga) retire() {
	for i := range s.Triggers {
		s.Triggers[i].EventType = RetiredEventType
		s.Triggers[i].AggregateType = s.Name
	}
	s.Triggers = s.Triggers[:1]
	s.contracts = nil
}

// storedRow is one row of saga_definitions.
type storedRow struct {
	name, hash, body, file string
	version                int
}

// source names a stored body in load problems.
func (r storedRow) source() string {
	return fmt.Sprintf("stored:%s@v%d (first loaded from %s)", r.name, r.version, filepath.Base(r.file))
}

// readStoredRows reads every stored definition, ordered by name and version.
func readStoredRows(ctx context.Context, q Querier) ([]storedRow, error) {
	rows, err := q.Query(ctx, sqlStoredDefinitions)
	if err != nil {
		return nil, fmt.Errorf("saga definitions: read: %w", err)
	}
	stored, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (storedRow, error) {
		var x storedRow
		return x, r.Scan(&x.name, &x.version, &x.hash, &x.body, &x.file)
	})
	if err != nil {
		return nil, fmt.Errorf("saga definitions: read: %w", err)
	}
	return stored, nil
}
