package declare

import (
	"fmt"
	"sort"
	"strings"
	"sync"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/ast"
	"cel.dev/cel-go/common/types/ref"
	"go.yaml.in/yaml/v3"

	celexpr "github.com/compensa/compensa/internal/expr"
)

// costLimit bounds one evaluation (the same for every file's expressions).
const costLimit = celexpr.CostLimit

// The names an expression may use. Which of them are in scope depends on
// where the expression stands (see scope).
const (
	varTrigger  = "trigger"
	varSaga     = "saga"
	varSteps    = "steps"
	varResult   = "result"
	varResponse = "response"
	varReply    = "reply"
	varSecrets  = "secrets"
	// varStep is the step a compensation undoes: its name and the
	// Idempotency-Key its calls carried, which names what the step did
	// even when it recorded no output.
	varStep = "step"
)

// fields of the fixed-shape names, for load-time checks of trigger.X etc.
var fixedFields = map[string][]string{
	varTrigger:  {"id", "event_type", "aggregate_type", "aggregate_id", "tenant_id", "correlation_id", "payload", "headers"},
	varSaga:     {"id", "name", "version"},
	varResult:   {"rows", "rows_affected"},
	varResponse: {"status", "headers", "body"},
	varStep:     {"name", "idempotency_key"},
}

var (
	envOnce sync.Once
	celEnv  *cel.Env
	envErr  error
)

func exprEnv() (*cel.Env, error) {
	envOnce.Do(func() {
		dynMap := cel.MapType(cel.StringType, cel.DynType)
		celEnv, envErr = cel.NewEnv(
			cel.Variable(varTrigger, dynMap),
			cel.Variable(varSaga, dynMap),
			cel.Variable(varSteps, dynMap),
			cel.Variable(varResult, dynMap),
			cel.Variable(varResponse, dynMap),
			cel.Variable(varReply, dynMap),
			cel.Variable(varSecrets, cel.MapType(cel.StringType, cel.StringType)),
			cel.Variable(varStep, cel.MapType(cel.StringType, cel.StringType)),
			// raw(x) is x: in http.url it says that x's text goes into the
			// URL as it is, not escaped for where it stands.
			cel.Function(funcRaw, cel.Overload("raw_dyn", []*cel.Type{cel.DynType}, cel.DynType,
				cel.UnaryBinding(func(v ref.Val) ref.Val { return v }))),
		)
	})
	return celEnv, envErr
}

// scope says which names an expression may use where it stands.
type scope struct {
	// place names the field for messages ("steps[0].sql.params[1]").
	place string
	// steps maps the names of the steps whose outputs may be read to the
	// keys of their outputs (nil: keys not known statically).
	steps map[string]map[string]bool
	// stepOrder is every step name of the saga with its index, to tell a
	// later step from an unknown one.
	stepOrder map[string]int
	self      int
	// result, response, reply: available after the step's action.
	result, response, reply bool
	secrets                 bool
	// selfName and readsSelf, in a compensation: readsSelf is set when an
	// expression reads the step's own output.
	selfName  string
	readsSelf *bool
	// noSteps: no step output exists here (a trigger's filter).
	noSteps bool
	// step: in a compensation, the step it undoes (step.*).
	step bool
	// contracts are the triggers' schemas: a read of trigger.payload.X is
	// checked against the closed ones.
	contracts []*triggerContract
	// url: an http step's url, where raw(…) may stand.
	url bool
}

// funcRaw names the function that keeps an expression's text out of the
// URL's escaping.
const funcRaw = "raw"

// expr is one compiled ${ … } expression.
type expr struct {
	text      string
	file      string
	line, col int
	prg       cel.Program
	// secrets lists the secret names the expression reads.
	secrets []string
	// ast is the checked expression, for what a load reads of its form
	// (the literal start of a URL).
	ast *ast.AST
	// typ is the type the checker gives the result (dyn when it depends on
	// the data).
	typ *cel.Type
	// raw: the whole expression is raw(…), whose text a URL takes as it is.
	raw bool
}

func (e *expr) String() string { return "${ " + strings.TrimSpace(e.text) + " }" }

// eval runs the expression. A failure names the expression and where it is
// written: a missing field is an error, never a silent null.
func (e *expr) eval(vars map[string]any) (any, error) {
	out, _, err := e.prg.Eval(vars)
	if err != nil {
		return nil, fmt.Errorf("%s:%d:%d: expression %s failed: %v", e.file, e.line, e.col, e, err)
	}
	v, err := fromCEL(out)
	if err != nil {
		return nil, fmt.Errorf("%s:%d:%d: expression %s: %v", e.file, e.line, e.col, e, err)
	}
	return v, nil
}

