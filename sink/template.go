package sink

import (
	"fmt"
	"strings"
)

// Template is a subject or topic with placeholders taken from the event:
// {aggregate_type}, {event_type}, {aggregate_id}, {tenant_id}. Each value
// fills one token of the name: a '.' in it, which would start another
// token, is escaped with the broker's other refused characters, so that
// event data cannot move a message to another part of the name space.
// {raw(event_type)} keeps the value's dots as token separators, for names
// whose layout follows dotted event types; each of its tokens is still
// cleaned.
type Template struct {
	parts []templatePart
	raw   string
}

type templatePart struct {
	literal string
	field   string // one of placeholders, or "" for a literal
	// raw: {raw(field)}, whose dots separate tokens.
	raw bool
}

var placeholders = []string{"aggregate_type", "event_type", "aggregate_id", "tenant_id"}

// ParseTemplate parses s; the error says which placeholder or brace is wrong.
func ParseTemplate(s string) (Template, error) {
	t := Template{raw: s}
	rest := s
	for rest != "" {
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
		if p.field != "" {
			return false
		}
	}
	return true
}

// Prefix returns the literal text before the first placeholder.
func (t Template) Prefix() string {
	var b strings.Builder
	for _, p := range t.parts {
		if p.field != "" {
			break
		}
		b.WriteString(p.literal)
	}
	return b.String()
}

// Expand fills the placeholders from ev; clean rewrites each value (a
// broker's rules for one token of a name, '.' included), and an empty
// value becomes "_". A {raw(…)} value is cut at its dots and each token is
// cleaned on its own.
func (t Template) Expand(ev *Event, clean func(string) string) string {
	var b strings.Builder
	for _, p := range t.parts {
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
	return b.String()
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
