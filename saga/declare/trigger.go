package declare

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"go.yaml.in/yaml/v3"

	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/saga"
)

// triggerContract is what a trigger asks of an event beyond its type: a
// JSON Schema its payload must match and a CEL condition on the event.
type triggerContract struct {
	schema *jsonschema.Schema
	// schemaFile is the path of a schema read from a file ("" inline).
	schemaFile string
	// payloadFields lists the payload's properties when the schema closes
	// them (additionalProperties: false); nil when any field may appear.
	payloadFields map[string]bool
	filter        *template
	// fileDoc is the schema read from schemaFile.
	fileDoc any
}

// loadTriggers reads triggers[] with their filter and schema. Filters see
// the event (trigger.*) and the saga's name and version, nothing else.
func loadTriggers(file string, m mapping, doc any, r *report, opt Options) ([]saga.Trigger, []*triggerContract, []byte) {
	var (
		out       []saga.Trigger
		contracts []*triggerContract
		extraHash []byte
	)
	docTriggers, _ := asMap(doc)["triggers"].([]any)
	for i, tn := range m.list("triggers") {
		tm := mapping{tn}
		et := tm.str("event_type")
		if et == "" {
			continue
		}
		place := fmt.Sprintf("triggers[%d]", i)
		c := &triggerContract{}
		if sn := tm.get("schema"); sn != nil {
			var value any
			if i < len(docTriggers) {
				value = asMap(docTriggers[i])["schema"]
			}
			c.loadSchema(file, place, sn, value, r, opt)
			if c.schemaFile != "" && c.schema != nil {
				// A schema in its own file belongs to the definition: a
				// change to it is a change of the version.
				b, _ := json.Marshal(c.schemaDoc(value))
				extraHash = append(extraHash, []byte("\x00"+c.schemaFile+"\x00")...)
				extraHash = append(extraHash, b...)
			}
		}
		if fn := tm.get("filter"); fn != nil {
			if fn.Kind != yaml.ScalarNode || !isSingleExpr(fn.Value) {
				r.add(nodeAt(fn), "%s.filter must be one expression, \"${ … }\", that gives true or false; write e.g. filter: \"${ trigger.payload.amount > 100 }\"", place)
			} else {
				sc := &scope{place: place + ".filter", noSteps: true, contracts: append(contracts[:len(contracts):len(contracts)], c)}
				c.filter = compileTemplate(fn, file, sc, r)
			}
		}
		out = append(out, saga.Trigger{EventType: et, AggregateType: tm.str("aggregate_type")})
		contracts = append(contracts, c)
	}
	return out, contracts, extraHash
}

func asMap(v any) map[string]any {
	m, _ := v.(map[string]any)
	return m
}

// isSingleExpr: the whole text is one ${ … }.
func isSingleExpr(s string) bool {
	s = strings.TrimSpace(s)
	return strings.HasPrefix(s, "${") && closingBrace(s[2:]) == len(s)-3
}

// loadSchema compiles the trigger's schema: inline (a mapping) or the path
// of a JSON or YAML file, relative to the saga file. A definition loaded
// from its stored body (opt.SkipSchemaFiles) leaves a schema file out: such
// a version starts nothing new.
func (c *triggerContract) loadSchema(file, place string, n *yaml.Node, value any, r *report, opt Options) {
	var doc any
	switch n.Kind {
	case yaml.MappingNode:
		doc = value
	case yaml.ScalarNode:
		if opt.SkipSchemaFiles {
			return
		}
		path := n.Value
		if !filepath.IsAbs(path) {
			path = filepath.Join(filepath.Dir(file), path)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			r.add(nodeAt(n), "%s.schema: cannot read %s: %v; give a JSON Schema inline or the path of a schema file, relative to this file", place, n.Value, err)
			return
		}
		var y any
		if err := yaml.Unmarshal(b, &y); err != nil { // YAML reads JSON too
			r.add(nodeAt(n), "%s.schema: %s is neither JSON nor YAML: %v; fix the file", place, n.Value, err)
			return
		}
		doc = plain(y)
		c.schemaFile = n.Value
		c.fileDoc = doc
	default:
		return // the file's schema check has said what it must be
	}
	comp := jsonschema.NewCompiler()
	url := "trigger-schema.json"
	if err := comp.AddResource(url, doc); err != nil {
		r.add(nodeAt(n), "%s.schema is not a JSON Schema: %v; fix it (see json-schema.org)", place, err)
		return
	}
	sch, err := comp.Compile(url)
	if err != nil {
		r.add(nodeAt(n), "%s.schema is not a valid JSON Schema: %s; fix it (see json-schema.org)", place, oneLine(err.Error()))
		return
	}
	c.schema = sch
	if m := asMap(doc); m != nil && m["additionalProperties"] == false {
		c.payloadFields = map[string]bool{}
		for k := range asMap(m["properties"]) {
			c.payloadFields[k] = true
		}
	}
}