// fromCEL turns a CEL value into a plain JSON value.
func fromCEL(v ref.Val) (any, error) { return celexpr.ToJSON(v) }

// compileExpr compiles and checks one expression that starts at (line, col)
// of file, reporting problems with the column inside the expression.
func compileExpr(text string, file string, line, col int, sc *scope, r *report) *expr {
	env, err := exprEnv()
	if err != nil {
		r.add(pos{line, col}, "expression environment: %v; report this as a bug", err)
		return nil
	}
	at := func(l ast.SourceInfo, id int64) pos {
		loc := l.GetStartLocation(id)
		if loc.Line() <= 1 {
			return pos{line, col + max(loc.Column(), 0)}
		}
		return pos{line + loc.Line() - 1, loc.Column() + 1}
	}
	if strings.TrimSpace(text) == "" {
		r.add(pos{line, col}, "empty expression ${ } in %s; write an expression inside ${ … } or remove it", sc.place)
		return nil
	}
	checked, iss := env.Compile(text)
	if iss != nil && iss.Err() != nil {
		for _, e := range iss.Errors() {
			p := pos{line, col + max(e.Location.Column(), 0)}
			if e.Location.Line() > 1 {
				p = pos{line + e.Location.Line() - 1, e.Location.Column() + 1}
			}
			r.add(p, "%s in %s; %s", celMessage(e.Message), sc.place, celFix(e.Message))
		}
		return nil
	}
	x := &expr{text: text, file: file, line: line, col: col, typ: checked.OutputType()}
	native := checked.NativeRep()
	x.ast = native
	info := native.SourceInfo()
	ok := true
	bad := func(id int64, format string, args ...any) {
		ok = false
		p := at(*info, id)
		if e, found := findExpr(native.Expr(), id); found && e.Kind() == ast.SelectKind {
			// CEL places a selection at its dot; the field name follows.
			p.Col++
		}
		r.add(p, format, args...)
	}
	visitNames(native.Expr(), func(e ast.Expr) {
		switch e.Kind() {
		case ast.CallKind:
			if e.AsCall().FunctionName() != funcRaw {
				return
			}
			switch {
			case !sc.url:
				bad(e.ID(), "raw(…) in %s: raw only keeps a value of an http step's url from being escaped; remove it", sc.place)
			case e.ID() != native.Expr().ID():
				bad(e.ID(), "raw(…) in %s must be the whole expression, ${ raw(…) }; put what it wraps inside it", sc.place)
			default:
				x.raw = true
			}
		case ast.IdentKind:
			switch e.AsIdent() {
			case varResult:
				if !sc.result {
					bad(e.ID(), "result is not available in %s; result is what a step's own sql returned: use it only in that step's output and emit", sc.place)
				}
			case varResponse:
				if !sc.response {
					bad(e.ID(), "response is not available in %s; response is what a step's own http call returned: use it only in that step's output and emit", sc.place)
				}
			case varReply:
				if !sc.reply {
					bad(e.ID(), "reply is not available in %s; reply is what a step's own command got back: use it only in that step's output and emit", sc.place)
				}
			case varStep:
				if !sc.step {
					bad(e.ID(), "step is not available in %s; step (name, idempotency_key) is the step a compensation undoes: use it only in compensate", sc.place)
				}
			case varSecrets:
				if !sc.secrets {
					bad(e.ID(), "secrets may not be used in %s; secrets are allowed only in http.url and http.headers, so that they never reach the journal", sc.place)
				}
			}
		case ast.SelectKind:
			sel := e.AsSelect()
			op := sel.Operand()
			if op.Kind() != ast.IdentKind {
				if op.Kind() == ast.SelectKind && op.AsSelect().Operand().Kind() == ast.IdentKind &&
					op.AsSelect().Operand().AsIdent() == varTrigger && op.AsSelect().FieldName() == "payload" && !sel.IsTestOnly() {
					if msg, ok := checkPayloadFields(sel.FieldName(), sc.contracts); !ok {
						bad(e.ID(), "%s; read only fields the schema has, or let it allow more", msg)
					}
				}
				if op.Kind() == ast.SelectKind && op.AsSelect().Operand().Kind() == ast.IdentKind &&
					op.AsSelect().Operand().AsIdent() == varSteps && !sel.IsTestOnly() {
					step := op.AsSelect().FieldName()
					if keys, known := sc.steps[step]; known && keys != nil && !keys[sel.FieldName()] {
						bad(e.ID(), "step %s has no output %q; its output has: %s", step, sel.FieldName(), strings.Join(sortedKeys(keys), ", "))
					}
				}
				return
			}
			root, field := op.AsIdent(), sel.FieldName()
			if fields, fixed := fixedFields[root]; fixed && !contains(fields, field) {
				bad(e.ID(), "%s has no field %q; use one of: %s", root, field, strings.Join(fields, ", "))
			}
			if root == varSteps && field == sc.selfName && sc.readsSelf != nil {
				*sc.readsSelf = true
			}
			if root == varSteps && sc.noSteps {
				who := "a trigger's filter"
				if strings.HasPrefix(sc.place, "concurrency") {
					who = "the concurrency key, computed when the instance starts,"
				}
				bad(e.ID(), "steps are not available in %s; %s sees only the event (trigger.*) and saga.name and saga.version", sc.place, who)
				return
			}
			if root == varSteps {
				if _, ok := sc.steps[field]; !ok {
					if i, exists := sc.stepOrder[field]; !exists {
						bad(e.ID(), "steps.%s names no step of this saga; use one of the steps before this one", field)
					} else if i == sc.self {
						bad(e.ID(), "steps.%s is this step's own output, which does not exist yet; read it only in the step's compensate", field)
					} else if i > sc.self {
						bad(e.ID(), "steps.%s is a later step; an expression can read only the outputs of the steps before it", field)
					} else {
						bad(e.ID(), "step %s declares no output; add output: { … } to step %s", field, field)
					}
				}
			}
			if root == varSecrets && sc.secrets {
				x.secrets = append(x.secrets, field)
			}
		}
	})
	if !ok {
		return nil
	}
	prg, err := env.Program(checked, cel.CostLimit(costLimit), cel.EvalOptions(cel.OptOptimize))
	if err != nil {
		r.add(pos{line, col}, "expression %q in %s: %v; simplify it", text, sc.place, err)
		return nil
	}
	x.prg = prg
	return x
}

