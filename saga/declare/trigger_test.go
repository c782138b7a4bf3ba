package declare

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/compensa/compensa/outbox"
)

const contractSaga = `saga: pay
version: 1
triggers:
  - event_type: order.placed
    filter: "${ trigger.payload.cents >= 100 && trigger.aggregate_type == 'order' }"
    schema:
      type: object
      additionalProperties: false
      required: [order_id, cents]
      properties:
        order_id: {type: string}
        cents: {type: integer, minimum: 0}
steps:
  - name: charge
    emit: [{event_type: charge.requested, payload: {order: "${ trigger.payload.order_id }"}}]
`

// TestTriggerContracts: a trigger's schema parks what does not fit, its
// filter starts only what it accepts.
func TestTriggerContracts(t *testing.T) {
	t.Parallel()
	s, probs := LoadFile("pay.yaml", []byte(contractSaga), Options{})
	if probs != nil {
		t.Fatal(probs)
	}
	d := s.Definition(nil)
	f := d.Triggers[0].Filter
	if f == nil {
		t.Fatal("a trigger with a filter and a schema has no Filter")
	}
	ev := func(aggType, payload string) outbox.Event {
		return outbox.Event{ID: uuid.New(), EventType: "order.placed", AggregateType: aggType, Payload: json.RawMessage(payload)}
	}
	for _, c := range []struct {
		name    string
		ev      outbox.Event
		want    bool
		wantErr string
	}{
		{"fits and passes", ev("order", `{"order_id": "o-1", "cents": 250}`), true, ""},
		{"fits, filtered out", ev("order", `{"order_id": "o-1", "cents": 5}`), false, ""},
		{"fits, other aggregate", ev("cart", `{"order_id": "o-1", "cents": 250}`), false, ""},
		{"missing field", ev("order", `{"order_id": "o-1"}`), false, `payload does not match the trigger's schema: at /: missing property 'cents'`},
		{"wrong type", ev("order", `{"order_id": "o-1", "cents": "250"}`), false, `at /cents: got string, want integer`},
		{"extra field", ev("order", `{"order_id": "o-1", "cents": 250, "x": 1}`), false, `additional properties 'x' not allowed`},
		{"not an object", ev("order", `[1]`), false, `got array, want object`},
	} {
		got, err := f(c.ev)
		if c.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("%s: err = %v, want one containing %q", c.name, err, c.wantErr)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%s: %v, %v; want %v", c.name, got, err, c.want)
		}
	}

	// A filter that does not give a boolean is an error (a dead letter),
	// not a silent no.
	odd := strings.Replace(contractSaga, "${ trigger.payload.cents >= 100 && trigger.aggregate_type == 'order' }", "${ trigger.payload.order_id }", 1)
	s, probs = LoadFile("odd.yaml", []byte(odd), Options{})
	if probs != nil {
		t.Fatal(probs)
	}
	if _, err := s.Definition(nil).Triggers[0].Filter(ev("order", `{"order_id": "o-1", "cents": 1}`)); err == nil || !strings.Contains(err.Error(), `odd.yaml:5:`) || !strings.Contains(err.Error(), "not true or false") {
		t.Errorf("a filter giving text: %v", err)
	}
}

