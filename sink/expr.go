package sink

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"

	"cel.dev/cel-go/cel"
	"go.yaml.in/yaml/v3"

	"github.com/compensa/compensa/internal/expr"
)

// A sink's expressions (filter, transform, and ${ … } in subject and topic
// templates) are CEL over one name, event: the row's columns (id,
// tenant_id, aggregate_type, aggregate_id, event_type, created_at,
// correlation_id, causation_id) and its payload and headers as maps. They
// are compiled once, when the sinks file is loaded, and each evaluation is
// bounded by the same cost limit as a declared saga's (expr.CostLimit). An
// expression that fails for one event (a missing key, a wrong type, the
// cost limit) is a refusal of that event for that sink: it is parked with
// the reason, like an event the destination refused.

// exprVar is the one name in scope.
const exprVar = "event"

// exprFields are the keys of event, for messages.
var exprFields = []string{"id", "tenant_id", "aggregate_type", "aggregate_id", "event_type", "created_at",
	"correlation_id", "causation_id", "payload", "headers"}

var (
	envOnce sync.Once
	celEnv  *cel.Env
	envErr  error
	// compileMu serializes compilations on the shared environment: the
	// checker fills a lazy catalog of the environment when it reports an
	// undeclared name, which races with another compilation's read
	// (cel-go 0.33). Compiling happens when a sinks file loads, never per
	// event.
	compileMu sync.Mutex
)

func exprEnv() (*cel.Env, error) {
	envOnce.Do(func() {
		celEnv, envErr = cel.NewEnv(
			cel.Variable(exprVar, cel.MapType(cel.StringType, cel.DynType)),
			// Payload numbers are JSON numbers: `event.payload.amount > 100`
			// compares a double with an int.
			cel.CrossTypeNumericComparisons(true),
		)
	})
	return celEnv, envErr
}

// Expr is one compiled ${ … } expression of a sinks file.
type Expr struct {
	text string
	prg  cel.Program
	// checked is the compiled expression, for a test's program that
	// tracks the cost of an evaluation.
	checked *cel.Ast
	// typ is the result's type as the checker knows it (dyn when it
	// depends on the data); a filter's must be bool or dyn.
	typ *cel.Type
}

// String returns the expression as written, ${ … } included.
func (x *Expr) String() string { return "${ " + strings.TrimSpace(x.text) + " }" }

// exprIssue is a compile error at a byte offset of the expression's text.
type exprIssue struct {
	line, col int // 1-based line within the text, 0-based column
	what, fix string
}

// CompileExpr compiles the text between ${ and }. Its errors are one line
// each, with what to do.
func CompileExpr(text string) (*Expr, error) {
	x, issues := compileExpr(text)
	if len(issues) > 0 {
		var msgs []string
		for _, is := range issues {
			msgs = append(msgs, is.what+"; "+is.fix)
		}
		return nil, errors.New(strings.Join(msgs, "\n"))
	}
	return x, nil
}

func compileExpr(text string) (*Expr, []exprIssue) {
	env, err := exprEnv()
	if err != nil {
		return nil, []exprIssue{{1, 0, "expression environment: " + err.Error(), "report this as a bug"}}
	}
	if strings.TrimSpace(text) == "" {
		return nil, []exprIssue{{1, 0, "empty expression ${ }", "write an expression inside ${ … } or remove it"}}
	}
	compileMu.Lock()
	checked, iss := env.Compile(text)
	compileMu.Unlock()
	if iss != nil && iss.Err() != nil {
		var out []exprIssue
		for _, e := range iss.Errors() {
			msg := strings.TrimPrefix(e.Message, "ERROR: ")
			fix := "see the CEL language definition"
			switch {
			case strings.Contains(msg, "undeclared reference"):
				fix = "the one name in scope is event, with the keys " + strings.Join(exprFields, ", ")
			case strings.Contains(msg, "no matching overload"):
				fix = "convert one side, e.g. string(x) or int(x)"
			case strings.Contains(msg, "Syntax error"):
				fix = "fix the CEL syntax"
			}
			out = append(out, exprIssue{max(e.Location.Line(), 1), max(e.Location.Column(), 0), "expression ${ " + strings.TrimSpace(text) + " }: " + msg, fix})
		}
		return nil, out
	}
	compileMu.Lock()
	prg, err := env.Program(checked, cel.CostLimit(expr.CostLimit), cel.EvalOptions(cel.OptOptimize))
	compileMu.Unlock()
	if err != nil {
		return nil, []exprIssue{{1, 0, fmt.Sprintf("expression ${ %s }: %v", strings.TrimSpace(text), err), "simplify it"}}
	}
	return &Expr{text: text, prg: prg, typ: checked.OutputType(), checked: checked}, nil
}