func celMessage(m string) string {
	return strings.TrimPrefix(m, "ERROR: ")
}

func celFix(m string) string {
	switch {
	case strings.Contains(m, "undeclared reference"):
		return "the names in scope are trigger, saga, steps, and after a step's action result, response or reply"
	case strings.Contains(m, "no matching overload"):
		return "convert one side, e.g. string(x) or int(x)"
	case strings.Contains(m, "Syntax error"):
		return "fix the CEL syntax"
	}
	return "see the CEL language definition"
}

// findExpr returns the node with the given id.
func findExpr(root ast.Expr, id int64) (ast.Expr, bool) {
	var out ast.Expr
	visitNames(root, func(e ast.Expr) {
		if e.ID() == id {
			out = e
		}
	})
	return out, out != nil
}

// visitNames calls f on every expression node, depth first.
func visitNames(e ast.Expr, f func(ast.Expr)) {
	if e == nil {
		return
	}
	f(e)
	switch e.Kind() {
	case ast.SelectKind:
		visitNames(e.AsSelect().Operand(), f)
	case ast.CallKind:
		c := e.AsCall()
		if c.IsMemberFunction() {
			visitNames(c.Target(), f)
		}
		for _, a := range c.Args() {
			visitNames(a, f)
		}
	case ast.ListKind:
		for _, x := range e.AsList().Elements() {
			visitNames(x, f)
		}
	case ast.MapKind:
		for _, en := range e.AsMap().Entries() {
			me := en.AsMapEntry()
			visitNames(me.Key(), f)
			visitNames(me.Value(), f)
		}
	case ast.StructKind:
		for _, fl := range e.AsStruct().Fields() {
			visitNames(fl.AsStructField().Value(), f)
		}
	case ast.ComprehensionKind:
		c := e.AsComprehension()
		visitNames(c.IterRange(), f)
		visitNames(c.AccuInit(), f)
		visitNames(c.LoopCondition(), f)
		visitNames(c.LoopStep(), f)
		visitNames(c.Result(), f)
	}
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// template is a value as written in the file: a literal, one expression
// that keeps its type, text with expressions (a string), or a map or list of
// templates.
type template struct {
	literal any
	single  *expr
	parts   []part
	isText  bool
	keys    []string
	fields  map[string]*template
	items   []*template
	isMap   bool
	isList  bool
	at      pos
}

type part struct {
	text string
	e    *expr
}

// compileTemplate compiles the templates of a YAML value.
func compileTemplate(n *yaml.Node, file string, sc *scope, r *report) *template {
	if n == nil {
		return nil
	}
	t := &template{at: nodeAt(n)} // an alias is refused by the conversion
	switch n.Kind {
	case yaml.MappingNode:
		t.isMap = true
		t.fields = map[string]*template{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i].Value
			sub := *sc
			sub.place = sc.place + "." + k
			t.keys = append(t.keys, k)
			t.fields[k] = compileTemplate(n.Content[i+1], file, &sub, r)
		}
		return t
	case yaml.SequenceNode:
		t.isList = true
		for i, c := range n.Content {
			sub := *sc
			sub.place = fmt.Sprintf("%s[%d]", sc.place, i)
			t.items = append(t.items, compileTemplate(c, file, &sub, r))
		}
		return t
	case yaml.ScalarNode:
		if n.ShortTag() != "!!str" || !strings.Contains(n.Value, "${") {
			t.literal = plain(scalarValue(n))
			return t
		}
		t.parts = splitTemplate(n, file, sc, r)
		if len(t.parts) == 1 && t.parts[0].e != nil {
			t.single = t.parts[0].e
			t.parts = nil
		} else {
			t.isText = true
		}
		return t
	}
	return t
}

