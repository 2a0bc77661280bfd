package validate

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"unicode/utf8"

	"cel.dev/cel-go/common/functions"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
	"cel.dev/cel-go/common/types/traits"
	"cel.dev/cel-go/interpreter"
)

// Why not cel.CostLimit: cel-go's runtime cost tracker charges by overload id, and on dyn
// operands (all of submission) the overload is resolved at run time, so `submission.s +
// submission.s` costs 1 whatever the length: a 69 KB expression built 946 MB of strings under
// a limit of 10^6. Its cost is also charged after a call returns, when join or format has
// already allocated, and it takes time quadratic in a loop's length (100k iterations: tens of
// seconds). The decorator below counts instead, per run: every call and literal, the sizes
// of what they build, and, before the calls whose cost depends on their arguments' size,
// that cost.

// guards decorates the nodes of one runner's programs with counters on its budget.
type guards struct {
	b *budget
}

func newGuards(b *budget) (*guards, error) {
	if _, err := guardedImpls(); err != nil {
		return nil, err
	}
	return &guards{b: b}, nil
}

// decorate wraps calls and list and map literals; it leaves attributes (the planner relies
// on their type), constants and the control flow of &&, || and ?: alone.
func (g *guards) decorate(i interpreter.InterpretableV2) (interpreter.InterpretableV2, error) {
	switch n := i.(type) {
	case interpreter.InterpretableAttribute, interpreter.InterpretableConst:
		return i, nil
	case interpreter.InterpretableCall:
		c := &countedCall{InterpretableCall: n, b: g.b, passThrough: passThrough[n.Function()]}
		if pre, ok := prechecks[n.Function()]; ok {
			impls, err := guardedImpls()
			if err != nil {
				return nil, err
			}
			c.impl = impls[n.OverloadID()]
			if c.impl == nil {
				c.impl = impls[n.Function()]
			}
			if c.impl != nil || isEquality(n.Function()) {
				c.pre = pre
			}
		}
		return c, nil
	case interpreter.InterpretableConstructor:
		return &countedConstructor{InterpretableConstructor: n, b: g.b}, nil
	}
	return i, nil
}

func isEquality(fn string) bool { return fn == "_==_" || fn == "_!=_" }

// precheck charges the cost of a call from its arguments and stops it, before it runs,
// when it would build a value past MaxValueSize.
type precheck func(b *budget, args []ref.Val)

// prechecks holds the functions whose cost or result size grows faster than their
// arguments' size, or with the nested size of a value rather than its length.
var prechecks = map[string]precheck{
	"_==_":            checkCompare,
	"_!=_":            checkCompare,
	"@in":             checkIn,
	"in":              checkIn,
	"_in_":            checkIn,
	"sets.contains":   checkSets,
	"sets.equivalent": checkSets,
	"sets.intersects": checkSets,
	"distinct":        checkDistinct,
	"join":            checkJoin,
	"replace":         checkReplace,
	"format":          checkFormat,
	"json.encode":     checkEncode,
	"flatten":         checkFlatten,
	"matches":         checkMatches,
}

// passThrough holds the functions whose result is a value that already exists (an element,
// an optional's content): it is not counted again as built.
var passThrough = map[string]bool{
	"_[_]": true, "_[?_]": true, "_?._": true, "orValue": true, "value": true, "or": true,
	"optional.of": true, "optional.ofNonZeroValue": true, "dyn": true, "first": true, "last": true,
}

// guardedImpls are the implementations of the guarded functions, by overload id and by
// function name (for dynamic dispatch), as the planner finds them.
var guardedImpls = sync.OnceValues(func() (map[string]*functions.Overload, error) {
	env, err := celEnv()
	if err != nil {
		return nil, err
	}
	impls := map[string]*functions.Overload{}
	fns := env.Functions()
	for name := range prechecks {
		fn, ok := fns[name]
		if !ok {
			continue
		}
		bindings, err := fn.Bindings()
		if err != nil {
			return nil, fmt.Errorf("bindings of %s: %w", name, err)
		}
		for _, o := range bindings {
			impls[o.Operator] = o
		}
	}
	return impls, nil
})

// countedCall counts a call, checks what it builds and, for guarded functions, evaluates the
// arguments itself so that it can check them before calling the implementation.
type countedCall struct {
	interpreter.InterpretableCall
	b           *budget
	pre         precheck
	impl        *functions.Overload // nil for == and !=
	passThrough bool
}

