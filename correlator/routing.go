package correlator

import (
	"fmt"

	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/saga"
)

// routes maps an event type to the newest version of every saga it triggers.
// Older versions stay registered for their running instances but start
// nothing new.
type routes map[string][]route

type route struct {
	def     saga.Definition
	trigger saga.Trigger
}

func buildRoutes(reg *saga.Registry) routes {
	newest := map[string]saga.Definition{}
	for _, d := range reg.Definitions() {
		if cur, ok := newest[d.Name]; !ok || d.Version > cur.Version {
			newest[d.Name] = d
		}
	}
	r := routes{}
	for _, d := range newest {
		for _, tr := range d.Triggers {
			r[tr.EventType] = append(r[tr.EventType], route{def: d, trigger: tr})
		}
	}
	return r
}

// match returns the definitions ev starts, at most one per saga name even if
// several of its triggers match. filtered reports that a trigger matched the
// event's type but its Filter said no; an error of a Filter is returned as
// it is, naming the saga.
func (r routes) match(ev *outbox.Event) (out []saga.Definition, filtered bool, err error) {
	cands := r[ev.EventType]
	if len(cands) == 0 {
		return nil, false, nil
	}
	for _, c := range cands {
		if c.trigger.AggregateType != "" && c.trigger.AggregateType != ev.AggregateType {
			continue
		}
		if c.trigger.TenantID != outbox.NilTenant && c.trigger.TenantID != ev.TenantID {
			continue
		}
		dup := false
		for _, d := range out {
			if d.Name == c.def.Name {
				dup = true
				break
			}
		}
		if dup {
			continue
		}
		if c.trigger.Filter != nil {
			ok, ferr := c.trigger.Filter(*ev)
			if ferr != nil {
				return nil, false, fmt.Errorf("the trigger filter of saga %s: %v", c.def.Key(), ferr)
			}
			if !ok {
				filtered = true
				continue
			}
		}
		out = append(out, c.def)
	}
	return out, filtered, nil
}
