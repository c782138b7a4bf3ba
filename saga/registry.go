package saga

import (
	"sort"
	"sync"
)

// Registry holds the saga definitions this process knows. Several versions of
// one saga may be registered: new triggers start the newest, running
// instances stay on their own.
type Registry struct {
	mu   sync.RWMutex
	defs map[Key]Definition
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
	return nil
}

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
