package validate

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/checker"
	"cel.dev/cel-go/common/ast"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
	"cel.dev/cel-go/ext"
	"cel.dev/cel-go/parser"
)

// maxRangeSize caps lists.range(n): the list is allocated before any check can see it.
const maxRangeSize = 10_000

// celEnv is built once: it is immutable after construction and safe for concurrent use.
var celEnv = sync.OnceValues(newCELEnv)

// newCELEnv builds the environment every expression is compiled in, and
// readies it for concurrent use (warmCELEnv).
func newCELEnv() (*cel.Env, error) {
	env, err := cel.NewEnv(
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
		// Code points; compileExpr checks MaxExprLength in bytes before the parser runs.
		cel.ParserExpressionSizeLimit(MaxExprLength),
		cel.ParserRecursionLimit(MaxExprDepth),
	)
	if err != nil {
		return nil, err
	}
	warmCELEnv(env)
	return env, nil
}

// warmCELEnv compiles, once, an expression that names an undeclared
// identifier. cel-go (0.33.2) builds its type checker's environment at the
// first compile, and that environment's symbol catalog at the first
// undeclared identifier, under a sync.Once; but a comprehension's check
// copies the catalog field without the Once. Two expressions compiled at
// once, one naming an unknown identifier and one with a comprehension
// (`all`, `exists`, `map`), raced on it: go test -race saw it in CI. After
// this, the field is written before the environment is shared.
func warmCELEnv(env *cel.Env) {
	_, _ = env.Compile("valruns_undeclared_warm_up")
}

// compiledAssertion is an assertion as Compile checked it. Its cel.Program lives in each
// runner, planned with that runner's budget.
type compiledAssertion struct {
	Assertion // normalised: severity and message filled in
	step      string
	ast       *cel.Ast
}

// compileExpr parses, type-checks and bounds expr; on failure it returns a message for the
// workflow's author.
func compileExpr(expr string) (*cel.Ast, string) {
	if len(expr) > MaxExprLength {
		return nil, fmt.Sprintf("expression is %d bytes long, more than MaxExprLength (%d): split it into several assertions", len(expr), MaxExprLength)
	}
	env, err := celEnv()
	if err != nil {
		return nil, "CEL environment: " + err.Error()
	}
	checked, iss := env.Compile(expr)
	if err := iss.Err(); err != nil {
		msg := strings.TrimSpace(err.Error())
		// cel-go reports its parser's depth limit as text only ("max recursion depth
		// exceeded", without a position): say which limit, and what to do.
		if strings.Contains(msg, "recursion") {
			return nil, fmt.Sprintf("expression nests more than %d levels deep (MaxExprDepth): a chain a + b + c + ... "+
				"nests one level per operator; split it into several assertions, or combine with && (which does not nest)", MaxExprDepth)
		}
		return nil, msg
	}
	// dyn is accepted: `submission.ok` can only be checked against a submission.
	if out := checked.OutputType(); !out.IsExactType(types.BoolType) && !out.IsExactType(types.DynType) {
		return nil, fmt.Sprintf("expression returns %s, want bool", out)
	}
	cost, err := env.EstimateCost(checked, sizeHints{})
	if err != nil {
		return nil, "cannot estimate the expression's cost: " + err.Error()
	}
	if cost.Max > MaxEstimatedCost {
		estimate := "cannot be bounded"
		if cost.Max < math.MaxUint64 {
			estimate = fmt.Sprintf("is estimated at %.2g", float64(cost.Max))
		}
		return nil, fmt.Sprintf("worst-case cost on a %d MiB submission %s, more than MaxEstimatedCost (%d): "+
			"a loop over a list of the submission inside another loop over it grows with the square of its size; "+
			"compare against a fixed list, or check one level at a time", SizeHintBytes>>20, estimate, MaxEstimatedCost)
	}
	return checked, ""
}

// sizeHints gives the static cost estimate the sizes of submission and metadata values for
// a SizeHintBytes submission (see SizeHintBytes).
type sizeHints struct{}

// elementShare is the size assumed for a value inside an element of a list or map: a
// SizeHintBytes submission of the smallest elements ("1,") has SizeHintBytes/2 of them.
const elementShare = 2