func (c *countedCall) Eval(a interpreter.Activation) ref.Val {
	return interpreter.EvalActivation(a, c.Exec)
}

func (c *countedCall) Exec(f *interpreter.ExecutionFrame) ref.Val {
	c.b.charge(1)
	if c.pre != nil {
		return c.guarded(f)
	}
	v := c.InterpretableCall.Exec(f)
	if e, isErr := v.(*types.Err); isErr {
		return c.explain(f, e, nil)
	}
	c.b.built(v, c.passThrough)
	return v
}

// guarded mirrors the interpreter's strict call (an error or unknown argument is the
// result), with the precheck between the arguments and the call.
func (c *countedCall) guarded(f *interpreter.ExecutionFrame) ref.Val {
	argNodes := c.Args()
	args := make([]ref.Val, len(argNodes))
	for i, a := range argNodes {
		args[i] = a.Exec(f)
		if types.IsUnknownOrError(args[i]) {
			return args[i]
		}
	}
	c.pre(c.b, args)
	var v ref.Val
	switch c.Function() {
	case "_==_":
		v = types.Equal(args[0], args[1])
	case "_!=_":
		v = types.Bool(types.Equal(args[0], args[1]) != types.True)
	default:
		v = c.dispatch(args)
	}
	if e, isErr := v.(*types.Err); isErr {
		return c.explain(f, e, args)
	}
	c.b.built(v, c.passThrough)
	return v
}

// dispatch calls the implementation as the interpreter's evalUnary, evalBinary and
// evalVarArgs do.
func (c *countedCall) dispatch(args []ref.Val) ref.Val {
	o, id, fn := c.impl, c.ID(), c.Function()
	if o.OperandTrait != 0 && !args[0].Type().HasTrait(o.OperandTrait) {
		if args[0].Type().HasTrait(traits.ReceiverType) {
			return types.LabelErrNode(id, args[0].(traits.Receiver).Receive(fn, c.OverloadID(), args[1:]))
		}
		return types.NewErrWithNodeID(id, "no such overload: %s", fn)
	}
	switch {
	case len(args) == 1 && o.Unary != nil:
		return types.LabelErrNode(id, o.Unary(args[0]))
	case len(args) == 2 && o.Binary != nil:
		return types.LabelErrNode(id, o.Binary(args[0], args[1]))
	case o.Function != nil:
		return types.LabelErrNode(id, o.Function(args...))
	}
	return types.NewErrWithNodeID(id, "no such overload: %s", fn)
}

// operandsError is a "no such overload" that says which operands the call had and where.
type operandsError struct {
	function string
	operands []string
	// at is the node id of the first operand that is not a literal, or of the call.
	at int64
}

func (e *operandsError) Error() string {
	return fmt.Sprintf("no such overload for %s with operands %s", e.function, strings.Join(e.operands, " and "))
}

// explain replaces cel-go's bare "no such overload" (a shared value, whose node id is not
// reliable either) with one that names the operands' types and the first operand that is
// not a literal. A call that returns the error of one of its arguments passes it on as is.
// Without args (the interpreter evaluated them), it evaluates them again: that happens only
// when the call failed.
func (c *countedCall) explain(f *interpreter.ExecutionFrame, e *types.Err, args []ref.Val) ref.Val {
	var already *operandsError
	if !strings.HasPrefix(e.Error(), "no such overload") || errors.As(e, &already) {
		return e
	}
	argNodes := c.Args()
	if len(argNodes) == 0 {
		return e
	}
	if args == nil {
		args = make([]ref.Val, len(argNodes))
		for i, a := range argNodes {
			args[i] = a.Exec(f)
			if types.IsUnknownOrError(args[i]) {
				return e // the argument's error, passed on
			}
		}
	}
	oe := &operandsError{function: c.Function(), at: c.ID()}
	atSet := false
	for i, a := range args {
		oe.operands = append(oe.operands, a.Type().TypeName())
		if _, isConst := argNodes[i].(interpreter.InterpretableConst); !isConst && !atSet {
			oe.at, atSet = argNodes[i].ID(), true
		}
	}
	return types.LabelErrNode(c.ID(), types.WrapErr(oe))
}

// countedConstructor counts a list or map literal and what it builds.
type countedConstructor struct {
	interpreter.InterpretableConstructor
	b *budget
}

