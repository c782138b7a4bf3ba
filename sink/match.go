package sink

import "path"

// Match selects events by globs (path.Match syntax: *, ?, [a-z]); an empty
// list selects everything.
type Match struct {
	EventTypes     []string `json:"event_types,omitempty"`
	AggregateTypes []string `json:"aggregate_types,omitempty"`
}

// Selects reports whether ev matches.
func (m Match) Selects(ev *Event) bool {
	return anyGlob(m.EventTypes, ev.EventType) && anyGlob(m.AggregateTypes, ev.AggregateType)
}

func anyGlob(globs []string, s string) bool {
	if len(globs) == 0 {
		return true
	}
	for _, g := range globs {
		if ok, _ := path.Match(g, s); ok {
			return true
		}
	}
	return false
}
