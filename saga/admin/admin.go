package admin

import (
	"cmp"
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/compensa/compensa/saga"
)

// DefaultStuckAfter is how long an instance's next attempt may be overdue,
// with no runner holding it, before it counts as stuck.
const DefaultStuckAfter = 5 * time.Minute

// DefaultHoldAfter is how long a step (or a compensation) may keep failing
// with errors that hold its instance (saga.ClassOperator,
// saga.ClassTransient) before the instance counts as stuck (StuckHeld).
const DefaultHoldAfter = 15 * time.Minute

// Journal is the part of the saga journal that operator actions write
// through. The requests are unfenced (they revoke any lease) and validated
// by saga.Advance; they join the transaction carried by ctx
// (saga.ContextWithTx), which Admin relies on to check and act under one row
// lock.
type Journal interface {
	RequestRetry(ctx context.Context, id uuid.UUID, reason, actor string) error
	RequestCancel(ctx context.Context, id uuid.UUID, reason, actor string) error
	RequestPause(ctx context.Context, id uuid.UUID, reason, actor string) error
	RequestResume(ctx context.Context, id uuid.UUID, reason, actor string) error
	RequestRestart(ctx context.Context, id uuid.UUID, step int, reason, actor string) error
}

// Config configures an Admin.
type Config struct {
	// Pool is the database; required.
	Pool *pgxpool.Pool
	// Journal carries out Retry, Cancel, Pause and Resume. Nil makes the
	// Admin read-only: they fail with ErrReadOnly.
	Journal Journal
	// Registry says which (saga, version) pairs some relay can run: an
	// instance of any other is stuck with reason StuckUnregistered, and it
	// is also used to name steps. A *saga.Registry knows the sagas of this
	// process; a declare.Catalog adds the declared ones stored in the
	// database. Nil skips that check (a tool that does not know the
	// definitions must not call every instance unregistered).
	Registry Catalog
	// StuckAfter: see DefaultStuckAfter. Negative is invalid.
	StuckAfter time.Duration
	// HoldAfter: see DefaultHoldAfter. Negative is invalid.
	HoldAfter time.Duration
}

// Catalog is a set of saga definitions by (name, version): a
// *saga.Registry, or a declare.Catalog.
type Catalog interface {
	Definitions() []saga.Definition
	Lookup(name string, version int) (saga.Definition, bool)
}

// ErrReadOnly is returned by Retry and Cancel on an Admin without a Journal.
var ErrReadOnly = errors.New("admin: no journal configured: retry and cancel are not available")

// Admin lists, shows, retries and cancels saga instances. It is safe for
// concurrent use.
type Admin struct {
	cfg Config
	// scope, when valid, restricts every read and write to one tenant.
	scope uuid.NullUUID
	// secret keys the event ids of starts with an idempotency key.
	secret *startSecret
}

// New validates cfg and returns an Admin.
func New(cfg Config) (*Admin, error) {
	if cfg.Pool == nil {
		return nil, saga.Errorf(saga.ErrInvalid, "admin: Config.Pool is nil")
	}
	if cfg.StuckAfter < 0 {
		return nil, saga.Errorf(saga.ErrInvalid, "admin: Config.StuckAfter must not be negative, got %s", cfg.StuckAfter)
	}
	cfg.StuckAfter = cmp.Or(cfg.StuckAfter, DefaultStuckAfter)
	if cfg.HoldAfter < 0 {
		return nil, saga.Errorf(saga.ErrInvalid, "admin: Config.HoldAfter must not be negative, got %s", cfg.HoldAfter)
	}
	cfg.HoldAfter = cmp.Or(cfg.HoldAfter, DefaultHoldAfter)
	if r, ok := cfg.Registry.(*saga.Registry); ok && r == nil {
		cfg.Registry = nil // a nil registry in the interface is still none
	}
	return &Admin{cfg: cfg, secret: &startSecret{}}, nil
}

// ForTenant returns a view of a restricted to one tenant: an instance of
// another tenant is ErrNotFound for Show, Retry and Cancel and absent from
// List.
func (a *Admin) ForTenant(tenant uuid.UUID) *Admin {
	b := *a
	b.scope = uuid.NullUUID{UUID: tenant, Valid: true}
	return &b
}

// StuckAfter returns the overdue threshold in force.
func (a *Admin) StuckAfter() time.Duration { return a.cfg.StuckAfter }

// HoldAfter returns the held threshold in force.
func (a *Admin) HoldAfter() time.Duration { return a.cfg.HoldAfter }

// thresholds is the classifying statements' $1: StuckAfter, HoldAfter.
func (a *Admin) thresholds() []time.Duration {
	return []time.Duration{a.cfg.StuckAfter, a.cfg.HoldAfter}
}

// registered returns the registry's keys as two parallel arrays for SQL, and
// whether the registry is known at all.
func (a *Admin) registered() (names []string, versions []int32, known bool) {
	if a.cfg.Registry == nil {
		return []string{}, []int32{}, false
	}
	defs := a.cfg.Registry.Definitions()
	names = make([]string, len(defs))
	versions = make([]int32, len(defs))
	for i, d := range defs {
		names[i], versions[i] = d.Name, int32(d.Version)
	}
	return names, versions, true
}

// stepName names step i of an instance's definition, "" when unknown.
func (a *Admin) stepName(sagaName string, version, i int) string {
	if a.cfg.Registry == nil {
		return ""
	}
	d, ok := a.cfg.Registry.Lookup(sagaName, version)
	if !ok || i < 0 || i >= len(d.Steps) {
		return ""
	}
	return d.Steps[i].Name
}