func (c *countedConstructor) Eval(a interpreter.Activation) ref.Val {
	return interpreter.EvalActivation(a, c.Exec)
}

func (c *countedConstructor) Exec(f *interpreter.ExecutionFrame) ref.Val {
	c.b.charge(1)
	v := c.InterpretableConstructor.Exec(f)
	c.b.built(v, false)
	return v
}

// elementBytes is what MemoryLimit counts per list or map element: an interface value.
const elementBytes = 16

// built checks a value a call or literal returned against MaxValueSize, and counts it
// against CostLimit and MemoryLimit unless it already existed.
func (b *budget) built(v ref.Val, passThrough bool) {
	switch v := v.(type) {
	case types.String:
		b.builtBytes(int64(len(v)), "string", passThrough)
	case types.Bytes:
		b.builtBytes(int64(len(v)), "bytes value", passThrough)
	case traits.MutableLister:
		// A comprehension's accumulator, one element longer than at the previous step.
		b.builtElements(v.Size(), "list", 1, passThrough)
	case traits.Lister:
		b.builtElements(v.Size(), "list", -1, passThrough)
	case traits.MutableMapper:
		b.builtElements(v.Size(), "map", 1, passThrough)
	case traits.Mapper:
		b.builtElements(v.Size(), "map", -1, passThrough)
	}
}

func (b *budget) builtBytes(n int64, what string, passThrough bool) {
	if n > MaxValueSize {
		b.tooBig(fmt.Sprintf("built a %s of %d bytes", what, n))
	}
	if !passThrough {
		b.charge(n / 64)
		b.allocate(n)
	}
}

// builtElements counts a list or map of size elements, of which added are new (-1: all).
func (b *budget) builtElements(size ref.Val, what string, added int64, passThrough bool) {
	n, _ := size.(types.Int)
	if n > MaxValueSize {
		b.tooBig(fmt.Sprintf("built a %s of %d elements", what, n))
	}
	if passThrough {
		return
	}
	if added < 0 {
		added = int64(n)
	}
	b.charge(added)
	b.allocate(added * elementBytes)
}

// measure walks a value and returns its nodes (itself and every nested element, map keys
// included) and about how many bytes it formats to, stopping once past MaxValueSize nodes.
// Lists built by the expression can share elements, so a value of a few kilobytes can have
// 2^30 nodes: whatever walks it (==, in, format) is checked with this first.
func measure(v ref.Val) (nodes, bytes int64) {
	var walk func(v ref.Val)
	walk = func(v ref.Val) {
		if nodes++; nodes > MaxValueSize {
			return
		}
		switch v := v.(type) {
		case types.String:
			bytes += int64(len(v)) + 2
		case types.Bytes:
			bytes += int64(len(v)) + 2
		case traits.Lister:
			bytes += 2
			for it := v.Iterator(); it.HasNext() == types.True && nodes <= MaxValueSize; {
				walk(it.Next())
				bytes += 2
			}
		case traits.Mapper:
			bytes += 2
			for it := v.Iterator(); it.HasNext() == types.True && nodes <= MaxValueSize; {
				k := it.Next()
				walk(k)
				walk(v.Get(k))
				bytes += 4
			}
		default:
			bytes += 24 // a number, a bool, null, a timestamp...
		}
	}
	walk(v)
	return nodes, bytes
}

// walked checks and charges a value that a call is about to walk in full.
func (b *budget) walked(v ref.Val, why string) (nodes, bytes int64) {
	switch v := v.(type) {
	case types.String:
		b.charge(int64(len(v)) / 64)
		return 1, int64(len(v))
	case types.Bytes:
		b.charge(int64(len(v)) / 64)
		return 1, int64(len(v))
	case traits.Lister, traits.Mapper:
	default:
		return 1, 24
	}
	nodes, bytes = measure(v)
	if nodes > MaxValueSize {
		b.tooBig(fmt.Sprintf("would %s a value of more than %d elements, counting nested ones", why, MaxValueSize))
	}
	b.charge(nodes)
	return nodes, bytes
}

func checkCompare(b *budget, args []ref.Val) {
	for _, a := range args {
		b.walked(a, "compare")
	}
}

func listSize(v ref.Val) int64 {
	if l, ok := v.(traits.Lister); ok {
		n, _ := l.Size().(types.Int)
		return int64(n)
	}
	return 0
}

