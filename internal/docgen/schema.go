package docgen

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
)

// schema is a JSON Schema (or an OpenAPI schema object) as decoded JSON.
type schema = map[string]any

// decode reads JSON keeping objects' key order out of the way: the pages
// list properties in the order the file gives them, so that a reference reads
// like the file it describes.
func decode(b []byte) (schema, []string, error) {
	var s schema
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, nil, err
	}
	return s, nil, nil
}

// orderedKeys returns the keys of the object found at path in the raw JSON,
// in the order they are written. encoding/json loses that order in maps.
func orderedKeys(raw []byte, path ...string) []string {
	var cur json.RawMessage = raw
	for _, p := range path {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(cur, &m); err != nil {
			return nil
		}
		cur = m[p]
		if cur == nil {
			return nil
		}
	}
	dec := json.NewDecoder(strings.NewReader(string(cur)))
	tok, err := dec.Token()
	if err != nil || tok != json.Delim('{') {
		return nil
	}
	var keys []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return keys
		}
		k, _ := tok.(string)
		keys = append(keys, k)
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return keys
		}
	}
	return keys
}

// renderer turns schemas into Markdown tables. refName maps a $ref to the
// section it names (its name and anchor); raw is the whole document, for
// key order.
type renderer struct {
	raw     []byte
	refName func(ref string) (name, anchor string)
}

// typeOf describes a schema in a few words: `string`, `integer ≥ 1`,
// [Step](#step), `array` of [Step](#step), one of `a`, `b`.
func (r renderer) typeOf(s schema) string {
	if s == nil {
		return "any"
	}
	if ref, ok := s["$ref"].(string); ok {
		name, anchor := r.refName(ref)
		return fmt.Sprintf("[%s](#%s)", name, anchor)
	}
	if e, ok := s["enum"].([]any); ok {
		var vs []string
		for _, v := range e {
			b, _ := json.Marshal(v)
			vs = append(vs, "`"+strings.Trim(string(b), `"`)+"`")
		}
		return "one of " + strings.Join(vs, ", ")
	}
	for _, k := range []string{"oneOf", "anyOf"} {
		if alts, ok := s[k].([]any); ok {
			var vs []string
			for _, a := range alts {
				as, _ := a.(schema)
				vs = append(vs, r.typeOf(as))
			}
			return strings.Join(vs, " or ")
		}
	}
	var types []string
	switch t := s["type"].(type) {
	case string:
		types = []string{t}
	case []any:
		for _, v := range t {
			if v, ok := v.(string); ok {
				types = append(types, v)
			}
		}
	}
	if len(types) == 0 {
		if _, ok := s["properties"]; ok {
			types = []string{"object"}
		} else {
			return "any"
		}
	}
	var out []string
	for _, t := range types {
		switch t {
		case "array":
			item, _ := s["items"].(schema)
			if item != nil {
				out = append(out, "array of "+r.typeOf(item))
			} else {
				out = append(out, "`array`")
			}
		case "object":
			if ap, ok := s["additionalProperties"].(schema); ok && s["properties"] == nil {
				out = append(out, "map of "+r.typeOf(ap))
			} else {
				out = append(out, "`object`")
			}
		default:
			w := "`" + t + "`"
			if f, ok := s["format"].(string); ok && t == "string" {
				w = "`string` (" + f + ")"
			}
			out = append(out, w)
		}
	}
	return strings.Join(out, " or ")
}

// constraints lists what a schema requires of a value besides its type.
func constraints(s schema) string {
	var cs []string
	num := func(k, label string) {
		if v, ok := s[k].(float64); ok {
			cs = append(cs, fmt.Sprintf("%s %v", label, v))
		}
	}
	num("minimum", "minimum")
	num("maximum", "maximum")
	num("minLength", "at least")
	if v, ok := s["minLength"].(float64); ok {
		cs[len(cs)-1] = plural("at least %v character", v)
	}
	num("maxLength", "at most")
	if v, ok := s["maxLength"].(float64); ok {
		cs[len(cs)-1] = plural("at most %v character", v)
	}
	if v, ok := s["minItems"].(float64); ok {
		cs = append(cs, plural("at least %v item", v))
	}
	if v, ok := s["maxItems"].(float64); ok {
		cs = append(cs, plural("at most %v item", v))
	}
	if p, ok := s["pattern"].(string); ok {
		cs = append(cs, "matches `"+strings.ReplaceAll(p, "|", `\|`)+"`")
	}
	if d, ok := s["default"]; ok {
		b, _ := json.Marshal(d)
		cs = append(cs, "default `"+string(b)+"`")
	}
	return strings.Join(cs, "; ")
}