// Eval runs the expression against vars (EventVars) and returns its result
// as a plain JSON value. A missing key is an error, never a silent null.
func (x *Expr) Eval(vars map[string]any) (any, error) {
	out, _, err := x.prg.Eval(vars)
	if err != nil {
		return nil, fmt.Errorf("expression %s failed: %v", x, err)
	}
	v, err := expr.ToJSON(out)
	if err != nil {
		return nil, fmt.Errorf("expression %s: %v", x, err)
	}
	return v, nil
}

// EventVars is what an expression sees of ev: event with the row's columns,
// its payload and headers decoded (null when they are not JSON: a poison
// event's RawPayload is not given to expressions).
func EventVars(ev *Event) map[string]any {
	m := map[string]any{
		"id": ev.ID, "tenant_id": ev.TenantID, "aggregate_type": ev.AggregateType, "aggregate_id": ev.AggregateID,
		"event_type": ev.EventType, "correlation_id": ev.CorrelationID, "causation_id": ev.CausationID,
		"payload": decodeJSON(ev.Payload), "headers": decodeJSON(ev.Headers), "created_at": nil,
	}
	if !ev.CreatedAt.IsZero() {
		m["created_at"] = ev.CreatedAt
	}
	if m["headers"] == nil {
		m["headers"] = map[string]any{}
	}
	return map[string]any{exprVar: m}
}

// decodeJSON decodes raw with integers as int64 (CEL ints), other numbers
// as float64; nil when raw is empty or not JSON.
func decodeJSON(raw []byte) any {
	if len(raw) == 0 {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if dec.Decode(&v) != nil {
		return nil
	}
	return plainNumbers(v)
}

func plainNumbers(v any) any {
	switch t := v.(type) {
	case json.Number:
		if i, err := t.Int64(); err == nil {
			return i
		}
		f, _ := t.Float64()
		return f
	case map[string]any:
		for k, x := range t {
			t[k] = plainNumbers(x)
		}
	case []any:
		for i, x := range t {
			t[i] = plainNumbers(x)
		}
	}
	return v
}

// Value is a YAML value with ${ … } expressions inside its strings (a
// sink's transform): a string that is one expression takes the
// expression's value and type, a string with text around expressions is
// text, maps and lists keep their shape.
type Value struct {
	literal any
	single  *Expr
	parts   []valuePart
	isText  bool
	keys    []string
	fields  map[string]*Value
	items   []*Value
	isMap   bool
	isList  bool
}

type valuePart struct {
	text string
	x    *Expr
}

// value compiles n; problems are reported at their place in the file.
func (p *parser) value(n *yaml.Node, where string) *Value {
	v := &Value{}
	switch n.Kind {
	case yaml.AliasNode:
		p.add(n.Line, n.Column, where+" is a YAML alias", "write the value out: aliases are not supported in sinks files")
	case yaml.MappingNode:
		v.isMap, v.fields = true, map[string]*Value{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i]
			if k.Kind != yaml.ScalarNode {
				p.add(k.Line, k.Column, "a key of "+where+" is not a plain name", "write keys as plain words")
				continue
			}
			if _, dup := v.fields[k.Value]; dup {
				p.add(k.Line, k.Column, fmt.Sprintf("key %q appears twice in %s", k.Value, where), "keep one")
				continue
			}
			v.keys = append(v.keys, k.Value)
			v.fields[k.Value] = p.value(n.Content[i+1], where+"."+k.Value)
		}
	case yaml.SequenceNode:
		v.isList = true
		for i, c := range n.Content {
			v.items = append(v.items, p.value(c, fmt.Sprintf("%s[%d]", where, i)))
		}
	case yaml.ScalarNode:
		if n.ShortTag() != "!!str" || !strings.Contains(n.Value, "${") {
			var x any
			if err := n.Decode(&x); err != nil {
				p.add(n.Line, n.Column, fmt.Sprintf("%s: %v", where, err), "write a plain value")
			}
			v.literal = x
			return v
		}
		v.parts = p.splitExprs(n, where)
		if len(v.parts) == 1 && v.parts[0].x != nil {
			v.single, v.parts = v.parts[0].x, nil
		} else {
			v.isText = true
		}
	}
	return v
}

// splitExprs cuts a string into text and compiled ${ … } expressions.
func (p *parser) splitExprs(n *yaml.Node, where string) []valuePart {
	s := n.Value
	var out []valuePart
	for {
		i := strings.Index(s, "${")
		if i < 0 {
			if s != "" {
				out = append(out, valuePart{text: s})
			}
			return out
		}
		start := len(n.Value) - len(s) + i
		if i > 0 {
			out = append(out, valuePart{text: s[:i]})
		}
		end := expr.ClosingBrace(s[i+2:])
		line, col := expr.ValueOffset(n, start+2)
		if end < 0 {
			p.add(line, col-2, "${ is not closed in "+where, "end the expression with }")
			return out
		}
		x, issues := compileExpr(s[i+2 : i+2+end])
		for _, is := range issues {
			l, c := line, col+is.col
			if is.line > 1 {
				l, c = line+is.line-1, is.col+1
			}
			p.add(l, c, is.what+" in "+where, is.fix)
		}
		out = append(out, valuePart{x: x})
		s = s[i+2+end+1:]
	}
}

