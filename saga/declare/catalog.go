package declare

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/compensa/compensa/saga"
)

// Querier runs a query (a *pgxpool.Pool, a *pgx.Conn).
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// catalogRefresh is how long a catalog trusts the stored definitions it
// read: another relay may pin a new version at any time, and operators'
// reads should see it without a restart.
const catalogRefresh = 10 * time.Second

// catalogReadTimeout bounds one read of saga_definitions on behalf of a
// lookup (which has no context of its own).
const catalogReadTimeout = 5 * time.Second

// Catalog is what operators' tools know of saga definitions: the ones this
// process runs (its registry) and every declared body stored in
// saga_definitions, whichever relay pinned it. The stored ones are loaded
// without secrets and never run: they name steps, tell a version that some
// relay can run from one that none can, and let a retry or cancel be
// accepted for a relay that runs the saga to carry out. It satisfies
// admin.Catalog, and is safe for concurrent use.
type Catalog struct {
	runs *saga.Registry
	db   Querier
	now  func() time.Time

	mu     sync.Mutex
	stored map[saga.Key]saga.Definition
	readAt time.Time
	err    error
}

// NewCatalog returns a catalog of runs (may be nil) and the definitions
// stored in db.
func NewCatalog(runs *saga.Registry, db Querier) *Catalog {
	return &Catalog{runs: runs, db: db, now: time.Now}
}

// Refresh re-reads the stored definitions now. A body that no longer loads
// is left out (an operator sees its instances as unregistered, which is
// true: no relay can run them either).
func (c *Catalog) Refresh(ctx context.Context) error {
	stored, err := readStored(ctx, c.db)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.readAt = c.now()
	c.err = err
	if err == nil {
		c.stored = stored
	}
	return err
}

// Err is the error of the last read of saga_definitions, nil when it
// succeeded.
func (c *Catalog) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// storedNow returns the stored definitions, read again when the last read
// is older than catalogRefresh. A failed read keeps what was read before.
func (c *Catalog) storedNow() map[saga.Key]saga.Definition {
	c.mu.Lock()
	fresh := !c.readAt.IsZero() && c.now().Sub(c.readAt) < catalogRefresh
	stored := c.stored
	c.mu.Unlock()
	if fresh || c.db == nil {
		return stored
	}
	ctx, cancel := context.WithTimeout(context.Background(), catalogReadTimeout)
	defer cancel()
	_ = c.Refresh(ctx) // the error is kept for Err; the last good set stays
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stored
}

// Lookup returns the definition of (name, version): the running one where
// this process runs it, else the stored one.
func (c *Catalog) Lookup(name string, version int) (saga.Definition, bool) {
	if c.runs != nil {
		if d, ok := c.runs.Lookup(name, version); ok {
			return d, true
		}
	}
	d, ok := c.storedNow()[saga.Key{Name: name, Version: version}]
	return d, ok
}

// Definitions returns every known definition, the running ones first, each
// (name, version) once.
func (c *Catalog) Definitions() []saga.Definition {
	var out []saga.Definition
	seen := map[saga.Key]bool{}
	if c.runs != nil {
		for _, d := range c.runs.Definitions() {
			seen[d.Key()] = true
			out = append(out, d)
		}
	}
	stored := c.storedNow()
	keys := make([]saga.Key, 0, len(stored))
	for k := range stored {
		if !seen[k] {
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].Name != keys[j].Name {
			return keys[i].Name < keys[j].Name
		}
		return keys[i].Version < keys[j].Version
	})
	for _, k := range keys {
		out = append(out, stored[k])
	}
	return out
}

// readStored loads every body of saga_definitions as a definition that is
// never run (no runtime: no client, no secrets).
func readStored(ctx context.Context, db Querier) (map[saga.Key]saga.Definition, error) {
	all, err := readStoredRows(ctx, db)
	if err != nil {
		return nil, err
	}
	out := make(map[saga.Key]saga.Definition, len(all))
	for _, r := range all {
		s, probs := LoadFile(r.source(), []byte(r.body), Options{SkipSchemaFiles: true})
		if probs != nil || s.Name != r.name || s.Version != r.version {
			continue
		}
		d := s.Definition(nil)
		out[d.Key()] = d
	}
	return out, nil
}
