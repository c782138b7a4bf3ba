package httpapi

import (
	"net/http"

	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/admin"
)

// Definition is one loaded saga definition as GET /v1/definitions lists it.
type Definition struct {
	Name    string `json:"name"`
	Version int    `json:"version"`
	// Source is "go" for a saga defined in Go, else the file it was loaded
	// from (or "stored:…" for an older version kept from the database).
	Source   string              `json:"source"`
	Hash     string              `json:"hash,omitempty"`
	Triggers []DefinitionTrigger `json:"triggers"`
	Steps    []DefinitionStep    `json:"steps"`
}

// DefinitionTrigger is one trigger of a definition.
type DefinitionTrigger struct {
	EventType     string `json:"event_type"`
	AggregateType string `json:"aggregate_type,omitempty"`
}

// DefinitionStep is one step: its kind (sql, http, command, emit, or go) and
// its compensation's kind ("" when it has none).
type DefinitionStep struct {
	Name       string `json:"name"`
	Kind       string `json:"kind"`
	Compensate string `json:"compensate,omitempty"`
}

// DefinitionsFunc lists the loaded definitions, ordered by name and version.
type DefinitionsFunc func() []Definition

// RegistryDefinitions describes the definitions of reg as sagas defined in Go:
// what Config.Definitions defaults to.
func RegistryDefinitions(reg *saga.Registry) []Definition {
	var out []Definition
	for _, d := range reg.Definitions() {
		def := Definition{Name: d.Name, Version: d.Version, Source: "go", Triggers: []DefinitionTrigger{}, Steps: []DefinitionStep{}}
		for _, t := range d.Triggers {
			def.Triggers = append(def.Triggers, DefinitionTrigger{EventType: t.EventType, AggregateType: t.AggregateType})
		}
		for _, s := range d.Steps {
			st := DefinitionStep{Name: s.Name, Kind: "go"}
			if s.Compensate != nil {
				st.Compensate = "go"
			}
			def.Steps = append(def.Steps, st)
		}
		out = append(out, def)
	}
	return out
}

// definitions is GET /v1/definitions.
func (s *Server) definitions(w http.ResponseWriter, _ *http.Request, _ *admin.Admin) {
	writeJSON(w, http.StatusOK, map[string]any{"items": s.loadedDefinitions()})
}

// loadedDefinitions is what GET /v1/definitions and the definitions page show.
func (s *Server) loadedDefinitions() []Definition {
	var defs []Definition
	switch {
	case s.cfg.Definitions != nil:
		defs = s.cfg.Definitions()
	case s.cfg.Registry != nil:
		defs = RegistryDefinitions(s.cfg.Registry)
	}
	if defs == nil {
		defs = []Definition{}
	}
	return defs
}
