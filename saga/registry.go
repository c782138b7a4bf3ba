package saga

import (
	"sort"
	"sync"
	"sync/atomic"
)

// Registry holds the saga definitions this process knows. Several versions of
// one saga may be registered: new triggers start the newest, running
// instances stay on their own.
type Registry struct {
	mu   sync.RWMutex
	defs map[Key]Definition
	// gen counts changes, so that a reader that caches what it derived
	// from the registry (the correlator's routes) knows when to derive again.
	gen atomic.Uint64
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{defs: map[Key]Definition{}} }

// Register adds a definition. A duplicate (name, version) is ErrConflict; an
// invalid definition is ErrInvalid with a message naming the field.
func (r *Registry) Register(defs ...Definition) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, d := range defs {
		if err := d.validate(); err != nil {
			return err
		}
		if _, dup := r.defs[d.Key()]; dup {
			return Errorf(ErrConflict, "definition %s is already registered", d.Key())
		}
		r.defs[d.Key()] = d
	}
	r.gen.Add(1)
	return nil
}

// Swap removes the definitions of old and registers defs, as one change: a
// reader sees the registry before or after, never in between, and on an
// error (an invalid definition, a key still taken) nothing changes. It is how
// a reloaded set of declared sagas replaces the previous one.
func (r *Registry) Swap(old []Key, defs []Definition) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	next := make(map[Key]Definition, len(r.defs))
	for k, d := range r.defs {
		next[k] = d
	}
	for _, k := range old {
		delete(next, k)
	}
	for _, d := range defs {
		if err := d.validate(); err != nil {
			return err
		}
		if _, dup := next[d.Key()]; dup {
			return Errorf(ErrConflict, "definition %s is already registered", d.Key())
		}
		next[d.Key()] = d
	}
	r.defs = next
	r.gen.Add(1)
	return nil
}

// Generation changes whenever the set of definitions does.
func (r *Registry) Generation() uint64 { return r.gen.Load() }

// MustRegister is Register for program start-up: it panics on error.
func (r *Registry) MustRegister(defs ...Definition) {
	if err := r.Register(defs...); err != nil {
		panic(err)
	}
}

// Lookup returns the definition an instance is pinned to.
func (r *Registry) Lookup(name string, version int) (Definition, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	d, ok := r.defs[Key{Name: name, Version: version}]
	return d, ok
}

// Latest returns the newest registered version of a saga.
func (r *Registry) Latest(name string) (Definition, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var best Definition
	found := false
	for k, d := range r.defs {
		if k.Name == name && (!found || k.Version > best.Version) {
			best, found = d, true
		}
	}
	return best, found
}

// Definitions returns every registered definition, ordered by name then
// version.
func (r *Registry) Definitions() []Definition {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]Definition, 0, len(r.defs))
	for _, d := range r.defs {
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].Version < out[j].Version
	})
	return out
}
