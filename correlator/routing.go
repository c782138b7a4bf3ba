package correlator

import (
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
// several of its triggers match.
func (r routes) match(ev *outbox.Event) []saga.Definition {
	cands := r[ev.EventType]
	if len(cands) == 0 {
		return nil
	}
	var out []saga.Definition
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
		if !dup {
			out = append(out, c.def)
		}
	}
	return out
}
