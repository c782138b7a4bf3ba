// Package expr holds what every `${ … }` CEL expression of a hand-written
// file shares, whoever compiles it (declared sagas, sinks): the cost limit
// of one evaluation, how an expression is cut out of a string, and how its
// CEL result becomes a plain JSON value or text. Each user keeps its own
// environment (the names in scope) and its own messages; what is here
// behaves the same for all of them.
package expr

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
	"cel.dev/cel-go/common/types/traits"
	"go.yaml.in/yaml/v3"
)

// CostLimit bounds one evaluation: an expression that loops over a huge
// list stops with an error instead of holding a worker.
const CostLimit = 1_000_000

// ToJSON turns a CEL value into a plain JSON value (nil, bool, int64,
// float64, string, map[string]any, []any). Bytes become base64, timestamps
// RFC 3339 text, durations Go duration text; NaN, infinities and maps
// with keys that are not strings are errors.
func ToJSON(v ref.Val) (any, error) {
	switch t := v.(type) {
	case types.Null:
		return nil, nil
	case types.Bool:
		return bool(t), nil
	case types.Int:
		return int64(t), nil
	case types.Uint:
		if uint64(t) > math.MaxInt64 {
			return float64(t), nil
		}
		return int64(t), nil
	case types.Double:
		f := float64(t)
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return nil, fmt.Errorf("the result %v is not a JSON number", f)
		}
		return f, nil
	case types.String:
		return string(t), nil
	case types.Bytes:
		return base64.StdEncoding.EncodeToString([]byte(t)), nil
	case types.Timestamp:
		return t.Time.UTC().Format(time.RFC3339Nano), nil
	case types.Duration:
		return t.Duration.String(), nil
	case *types.Err:
		return nil, t
	}
	if m, ok := v.(traits.Mapper); ok {
		out := map[string]any{}
		it := m.Iterator()
		for it.HasNext() == types.True {
			k := it.Next()
			ks, ok := k.(types.String)
			if !ok {
				return nil, fmt.Errorf("a map key %v is not a string; JSON objects have string keys", k)
			}
			x, err := ToJSON(m.Get(k))
			if err != nil {
				return nil, err
			}
			out[string(ks)] = x
		}
		return out, nil
	}
	if l, ok := v.(traits.Lister); ok {
		var out []any
		it := l.Iterator()
		for it.HasNext() == types.True {
			x, err := ToJSON(it.Next())
			if err != nil {
				return nil, err
			}
			out = append(out, x)
		}
		if out == nil {
			out = []any{}
		}
		return out, nil
	}
	if n := v.Value(); n != nil {
		return n, nil
	}
	return nil, fmt.Errorf("a %s value cannot be written as JSON", v.Type())
}

// ClosingBrace finds the } that ends an expression whose text starts at
// s[0] (just after "${"), skipping braces inside CEL string literals and
// nested map literals. -1 when there is none.
func ClosingBrace(s string) int {
	depth := 0
	var quote byte
	for i := 0; i < len(s); i++ {
		c := s[i]
		if quote != 0 {
			if c == '\\' {
				i++
			} else if c == quote {
				quote = 0
			}
			continue
		}
		switch c {
		case '\'', '"':
			quote = c
		case '{':
			depth++
		case '}':
			if depth == 0 {
				return i
			}
			depth--
		}
	}
	return -1
}

// Text writes a JSON value into text: strings as they are, numbers in JSON
// form, null as nothing, the rest as JSON.
func Text(v any) string {
	switch t := v.(type) {
	case string:
		return t
	case nil:
		return ""
	case int64:
		return strconv.FormatInt(t, 10)
	case float64:
		return strconv.FormatFloat(t, 'f', -1, 64)
	case bool:
		return strconv.FormatBool(t)
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// ValueOffset is the file position of byte off of a scalar's value. Exact
// for plain and quoted scalars on one line (quoted ones without escapes
// before off); for block scalars the line is exact and the column counts
// from the block's indentation.
func ValueOffset(n *yaml.Node, off int) (int, int) {
	before := n.Value[:off]
	switch n.Style {
	case yaml.LiteralStyle, yaml.FoldedStyle:
		nl := strings.Count(before, "\n")
		lineStart := strings.LastIndex(before, "\n") + 1
		return n.Line + 1 + nl, n.Column + 2 + len(before) - lineStart
	case yaml.DoubleQuotedStyle, yaml.SingleQuotedStyle:
		return n.Line, n.Column + 1 + off
	}
	if nl := strings.Count(before, "\n"); nl > 0 {
		return n.Line + nl, len(before) - strings.LastIndex(before, "\n")
	}
	return n.Line, n.Column + off
}
