package declare

import (
	"encoding/json"
	"math"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// nodeAt returns the position of a YAML node.
func nodeAt(n *yaml.Node) pos { return pos{Line: n.Line, Col: n.Column} }

// docValue converts a YAML node into the JSON-like value the schema checks
// (json.Number for numbers), recording where every value and every mapping
// key stands, by JSON pointer, so that a schema error can be placed.
type docValue struct {
	values map[string]*yaml.Node // pointer -> value node
	keys   map[string]*yaml.Node // pointer of a member -> its key node
}

func newDocValue() *docValue {
	return &docValue{values: map[string]*yaml.Node{}, keys: map[string]*yaml.Node{}}
}

func pointerJoin(ptr, token string) string {
	token = strings.ReplaceAll(token, "~", "~0")
	token = strings.ReplaceAll(token, "/", "~1")
	return ptr + "/" + token
}

func (d *docValue) convert(n *yaml.Node, ptr string, r *report, depth int) any {
	d.values[ptr] = n
	if n.Kind == yaml.AliasNode {
		// Refused rather than expanded: a hand-written definition does not
		// need them, and expanding them lets a small file grow without
		// bound (a "billion laughs" document).
		r.add(nodeAt(n), "aliases (*name) are not supported; write the value out")
		return nil
	}
	if depth > 64 {
		r.add(nodeAt(n), "the document nests deeper than 64 levels; flatten it")
		return nil
	}
	switch n.Kind {
	case yaml.DocumentNode:
		if len(n.Content) == 0 {
			return nil
		}
		return d.convert(n.Content[0], ptr, r, depth+1)
	case yaml.MappingNode:
		m := make(map[string]any, len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Kind != yaml.ScalarNode {
				r.add(nodeAt(k), "a mapping key must be plain text; write the key as a string")
				continue
			}
			if k.Tag == "!!merge" {
				r.add(nodeAt(k), "merge keys (<<) are not supported; write the keys out")
				continue
			}
			if _, dup := m[k.Value]; dup {
				r.add(nodeAt(k), "key %q appears twice in this mapping; keep one", k.Value)
				continue
			}
			child := pointerJoin(ptr, k.Value)
			d.keys[child] = k
			m[k.Value] = d.convert(v, child, r, depth+1)
		}
		return m
	case yaml.SequenceNode:
		l := make([]any, len(n.Content))
		for i, c := range n.Content {
			l[i] = d.convert(c, pointerJoin(ptr, strconv.Itoa(i)), r, depth+1)
		}
		return l
	case yaml.ScalarNode:
		return scalarValue(n)
	}
	return nil
}

// scalarValue reads a scalar by its resolved tag, the way YAML 1.2's core
// schema does (yaml.v3): numbers, booleans and null keep their type, the
// rest is text.
func scalarValue(n *yaml.Node) any {
	switch n.ShortTag() {
	case "!!null":
		return nil
	case "!!bool":
		var b bool
		if n.Decode(&b) == nil {
			return b
		}
	case "!!int":
		var i int64
		if n.Decode(&i) == nil {
			return json.Number(strconv.FormatInt(i, 10))
		}
		var f float64
		if n.Decode(&f) == nil && !math.IsInf(f, 0) && !math.IsNaN(f) {
			return json.Number(strconv.FormatFloat(f, 'g', -1, 64))
		}
	case "!!float":
		var f float64
		if n.Decode(&f) == nil && !math.IsInf(f, 0) && !math.IsNaN(f) {
			return json.Number(strconv.FormatFloat(f, 'g', -1, 64))
		}
	}
	return n.Value
}

// plain turns a converted value into plain Go JSON values: json.Number
// becomes int64 when whole, float64 otherwise.
func plain(v any) any {
	switch t := v.(type) {
	case json.Number:
		if i, err := t.Int64(); err == nil {
			return i
		}
		f, _ := t.Float64()
		return f
	case map[string]any:
		out := make(map[string]any, len(t))
		for k, x := range t {
			out[k] = plain(x)
		}
		return out
	case []any:
		out := make([]any, len(t))
		for i, x := range t {
			out[i] = plain(x)
		}
		return out
	}
	return v
}
