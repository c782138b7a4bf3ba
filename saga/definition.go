package saga

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/compensa/compensa/outbox"
)

// Definition is one version of a saga, declared in code. Instances are pinned
// to the (Name, Version) that started them.
type Definition struct {
	Name    string
	Version int
	// Triggers lists the events that start an instance.
	Triggers []Trigger
	// Deadline, when positive, sets timeout_at = start + Deadline: past it no
	// forward step runs, the done steps are compensated and the instance ends
	// TIMED_OUT.
	Deadline time.Duration
	// Steps run in order, one transaction each.
	Steps []Step
	// DecodeState checks that a trigger's payload is a usable initial state
	// (it decodes into the saga's state type, required fields are there). An
	// error parks the event as a dead letter. Nil accepts any JSON object.
	DecodeState func(payload json.RawMessage) error
	// StartState, when set, builds an instance's initial state from its
	// whole trigger event (declared sagas keep the event's type, aggregate
	// and headers for their expressions); nil starts with the payload. An
	// error parks the event as a dead letter.
	StartState func(ev outbox.Event) (json.RawMessage, error)
	// Concurrency, when set, limits how many instances sharing a key run
	// at a time. Nil: no limit.
	Concurrency *Concurrency
}

// Concurrency limits the instances of a saga (any version) that share a
// key: at most Limit of them are RUNNING or COMPENSATING at a time, and
// they run in trigger commit order; instances of other keys run in
// parallel. The key is computed once, when the correlator starts the
// instance, and kept on it, so the limit holds across every relay and
// across restarts. An instance that ends (COMPLETED, COMPENSATED,
// TIMED_OUT, or FAILED for a person) lets the next one of its key run.
// The correlator stores the key and the PostgreSQL journal's claim
// (pgjournal) enforces it; the memory journal does not.
type Concurrency struct {
	// Key gives the key of the instance an event starts (e.g. its
	// aggregate id). An error parks the event as a dead letter. It must be
	// a pure function of the event.
	Key func(ev outbox.Event) (string, error)
	// Limit is at least 1.
	Limit int
	// Global shares the key between every tenant. By default the limit
	// holds per tenant and key: the stored key is the trigger's tenant and
	// Key's result, so one tenant's instances never hold another's back.
	Global bool
}

// ScopedKey is the concurrency key stored on an instance that event ev
// starts, for the key Key gave: per tenant unless c is Global.
func (c *Concurrency) ScopedKey(ev outbox.Event, key string) string {
	if c.Global {
		return key
	}
	return ev.TenantID.String() + "/" + key
}

// Trigger matches events that start a saga. Empty AggregateType and a nil
// TenantID match any.
type Trigger struct {
	EventType     string
	AggregateType string
	TenantID      uuid.UUID
	// Filter, when set, is asked about every event the fields above match:
	// false starts nothing (the event counts as filtered), an error parks
	// the event as a dead letter with that error. It must be a pure
	// function of the event: a replayed batch asks it again.
	Filter func(ev outbox.Event) (bool, error)
}

// Key identifies a definition.
type Key struct {
	Name    string
	Version int
}

func (k Key) String() string { return fmt.Sprintf("%s@v%d", k.Name, k.Version) }

// Key returns the definition's identity.
func (d Definition) Key() Key { return Key{Name: d.Name, Version: d.Version} }

// StepNames lists the step names in order.
func (d Definition) StepNames() []string {
	names := make([]string, len(d.Steps))
	for i, s := range d.Steps {
		names[i] = s.Name
	}
	return names
}

func (d Definition) validate() error {
	if d.Name == "" {
		return Errorf(ErrInvalid, "definition: Name is empty")
	}
	if d.Version <= 0 {
		return Errorf(ErrInvalid, "definition %s: Version must be positive, got %d", d.Name, d.Version)
	}
	if len(d.Triggers) == 0 {
		return Errorf(ErrInvalid, "definition %s: Triggers is empty: a saga needs at least one trigger event type", d.Key())
	}
	for i, tr := range d.Triggers {
		if tr.EventType == "" {
			return Errorf(ErrInvalid, "definition %s: Triggers[%d].EventType is empty", d.Key(), i)
		}
	}
	if d.Deadline < 0 {
		return Errorf(ErrInvalid, "definition %s: Deadline must not be negative", d.Key())
	}
	if len(d.Steps) == 0 {
		return Errorf(ErrInvalid, "definition %s: Steps is empty", d.Key())
	}
	if c := d.Concurrency; c != nil && (c.Key == nil || c.Limit < 1) {
		return Errorf(ErrInvalid, "definition %s: Concurrency needs a Key function and a Limit of at least 1, got limit %d", d.Key(), c.Limit)
	}
	seen := map[string]bool{}
	for i, s := range d.Steps {
		if s.Name == "" {
			return Errorf(ErrInvalid, "definition %s: Steps[%d].Name is empty", d.Key(), i)
		}
		if seen[s.Name] {
			return Errorf(ErrInvalid, "definition %s: step name %q appears twice", d.Key(), s.Name)
		}
		seen[s.Name] = true
		if err := s.validate(); err != nil {
			return Errorf(ErrInvalid, "definition %s: step %q: Steps[%d].%v", d.Key(), s.Name, i, err)
		}
	}
	return nil
}