// splitTemplate cuts a string into text and ${ … } expressions, compiling
// each expression at its place in the file.
func splitTemplate(n *yaml.Node, file string, sc *scope, r *report) []part {
	s := n.Value
	var out []part
	for {
		i := strings.Index(s[0:], "${")
		if i < 0 {
			if s != "" {
				out = append(out, part{text: s})
			}
			return out
		}
		start := len(n.Value) - len(s) + i // offset of "${" in the value
		if i > 0 {
			out = append(out, part{text: s[:i]})
		}
		end := closingBrace(s[i+2:])
		line, col := valueOffset(n, start+2)
		if end < 0 {
			r.add(pos{line, col - 2}, "${ is not closed in %s; end the expression with }", sc.place)
			return nil
		}
		e := compileExpr(s[i+2:i+2+end], file, line, col, sc, r)
		if e == nil {
			return nil
		}
		out = append(out, part{e: e})
		s = s[i+2+end+1:]
	}
}

// closingBrace finds the } that ends an expression (see celexpr.ClosingBrace).
func closingBrace(s string) int { return celexpr.ClosingBrace(s) }

// valueOffset is the file position of byte off of a scalar's value (see
// celexpr.ValueOffset).
func valueOffset(n *yaml.Node, off int) (int, int) { return celexpr.ValueOffset(n, off) }

// eval renders the template against vars.
func (t *template) eval(vars map[string]any) (any, error) {
	if t == nil {
		return nil, nil
	}
	switch {
	case t.single != nil:
		return t.single.eval(vars)
	case t.isText:
		var b strings.Builder
		for _, p := range t.parts {
			if p.e == nil {
				b.WriteString(p.text)
				continue
			}
			v, err := p.e.eval(vars)
			if err != nil {
				return nil, err
			}
			b.WriteString(textOf(v))
		}
		return b.String(), nil
	case t.isMap:
		out := make(map[string]any, len(t.keys))
		for _, k := range t.keys {
			v, err := t.fields[k].eval(vars)
			if err != nil {
				return nil, err
			}
			out[k] = v
		}
		return out, nil
	case t.isList:
		out := make([]any, 0, len(t.items))
		for _, it := range t.items {
			v, err := it.eval(vars)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		}
		return out, nil
	}
	return t.literal, nil
}

// evalText renders a template that must give text.
func (t *template) evalText(vars map[string]any) (string, error) {
	if t == nil {
		return "", nil
	}
	v, err := t.eval(vars)
	if err != nil {
		return "", err
	}
	return textOf(v), nil
}

// textOf writes a value into text: strings as they are, numbers in JSON
// form, the rest as JSON.
func textOf(v any) string { return celexpr.Text(v) }

// secretNames lists every secret a template reads.
func (t *template) secretNames() []string {
	if t == nil {
		return nil
	}
	var out []string
	if t.single != nil {
		out = append(out, t.single.secrets...)
	}
	for _, p := range t.parts {
		if p.e != nil {
			out = append(out, p.e.secrets...)
		}
	}
	for _, k := range t.keys {
		out = append(out, t.fields[k].secretNames()...)
	}
	for _, it := range t.items {
		out = append(out, it.secretNames()...)
	}
	return out
}