// plural formats a count and its noun, with an s unless the count is 1.
func plural(format string, n float64) string {
	s := fmt.Sprintf(format, n)
	if n != 1 {
		s += "s"
	}
	return s
}

// cell makes text fit one Markdown table cell.
func cell(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	return strings.ReplaceAll(s, "|", `\|`)
}

// rows writes one table row per property of s, and for a property that is an
// inline object (or an array of them) with properties of its own, rows for
// those under a dotted name (items of an array get []).
func (r renderer) rows(b *strings.Builder, s schema, prefix string, path []string) {
	props, _ := s["properties"].(schema)
	if len(props) == 0 {
		return
	}
	required := map[string]bool{}
	if req, ok := s["required"].([]any); ok {
		for _, k := range req {
			if k, ok := k.(string); ok {
				required[k] = true
			}
		}
	}
	keys := orderedKeys(r.raw, append(path, "properties")...)
	if len(keys) != len(props) {
		keys = keys[:0]
		for k := range props {
			keys = append(keys, k)
		}
		sort.Strings(keys)
	}
	for _, k := range keys {
		p, _ := props[k].(schema)
		req := ""
		if required[k] {
			req = "yes"
		}
		desc := cell(str(p["description"]))
		if c := constraints(p); c != "" {
			if desc != "" {
				desc += " "
			}
			desc += "(" + cell(c) + ")"
		}
		fmt.Fprintf(b, "| `%s%s` | %s | %s | %s |\n", prefix, k, r.typeOf(p), req, desc)
		sub := append(append([]string{}, path...), "properties", k)
		if _, ok := p["properties"]; ok {
			r.rows(b, p, prefix+k+".", sub)
		} else if item, ok := p["items"].(schema); ok {
			if _, ok := item["properties"]; ok {
				r.rows(b, item, prefix+k+"[].", append(sub, "items"))
			}
		}
	}
}

// table writes the table of s's properties, or nothing when it has none.
func (r renderer) table(b *strings.Builder, s schema, path []string) bool {
	if props, _ := s["properties"].(schema); len(props) == 0 {
		return false
	}
	b.WriteString("| key | type | required | meaning |\n|---|---|---|---|\n")
	r.rows(b, s, "", path)
	return true
}

func str(v any) string {
	s, _ := v.(string)
	return s
}

// anchor is GitHub's anchor for a heading.
func anchor(heading string) string {
	var b strings.Builder
	for _, c := range strings.ToLower(heading) {
		switch {
		case c == ' ':
			b.WriteByte('-')
		case c == '-' || c == '_' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9':
			b.WriteRune(c)
		}
	}
	return b.String()
}

// JSONSchema renders a JSON Schema file (with its $defs) as a Markdown page.
// source is the file's path in the repository, named on the page.
func JSONSchema(raw []byte, title, source, intro string) ([]byte, error) {
	s, _, err := decode(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", source, err)
	}
	r := renderer{raw: raw, refName: func(ref string) (string, string) {
		name := ref[strings.LastIndex(ref, "/")+1:]
		return name, anchor(name)
	}}
	var b strings.Builder
	fmt.Fprintf(&b, "# %s\n\n", title)
	fmt.Fprintf(&b, "<!-- Generated by `make docs` from %s; edit the schema, not this page. -->\n\n", source)
	if d := str(s["description"]); d != "" {
		b.WriteString(d + "\n\n")
	}
	if intro != "" {
		b.WriteString(intro + "\n\n")
	}
	fmt.Fprintf(&b, "The schema: [`%s`](../../%s).\n\n", source, source)
	b.WriteString("## Top level\n\n")
	if !r.table(&b, s, nil) {
		b.WriteString("Type: " + r.typeOf(s) + ".\n")
	}
	defs, _ := s["$defs"].(schema)
	for _, name := range orderedKeys(raw, "$defs") {
		d, _ := defs[name].(schema)
		fmt.Fprintf(&b, "\n## %s\n\n", name)
		if desc := str(d["description"]); desc != "" {
			b.WriteString(cell(desc) + "\n\n")
		}
		if !r.table(&b, d, []string{"$defs", name}) {
			line := "Type: " + r.typeOf(d)
			if c := constraints(d); c != "" {
				line += " (" + c + ")"
			}
			if item, ok := d["items"].(schema); ok {
				if c := constraints(item); c != "" {
					line += "; each item " + c
				}
				if desc := str(item["description"]); desc != "" {
					line += ". " + cell(desc)
				}
			}
			b.WriteString(strings.TrimSuffix(line, ".") + ".\n")
		}
	}
	return []byte(b.String()), nil
}
