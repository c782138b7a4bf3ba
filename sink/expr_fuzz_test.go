package sink_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/compensa/compensa/internal/expr"
	"github.com/compensa/compensa/sink"
)

// FuzzExpression feeds expressions and events: compiling and evaluating
// never panics, and an evaluation either gives a value or an error (the
// cost limit stops an expensive one) well within a second.
func FuzzExpression(f *testing.F) {
	for _, s := range []struct{ expr, payload string }{
		{"event.payload.n % 2 == 0", `{"n":3}`},
		{"event.payload.xs.map(a, event.payload.xs.map(b, a + b))", `{"xs":[1,2,3]}`},
		{"{'a': event.aggregate_id, 'b': [event.payload.n, 1.5, null]}", `{"n":1}`},
		{"event.headers.traceparent", `null`},
		{"string(event.created_at)", `{}`},
		{"event.payload.s.size() > 2 ? 'x' : 'y'", `{"s":"abc"}`},
		{"1 / 0", `{}`},
		{"event.payload", `not json`},
		{"'a'.repeat(1000000)", `{}`},
	} {
		f.Add(s.expr, s.payload, "agg-1")
	}
	f.Fuzz(func(t *testing.T, text, payload, agg string) {
		x, err := sink.CompileExpr(text)
		if err != nil {
			return
		}
		ev := &sink.Event{ID: "e", AggregateID: agg, EventType: "t", Payload: json.RawMessage(payload),
			Headers: json.RawMessage(`{"traceparent":"x"}`), CreatedAt: time.Unix(0, 0)}
		vars := sink.EventVars(ev)
		start := time.Now()
		_, _ = x.Eval(vars)
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("%q took %s: the cost limit should stop it", text, d)
		}
		// The same evaluation with its cost tracked stays within the limit
		// (CEL stops it with an error once the limit is passed).
		if cost, err := sink.ExprCost(x, vars); err == nil && cost > expr.CostLimit {
			t.Fatalf("%q cost %d, above the limit %d", text, cost, expr.CostLimit)
		}
	})
}
