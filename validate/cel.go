package validate

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/ext"
)

// CostLimit bounds the runtime cost of one assertion evaluation (roughly the number of
// operations), so a runaway expression over a large submission cannot hang a worker.
const CostLimit = 1_000_000

// EvalTimeout bounds the wall time of one assertion evaluation, on top of CostLimit. The cost
// limit alone is not enough: cel-go's runtime cost tracker (v0.31, still in v0.32) takes time
// quadratic in the number of comprehension iterations, so `submission.items.all(...)` over
// 100k items stays under the limit yet runs for tens of seconds. Only pathological
// submissions come near it, so it is the one place where the outcome depends on machine speed.
const EvalTimeout = 5 * time.Second

// interruptCheckFrequency is how many comprehension iterations run between checks of ctx;
// comprehensions are the only place where an evaluation can run long.
const interruptCheckFrequency = 100

// maxRangeSize caps lists.range(n): the list is allocated before the cost limit can see it.
const maxRangeSize = 10_000

// celEnv is built once: it is immutable after construction and safe for concurrent use.
var celEnv = sync.OnceValues(func() (*cel.Env, error) {
	return cel.NewEnv(
		cel.Variable("submission", cel.DynType),
		cel.Variable("metadata", cel.MapType(cel.StringType, cel.DynType)),
		// JSON has one number type; `submission.price > 0.5` must work whatever the literal.
		cel.CrossTypeNumericComparisons(true),
		// submission.?field.orValue(x) is the natural way to treat optional JSON fields.
		cel.OptionalTypes(),
		ext.Strings(),
		ext.Encoders(),
		ext.Math(),
		ext.Lists(ext.ListsMaxRangeSize(maxRangeSize)),
		ext.Sets(),
	)
})

// compileExpr parses and type-checks expr; on failure it returns the compiler's message.
func compileExpr(expr string) (cel.Program, string) {
	env, err := celEnv()
	if err != nil {
		return nil, "CEL environment: " + err.Error()
	}
	ast, iss := env.Compile(expr)
	if err := iss.Err(); err != nil {
		return nil, strings.TrimSpace(err.Error())
	}
	// dyn is accepted: `submission.ok` can only be checked against a submission.
	if out := ast.OutputType(); !out.IsExactType(types.BoolType) && !out.IsExactType(types.DynType) {
		return nil, fmt.Sprintf("expression returns %s, want bool", out)
	}
	prg, err := env.Program(ast,
		cel.CostLimit(CostLimit),
		cel.InterruptCheckFrequency(interruptCheckFrequency),
	)
	if err != nil {
		return nil, err.Error()
	}
	return prg, ""
}

// eval evaluates the assertion; ok is false when it yields a finding (the expression is
// false, or cannot be evaluated on this submission).
func (a *compiledAssertion) eval(ctx context.Context, vars cel.Activation, timeout time.Duration) (f Finding, ok bool) {
	ctx, cancel := context.WithTimeoutCause(ctx, timeout, fmt.Errorf("evaluation took longer than %v", timeout))
	defer cancel()
	out, _, err := a.prg.ContextEval(ctx, vars)
	if err != nil {
		return Finding{
			Step:     a.step,
			Severity: SeverityError,
			Message:  fmt.Sprintf("assertion %s could not be evaluated: %v", a.Name, err),
		}, false
	}
	b, isBool := out.Value().(bool)
	if !isBool {
		return Finding{
			Step:     a.step,
			Severity: SeverityError,
			Message:  fmt.Sprintf("assertion %s could not be evaluated: result is %s, want bool", a.Name, out.Type().TypeName()),
		}, false
	}
	if b {
		return Finding{}, true
	}
	return Finding{Step: a.step, Severity: a.Severity, Message: a.Message}, false
}

// toCEL converts a decoded JSON tree in place: json.Number becomes int64 when it is integral
// and fits (so `x == 1` holds for 1.0), float64 otherwise; maps and slices are walked.
func toCEL(v any) any {
	switch v := v.(type) {
	case json.Number:
		return celNumber(v)
	case map[string]any:
		for k, e := range v {
			v[k] = toCEL(e)
		}
		return v
	case []any:
		for i, e := range v {
			v[i] = toCEL(e)
		}
		return v
	default:
		return v
	}
}

func celNumber(n json.Number) any {
	s := string(n)
	if i, err := strconv.ParseInt(s, 10, 64); err == nil {
		return i
	}
	// A JSON number always parses; out of range it is ±Inf, which CEL handles as a double.
	f, _ := strconv.ParseFloat(s, 64)
	// 2^63 is exact in float64; the range is [-2^63, 2^63).
	if f == math.Trunc(f) && f >= -(1<<63) && f < 1<<63 {
		return int64(f)
	}
	return f
}