func (sizeHints) EstimateSize(n checker.AstNode) *checker.SizeEstimate {
	path := n.Path()
	if len(path) == 0 || (path[0] != "submission" && path[0] != "metadata") {
		// A value the estimate cannot size (the result of a call without a size estimate,
		// a type): at run time no value is larger than MaxValueSize.
		return &checker.SizeEstimate{Min: 0, Max: MaxValueSize}
	}
	for _, p := range path[1:] {
		// "@items", "@keys", "@values": inside an element.
		if strings.HasPrefix(p, "@") {
			return &checker.SizeEstimate{Min: 0, Max: elementShare}
		}
	}
	return &checker.SizeEstimate{Min: 0, Max: SizeHintBytes}
}

func (sizeHints) EstimateCallCost(string, string, *checker.AstNode, []checker.AstNode) *checker.CallEstimate {
	return nil
}

// newProgram plans a checked assertion for one runner: every call and list or map literal
// is counted against b (see decorate).
func newProgram(a *compiledAssertion, b *budget) (cel.Program, error) {
	env, err := celEnv()
	if err != nil {
		return nil, err
	}
	g, err := newGuards(b)
	if err != nil {
		return nil, err
	}
	return env.Program(a.ast, cel.CustomDecoratorV2(g.decorate))
}

// eval evaluates the assertion with the runner's program. ok is false when it yields a
// finding (the expression is false, or cannot be evaluated on this submission); err is the
// budget's error when a limit or ctx stopped it.
func (r *runner) eval(i int, vars cel.Activation, timeout time.Duration) (f Finding, ok bool, err error) {
	a := &r.program.assertions[i]
	r.b.startAssertion(a.Name, timeout)
	out, _, evalErr := r.evalProgram(i, vars)
	if r.b.err != nil {
		r.aborted = true
		return Finding{}, false, r.b.err
	}
	// A rule that cannot be evaluated on this submission keeps its own severity: see Finding.
	cannot := func(why string) (Finding, bool, error) {
		return Finding{Step: a.step, Severity: a.Severity,
			Message: fmt.Sprintf("assertion %s could not be evaluated: %s", a.Name, why)}, false, nil
	}
	if evalErr != nil {
		return cannot(evalErrorMessage(a.ast, evalErr))
	}
	b, isBool := out.(types.Bool)
	if !isBool {
		return cannot(fmt.Sprintf("result is %s, want bool", out.Type().TypeName()))
	}
	if b {
		return Finding{}, true, nil
	}
	return Finding{Step: a.step, Severity: a.Severity, Message: a.Message}, false, nil
}

// evalProgram runs one program, turning the budget's abort into an error: cel-go recovers
// panics inside its evaluation and returns them as errors, the budget says why.
func (r *runner) evalProgram(i int, vars cel.Activation) (out ref.Val, det *cel.EvalDetails, err error) {
	defer func() {
		if rec := recover(); rec != nil {
			if _, ok := rec.(abortSignal); !ok || r.b.err == nil {
				panic(rec)
			}
			err = r.b.err
		}
	}()
	return r.progs[i].Eval(vars)
}

// evalErrorMessage says why an expression could not be evaluated and, when the error names
// the expression node that failed, where: "no such key: missing at submission.missing".
func evalErrorMessage(checked *cel.Ast, err error) string {
	msg := err.Error()
	var celErr *types.Err
	if !errors.As(err, &celErr) || celErr.NodeID() == 0 {
		return msg
	}
	var opErr *operandsError
	if errors.As(celErr, &opErr) {
		if where := exprText(checked, opErr.at); where != "" {
			return msg + " at " + where
		}
		return msg
	}
	if where := exprText(checked, celErr.NodeID()); where != "" {
		return msg + " at " + where
	}
	return msg
}

// maxWhereLen bounds the expression text quoted in a message.
const maxWhereLen = 120

// exprText is the source text of the node id of checked, or "" when it has none.
func exprText(checked *cel.Ast, id int64) string {
	native := checked.NativeRep()
	var found ast.Expr
	ast.PostOrderVisit(native.Expr(), ast.NewExprVisitor(func(e ast.Expr) {
		if e.ID() == id {
			found = e
		}
	}))
	if found == nil {
		return ""
	}
	text, err := parser.Unparse(found, native.SourceInfo())
	if err != nil {
		return ""
	}
	if len(text) > maxWhereLen {
		text = text[:maxWhereLen] + "..."
	}
	return text
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
