package expr_test

import (
	"math"
	"testing"

	"cel.dev/cel-go/common/types"

	"github.com/compensa/compensa/internal/expr"
)

func TestClosingBrace(t *testing.T) {
	t.Parallel()
	for s, want := range map[string]int{
		" a }":              3,
		" {'k': 1}.k } x":   12,
		` "}" + '}' }`:      11,
		` "\"}" }`:          7,
		" a ":               -1,
		" {'unclosed': 1 }": -1,
	} {
		if got := expr.ClosingBrace(s); got != want {
			t.Errorf("ClosingBrace(%q) = %d, want %d", s, got, want)
		}
	}
}

func TestToJSONAndText(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   any
		text string
	}{{types.String("a"), "a"}, {types.Int(3), "3"}, {types.Double(1.5), "1.5"}, {types.Bool(true), "true"}, {types.NullValue, ""}} {
		v, err := expr.ToJSON(types.DefaultTypeAdapter.NativeToValue(c.in))
		if err != nil || expr.Text(v) != c.text {
			t.Errorf("%v: %v %v, want %q", c.in, v, err, c.text)
		}
	}
	if _, err := expr.ToJSON(types.Double(math.NaN())); err == nil {
		t.Error("NaN is not a JSON number")
	}
	if got := expr.Text(map[string]any{"a": []any{int64(1)}}); got != `{"a":[1]}` {
		t.Errorf("a map as text: %s", got)
	}
}