func (c *triggerContract) schemaDoc(inline any) any {
	if c.fileDoc != nil {
		return c.fileDoc
	}
	return inline
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// checkPayloadFields reports the fields of trigger.payload that expressions
// read and that a trigger's closed schema does not have: an event of that
// trigger can never carry them.
func checkPayloadFields(field string, contracts []*triggerContract) (string, bool) {
	for _, c := range contracts {
		if c == nil || c.payloadFields == nil || c.payloadFields[field] {
			continue
		}
		var have []string
		for k := range c.payloadFields {
			have = append(have, k)
		}
		sort.Strings(have)
		return fmt.Sprintf("trigger.payload has no field %q in the trigger's schema (additionalProperties: false); its properties are: %s", field, strings.Join(have, ", ")), false
	}
	return "", true
}

// filterFunc is the runner-side form of a trigger's contract: the schema
// first (an event that does not match is a dead letter with the schema's
// error), then the filter (false: nothing starts).
func (c *triggerContract) filterFunc(s *Saga) func(ev outbox.Event) (bool, error) {
	if c == nil || (c.schema == nil && c.filter == nil) {
		return nil
	}
	return func(ev outbox.Event) (bool, error) {
		if c.schema != nil {
			var payload any = map[string]any{}
			if len(bytes.TrimSpace(ev.Payload)) > 0 {
				v, err := jsonschema.UnmarshalJSON(bytes.NewReader(ev.Payload))
				if err != nil {
					return false, fmt.Errorf("payload is not JSON: %v", err)
				}
				payload = v
			}
			if err := c.schema.Validate(payload); err != nil {
				var ve *jsonschema.ValidationError
				msg := err.Error()
				if errors.As(err, &ve) {
					msg = schemaErrorText(ve)
				}
				return false, fmt.Errorf("payload does not match the trigger's schema: %s", msg)
			}
		}
		if c.filter == nil {
			return true, nil
		}
		raw, err := StartState(ev)
		if err != nil {
			return false, err
		}
		st, err := decodeState(raw)
		if err != nil {
			return false, err
		}
		v, err := c.filter.eval(map[string]any{
			varTrigger: st.Trigger,
			varSaga:    map[string]any{"name": s.Name, "version": int64(s.Version)},
			varSteps:   map[string]any{},
		})
		if err != nil {
			return false, err
		}
		b, ok := v.(bool)
		if !ok {
			return false, fmt.Errorf("%s:%d:%d: the filter gave %s, not true or false", c.filter.single.file, c.filter.single.line, c.filter.single.col, jsonText(v))
		}
		return b, nil
	}
}

// schemaErrorText is the leaf errors of a validation, each with where in
// the payload it is.
func schemaErrorText(ve *jsonschema.ValidationError) string {
	var parts []string
	var walk func(e *jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		if len(e.Causes) == 0 {
			at := "/" + strings.Join(e.InstanceLocation, "/")
			parts = append(parts, fmt.Sprintf("at %s: %s", at, e.ErrorKind.LocalizedString(printer)))
			return
		}
		for _, c := range e.Causes {
			walk(c)
		}
	}
	walk(ve)
	sort.Strings(parts)
	return strings.Join(parts, "; ")
}