// checkIn: x in list compares x with every element.
func checkIn(b *budget, args []ref.Val) {
	elem, _ := b.walked(args[0], "search for")
	if n := listSize(args[1]); n > 0 {
		b.walked(args[1], "search")
		b.charge(n * elem)
	}
}

// checkSets: sets.contains, equivalent and intersects compare every pair of elements.
func checkSets(b *budget, args []ref.Val) {
	x, _ := b.walked(args[0], "compare")
	y, _ := b.walked(args[1], "compare")
	b.charge(x * y)
}

// checkDistinct: distinct compares every element with every distinct one before it.
func checkDistinct(b *budget, args []ref.Val) {
	nodes, _ := b.walked(args[0], "compare")
	b.charge(listSize(args[0]) * nodes)
}

// checkJoin: the result is every element's bytes plus a separator between them.
func checkJoin(b *budget, args []ref.Val) {
	l, ok := args[0].(traits.Lister)
	if !ok {
		return
	}
	var sep int64
	if len(args) > 1 {
		if s, ok := args[1].(types.String); ok {
			sep = int64(len(s))
		}
	}
	var total int64
	for it := l.Iterator(); it.HasNext() == types.True; {
		if s, ok := it.Next().(types.String); ok {
			total += int64(len(s)) + sep
		}
		b.charge(1)
		if total > MaxValueSize {
			b.tooBig(fmt.Sprintf("would join a string of more than %d bytes", MaxValueSize))
		}
	}
}

// checkReplace: each occurrence of old grows the string by len(new)-len(old); an empty old
// occurs before every character and at the end.
func checkReplace(b *budget, args []ref.Val) {
	if len(args) < 3 {
		return
	}
	s, ok1 := args[0].(types.String)
	old, ok2 := args[1].(types.String)
	repl, ok3 := args[2].(types.String)
	if !ok1 || !ok2 || !ok3 {
		return
	}
	b.charge(int64(len(s)) / 64)
	var count int64
	if old == "" {
		count = int64(utf8.RuneCountInString(string(s))) + 1
	} else {
		count = int64(strings.Count(string(s), string(old)))
	}
	if len(args) > 3 {
		if n, ok := args[3].(types.Int); ok && n >= 0 && int64(n) < count {
			count = int64(n)
		}
	}
	if out := int64(len(s)) + count*(int64(len(repl))-int64(len(old))); out > MaxValueSize {
		b.tooBig(fmt.Sprintf("would replace into a string of %d bytes", out))
	}
}

// checkFormat: the result holds the format and every argument, written out in full.
func checkFormat(b *budget, args []ref.Val) {
	if len(args) < 2 {
		return
	}
	format, _ := args[0].(types.String)
	_, bytes := b.walked(args[1], "format")
	if out := int64(len(format)) + bytes; out > MaxValueSize {
		b.tooBig(fmt.Sprintf("would format a string of about %d bytes", out))
	}
}

// checkEncode: json.encode writes its argument out in full.
func checkEncode(b *budget, args []ref.Val) {
	if _, bytes := b.walked(args[0], "encode"); bytes > MaxValueSize {
		b.tooBig(fmt.Sprintf("would encode a string of about %d bytes", bytes))
	}
}

// checkFlatten: the result holds the elements of the nested lists, down to the depth
// (default 1).
func checkFlatten(b *budget, args []ref.Val) {
	depth := int64(1)
	if len(args) > 1 {
		if d, ok := args[1].(types.Int); ok {
			depth = int64(d)
		}
	}
	var n int64
	var walk func(v ref.Val, level int64)
	walk = func(v ref.Val, level int64) {
		l, ok := v.(traits.Lister)
		if !ok || level > depth {
			return
		}
		for it := l.Iterator(); it.HasNext() == types.True && n <= MaxValueSize; {
			n++
			walk(it.Next(), level+1)
		}
	}
	walk(args[0], 0)
	b.charge(n)
	if n > MaxValueSize {
		b.tooBig(fmt.Sprintf("would flatten into a list of more than %d elements", MaxValueSize))
	}
}

// checkMatches: RE2 takes time proportional to the text times the pattern.
func checkMatches(b *budget, args []ref.Val) {
	text, _ := args[0].(types.String)
	pattern, _ := args[1].(types.String)
	b.charge((int64(len(text))/16 + 1) * (int64(len(pattern))/16 + 1))
}
