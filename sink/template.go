package sink

import (
	"fmt"
	"strings"

	"github.com/compensa/compensa/internal/expr"
)

// Template is a subject or topic with placeholders taken from the event:
// {aggregate_type}, {event_type}, {aggregate_id}, {tenant_id}. Each value
// fills one token of the name: a '.' in it, which would start another
// token, is escaped with the broker's other refused characters, so that
// event data cannot move a message to another part of the name space.
// {raw(event_type)} keeps the value's dots as token separators, for names
// whose layout follows dotted event types; each of its tokens is still
// cleaned.
//
// A ${ … } expression (CEL over event, see Expr) stands where a
// placeholder may: its result, as text, fills one token and is cleaned
// exactly like a placeholder's value, so that a payload cannot choose a
// name outside the template either.
type Template struct {
	parts []templatePart
	raw   string
}

type templatePart struct {
	literal string
	field   string // one of placeholders, or "" for a literal
	// raw: {raw(field)}, whose dots separate tokens.
	raw bool
	// x is a ${ … } expression.
	x *Expr
}

var placeholders = []string{"aggregate_type", "event_type", "aggregate_id", "tenant_id"}

// ParseTemplate parses s; the error says which placeholder or brace is wrong.
func ParseTemplate(s string) (Template, error) {
	t := Template{raw: s}
	rest := s
	for rest != "" {
		if i := strings.Index(rest, "${"); i >= 0 && strings.IndexAny(rest[:i], "{}") < 0 {
			if i > 0 {
				t.parts = append(t.parts, templatePart{literal: rest[:i]})
			}
			end := expr.ClosingBrace(rest[i+2:])
			if end < 0 {
				return Template{}, fmt.Errorf("%q has a '${' without its '}'", s)
			}
			x, err := CompileExpr(rest[i+2 : i+2+end])
			if err != nil {
				return Template{}, err
			}
			t.parts = append(t.parts, templatePart{x: x})
			rest = rest[i+2+end+1:]
			continue
		}
		open := strings.IndexAny(rest, "{}")
		if open < 0 {
			t.parts = append(t.parts, templatePart{literal: rest})
			break
		}
		if rest[open] == '}' {
			return Template{}, fmt.Errorf("%q has a '}' without its '{'", s)
		}
		if open > 0 {
			t.parts = append(t.parts, templatePart{literal: rest[:open]})
		}
		end := strings.IndexByte(rest[open:], '}')
		if end < 0 {
			return Template{}, fmt.Errorf("%q has a '{' without its '}'", s)
		}
		name := rest[open+1 : open+end]
		raw := false
		if inner, ok := strings.CutPrefix(name, "raw("); ok && strings.HasSuffix(inner, ")") {
			name, raw = strings.TrimSuffix(inner, ")"), true
		}
		known := false
		for _, p := range placeholders {
			known = known || p == name
		}
		if !known {
			return Template{}, fmt.Errorf("%q uses unknown placeholder {%s}; use {%s}, or {raw(%s)} to keep a value's dots as token separators", s, name, strings.Join(placeholders, "}, {"), placeholders[1])
		}
		t.parts = append(t.parts, templatePart{field: name, raw: raw})
		rest = rest[open+end+1:]
	}
	if len(t.parts) == 0 {
		return Template{}, fmt.Errorf("is empty")
	}
	return t, nil
}

// MustTemplate parses a template known to be valid.
func MustTemplate(s string) Template {
	t, err := ParseTemplate(s)
	if err != nil {
		panic(err)
	}
	return t
}

// String returns the template as written.
func (t Template) String() string { return t.raw }

// Literal reports whether the template has no placeholder.
func (t Template) Literal() bool {
	for _, p := range t.parts {
		if p.field != "" || p.x != nil {
			return false
		}
	}
	return true
}

// literalText is the template's literal parts, for checks of what it
// writes as it is.
func (t Template) literalText() string {
	var b strings.Builder
	for _, p := range t.parts {
		b.WriteString(p.literal)
	}
	return b.String()
}

// Prefix returns the literal text before the first placeholder.
func (t Template) Prefix() string {
	var b strings.Builder
	for _, p := range t.parts {
		if p.field != "" || p.x != nil {
			break
		}
		b.WriteString(p.literal)
	}
	return b.String()
}

// Expand is Render for a template whose expressions cannot fail; an
// expression that fails fills its token with "_". A sink delivers with
// Render, which refuses the event instead.
func (t Template) Expand(ev *Event, clean func(string) string) string {
	out, _ := t.render(ev, clean, false)
	return out
}

// Render fills the placeholders and expressions from ev; clean rewrites
// each value (a broker's rules for one token of a name, '.' included), and
// an empty value becomes "_". A {raw(…)} value is cut at its dots and each
// token is cleaned on its own. An expression's result is cleaned like a
// placeholder's value. The error is an expression failing for ev.
func (t Template) Render(ev *Event, clean func(string) string) (string, error) {
	return t.render(ev, clean, true)
}

func (t Template) render(ev *Event, clean func(string) string, strict bool) (string, error) {
	var b strings.Builder
	var vars map[string]any
	for _, p := range t.parts {
		if p.x != nil {
			if vars == nil {
				vars = EventVars(ev)
			}
			v, err := p.x.Eval(vars)
			if err != nil && strict {
				return "", fmt.Errorf("template %s: %w", t.raw, err)
			}
			b.WriteString(cleanValue(expr.Text(v), clean))
			continue
		}
		if p.field == "" {
			b.WriteString(p.literal)
			continue
		}
		var v string
		switch p.field {
		case "aggregate_type":
			v = ev.AggregateType
		case "event_type":
			v = ev.EventType
		case "aggregate_id":
			v = ev.AggregateID
		case "tenant_id":
			v = ev.TenantID
		}
		if p.raw {
			tokens := strings.Split(v, ".")
			for i, tok := range tokens {
				tokens[i] = cleanValue(tok, clean)
			}
			v = strings.Join(tokens, ".")
		} else {
			v = cleanValue(v, clean)
		}
		b.WriteString(v)
	}
	return b.String(), nil
}

func cleanValue(v string, clean func(string) string) string {
	if clean != nil {
		v = clean(v)
	}
	if v == "" {
		return "_"
	}
	return v
}
