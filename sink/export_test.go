package sink

import (
	"cel.dev/cel-go/cel"

	"github.com/compensa/compensa/internal/expr"
)

// ExprCost evaluates x as Eval does, with the cost tracked: what the
// evaluation cost and its error.
func ExprCost(x *Expr, vars map[string]any) (uint64, error) {
	env, err := exprEnv()
	if err != nil {
		return 0, err
	}
	prg, err := env.Program(x.checked, cel.CostLimit(expr.CostLimit), cel.EvalOptions(cel.OptOptimize, cel.OptTrackCost))
	if err != nil {
		return 0, err
	}
	_, det, err := prg.Eval(vars)
	if det == nil || det.ActualCost() == nil {
		return 0, err
	}
	return *det.ActualCost(), err
}