// TestTriggerContractsBroken: misuse of filter and schema is reported at
// file:line:col with a fix, every problem at once.
func TestTriggerContractsBroken(t *testing.T) {
	t.Parallel()
	const steps = "steps:\n  - name: a\n    emit: [{event_type: x, payload: {n: \"${ trigger.payload.nope }\"}}]\n"
	cases := []struct {
		name, triggers string
		want           []string
	}{
		{"filter not an expression", "triggers:\n  - event_type: e\n    filter: \"cents > 100\"\n",
			[]string{`f.yaml:5:13: triggers[0].filter must be one expression, "${ … }", that gives true or false`}},
		{"filter with text around", "triggers:\n  - event_type: e\n    filter: \"${ true } and more\"\n",
			[]string{`f.yaml:5:13: triggers[0].filter must be one expression, "${ … }", that gives true or false`}},
		{"filter reads a step", "triggers:\n  - event_type: e\n    filter: \"${ steps.a.n == 1 }\"\n",
			[]string{`f.yaml:5:23: steps are not available in triggers[0].filter; a trigger's filter sees only the event`}},
		{"filter cel error", "triggers:\n  - event_type: e\n    filter: \"${ trigger.payload. }\"\n",
			[]string{`f.yaml:5:`, `in triggers[0].filter; fix the CEL syntax`}},
		{"schema not a schema", "triggers:\n  - event_type: e\n    schema: {type: 12}\n",
			[]string{`f.yaml:5:13: triggers[0].schema is not a valid JSON Schema`}},
		{"schema file missing", "triggers:\n  - event_type: e\n    schema: nope.json\n",
			[]string{`f.yaml:5:13: triggers[0].schema: cannot read nope.json`}},
		{"schema wrong kind", "triggers:\n  - event_type: e\n    schema: [1]\n",
			[]string{`f.yaml:5:13: triggers[0].schema must be string or object, not array`}},
		{"expression reads a field the closed schema lacks", "triggers:\n  - event_type: e\n    schema: {type: object, additionalProperties: false, properties: {order_id: {type: string}}}\n",
			[]string{`f.yaml:8:`, `trigger.payload has no field "nope" in the trigger's schema (additionalProperties: false); its properties are: order_id`}},
	}
	for _, c := range cases {
		body := "saga: s\nversion: 1\n" + c.triggers + steps
		if !strings.Contains(c.name, "closed schema") {
			body = strings.Replace(body, "trigger.payload.nope", "trigger.payload", 1)
		}
		_, probs := LoadFile(filepath.Join(t.TempDir(), "f.yaml"), []byte(body), Options{})
		text := strings.ReplaceAll(probs.Error(), filepath.Dir(filepath.Join(t.TempDir(), "f.yaml"))+string(filepath.Separator), "")
		for _, w := range c.want {
			if !strings.Contains(text, w) {
				t.Errorf("%s: problems\n%s\nlack %q", c.name, text, w)
			}
		}
	}
}

// TestTriggerSchemaFile: a schema in a file of its own, relative to the saga
// file, is enforced, and a change to it changes the version's hash (so that
// Pin refuses it under the same version).
func TestTriggerSchemaFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	body := "saga: s\nversion: 1\ntriggers:\n  - event_type: e\n    schema: schemas/e.json\nsteps:\n  - name: a\n    emit: [{event_type: x}]\n"
	if err := os.MkdirAll(filepath.Join(dir, "schemas"), 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(schema string) *Saga {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, "schemas", "e.json"), []byte(schema), 0o600); err != nil {
			t.Fatal(err)
		}
		s, probs := LoadFile(filepath.Join(dir, "s.yaml"), []byte(body), Options{})
		if probs != nil {
			t.Fatal(probs)
		}
		return s
	}
	a := write(`{"type": "object", "required": ["id"]}`)
	if _, err := a.Definition(nil).Triggers[0].Filter(outbox.Event{EventType: "e", Payload: json.RawMessage(`{}`)}); err == nil || !strings.Contains(err.Error(), "missing property 'id'") {
		t.Errorf("the schema file is not enforced: %v", err)
	}
	b := write(`{"type": "object", "required": ["id", "n"]}`)
	if a.Hash == b.Hash {
		t.Error("a changed schema file leaves the version's hash as it was")
	}
	// The stored body alone (no files) still loads, without the schema.
	if _, probs := LoadFile("stored:s@v1", []byte(body), Options{SkipSchemaFiles: true}); probs != nil {
		t.Errorf("a stored body with a schema file does not load: %v", probs)
	}
}