// Eval renders the value against vars (EventVars).
func (v *Value) Eval(vars map[string]any) (any, error) {
	switch {
	case v == nil:
		return nil, nil
	case v.single != nil:
		return v.single.Eval(vars)
	case v.isText:
		var b strings.Builder
		for _, p := range v.parts {
			if p.x == nil {
				b.WriteString(p.text)
				continue
			}
			x, err := p.x.Eval(vars)
			if err != nil {
				return nil, err
			}
			b.WriteString(expr.Text(x))
		}
		return b.String(), nil
	case v.isMap:
		out := make(map[string]any, len(v.keys))
		for _, k := range v.keys {
			x, err := v.fields[k].Eval(vars)
			if err != nil {
				return nil, err
			}
			out[k] = x
		}
		return out, nil
	case v.isList:
		out := make([]any, 0, len(v.items))
		for _, it := range v.items {
			x, err := it.Eval(vars)
			if err != nil {
				return nil, err
			}
			out = append(out, x)
		}
		return out, nil
	}
	return v.literal, nil
}

// errNotBool is a filter whose result, for one event, is not a bool.
var errNotBool = errors.New("a filter must give true or false")

// Keep runs the sink's filter on ev (true without one). An error is the
// filter failing for this event.
func (s *Spec) Keep(ev *Event, vars map[string]any) (bool, error) {
	if s.Filter == nil {
		return true, nil
	}
	if vars == nil {
		vars = EventVars(ev)
	}
	v, err := s.Filter.Eval(vars)
	if err != nil {
		return false, fmt.Errorf("filter: %w", err)
	}
	b, ok := v.(bool)
	if !ok {
		return false, fmt.Errorf("filter %s gave %s: %w", s.Filter, expr.Text(v), errNotBool)
	}
	return b, nil
}

// Shape applies the sink's filter and transform to ev: keep is false when
// the filter rejects it; out is the event to deliver (ev itself without a
// transform, else a copy whose payload is the transform's result). An
// error is an expression failing for this event: a refusal, parked with
// the reason.
func (s *Spec) Shape(ev *Event) (out *Event, keep bool, err error) {
	if s.Filter == nil && s.Transform == nil {
		return ev, true, nil
	}
	vars := EventVars(ev)
	if keep, err := s.Keep(ev, vars); err != nil || !keep {
		return nil, false, err
	}
	if s.Transform == nil {
		return ev, true, nil
	}
	v, err := s.Transform.Eval(vars)
	if err != nil {
		return nil, false, fmt.Errorf("transform: %w", err)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // the payload is JSON, not HTML
	if err := enc.Encode(v); err != nil {
		return nil, false, fmt.Errorf("transform: the result cannot be written as JSON: %w", err)
	}
	c := *ev
	c.Payload, c.RawPayload = bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
	return &c, true, nil
}

// Shaped wraps inner so that each event is shaped by spec (Shape) before
// it is delivered: an event whose expression fails is refused (EventError,
// parked with the reason) and the later events of its aggregate are held
// back behind it; one the filter rejects is not sent and counts as done
// (the fan-out drops those before they reach a sink; this covers events
// parked and replayed). inner itself is returned for a spec without filter
// or transform.
func Shaped(spec Spec, inner Sink) Sink {
	if spec.Filter == nil && spec.Transform == nil {
		return inner
	}
	return &shaped{spec: spec, inner: inner}
}

type shaped struct {
	spec  Spec
	inner Sink
}

func (s *shaped) Deliver(ctx context.Context, evs []*Event) []error {
	errs := make([]error, len(evs))
	send := make([]*Event, 0, len(evs))
	at := make([]int, 0, len(evs))
	refused := map[string]bool{}
	for i, ev := range evs {
		k := ev.AggregateKey()
		if refused[k] {
			errs[i] = ErrHeldBack
			continue
		}
		out, keep, err := s.spec.Shape(ev)
		switch {
		case err != nil:
			errs[i] = EventError(err)
			refused[k] = true
		case keep:
			send = append(send, out)
			at = append(at, i)
		}
	}
	if len(send) == 0 {
		return errs
	}
	res := s.inner.Deliver(ctx, send)
	for j, i := range at {
		if j < len(res) {
			errs[i] = res[j]
		} else {
			errs[i] = errors.New("sink returned a wrong number of results (a bug in the sink)")
		}
	}
	return errs
}

func (s *shaped) Close() error { return s.inner.Close() }
