package validate

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Limits of a workflow's definition, checked by Compile: past them a definition is a
// *CompileError, which the API answers with a 400 naming the field.
const (
	// MaxSchemaNodes bounds a schema's size with every $ref followed: the subschemas (and enum
	// values) that validating one value can visit. A definition referenced twice at each of
	// 40 levels is 2^40 subschemas in 3 KB of JSON. A reference back to a schema being
	// expanded (a recursive schema) counts once: recursion follows the submission's own
	// nesting, and MaxSchemaSteps bounds it at run time.
	MaxSchemaNodes = 100_000

	// MaxAssertions is the most assertions a workflow may have.
	MaxAssertions = 100

	// MaxExprLength is the longest assertion expression, in bytes.
	MaxExprLength = 4096

	// MaxExprDepth bounds how deeply an expression nests: parentheses, calls, operands of
	// operators (a + b + c nests one level per +), selects and list literals.
	MaxExprDepth = 32

	// SizeHintBytes is the submission size for which Compile estimates an expression's
	// worst-case cost (MAX_BODY_BYTES' default). A string or list reached from submission or
	// metadata by field names is assumed to fill it; one inside a list or map element is
	// assumed to hold its element's share (a loop over the elements of a list sees, in total,
	// one submission's worth of data, whatever the nesting); any other value whose size the
	// estimate cannot tell, MaxValueSize (no value can be larger at run time).
	SizeHintBytes = 1 << 20

	// MaxEstimatedCost bounds an expression's worst-case cost estimated for a SizeHintBytes
	// submission, in cel-go's cost units (about one operation each). A loop over a list of the
	// submission costs a few million; a loop over it inside a loop over it, 10^12.
	MaxEstimatedCost = 100_000_000
)

// Limits of one Run. Past any of them Run returns a *LimitError, which wraps ErrLimitExceeded.
const (
	// MaxSchemaSteps bounds the work of validating one submission against the schema. A step
	// is one subschema applied to one value, plus one per member of an object or array that
	// the subschema iterates (and per member again for each patternProperties regexp), plus
	// one per enum value; a subschema applied in place (allOf, anyOf, oneOf, $ref...) counts
	// twice, for the error it may add (the library keeps every error until the validation
	// ends: they are most of its memory). Validating a 1 MiB submission against an ordinary
	// schema takes a few hundred thousand steps (objects of a few fields each) to 1.5 million
	// (an array of 500,000 numbers). 2 million steps are about half a second and, at worst
	// (every step an error), about 250 MB allocated: as much as a 1 MiB submission whose
	// every value is wrong.
	MaxSchemaSteps = 2_000_000

	// SchemaTimeout bounds the CPU time of schema validation (the time the validating thread
	// ran, not the wall clock: a worker stopped or starved of CPU does not use it up): a
	// backstop behind MaxSchemaSteps, the one schema limit whose outcome depends on the
	// machine's speed.
	SchemaTimeout = 5 * time.Second

	// CostLimit bounds the work of evaluating one assertion, in steps: one per function call
	// or list or map literal evaluated, one per element of a list or map a call builds, one
	// per 64 bytes of a string it builds, and the elements compared, searched or formatted by
	// ==, in, sets.*, distinct and format. A loop over a list of the submission costs a few
	// steps per element; 5 million steps are about half a second.
	CostLimit = 5_000_000

	// MaxValueSize bounds every value an assertion builds: a string or bytes of more than
	// MaxValueSize bytes, or a list or map of more than MaxValueSize elements, stops the run;
	// so does comparing, searching, flattening or formatting a value of more than
	// MaxValueSize elements counting nested ones (a list of two references to one list of two
	// references to one list..., 30 levels deep, is small in memory but has 2^30 elements to
	// compare). Calls whose result size follows from their arguments (join, replace, format,
	// flatten) are checked before they allocate.
	MaxValueSize = 1 << 20

	// MemoryLimit bounds the memory the assertions of one run allocate for the values they
	// build, all assertions together: the bytes of every string and bytes a call produces,
	// plus 16 bytes per element of every list and map. It counts what is built, not what is
	// still alive, so it errs on the safe side.
	MemoryLimit = 128 << 20

	// EvalTimeout bounds the CPU time of one assertion evaluation, as SchemaTimeout does the
	// schema's: a backstop behind CostLimit, MaxValueSize and MemoryLimit, the one CEL limit
	// whose outcome depends on the machine's speed.
	EvalTimeout = 5 * time.Second

	// StallTimeout bounds the wall time of the schema validation or of one assertion: far
	// more than SchemaTimeout and EvalTimeout of CPU time, it is reached only when the worker
	// was stopped (SIGSTOP, a paused VM) or starved of CPU. That is the worker's fault, not
	// the submission's: Run returns an error wrapping ErrWorkerStalled, and the run is retried.
	StallTimeout = time.Minute
)

// ErrWorkerStalled is wrapped by the error Run returns when a validation went past
// StallTimeout of wall time without using up its CPU time: the worker lost the time, the
// submission is not to blame, and the same submission may pass on a retry.
var ErrWorkerStalled = errors.New("validate: the worker was stopped or starved of CPU")

// MaxSchemaFindings is the most schema findings a run lists: past it, the first ones in path
// order are listed, then one finding says how many errors were left out. It is not an error:
// the run fails as it would with all of them, and its findings stay small enough to store.
const MaxSchemaFindings = 100

// LimitError is the error Run returns when validating a submission went past a limit. It
// wraps ErrLimitExceeded; its message says which limit and what the workflow's author can do.
type LimitError struct {
	// Step is "schema" or "assertion:<name>", as in Finding.Step.
	Step string
	// Limit is the name of the exported constant, such as "MaxSchemaSteps" or "CostLimit".
	Limit string
	// Msg is the explanation, naming the assertion when there is one.
	Msg string
}

func (e *LimitError) Error() string { return ErrLimitExceeded.Error() + ": " + e.Msg }

// Unwrap makes errors.Is(err, ErrLimitExceeded) hold.
func (e *LimitError) Unwrap() error { return ErrLimitExceeded }

// checkEvery is how many steps may pass between two looks at the clocks and the context.
const checkEvery = 1024

// abortSignal is the panic that unwinds a validation from inside the library's recursion
// (jsonschema has no cancellation) or cel-go's evaluation; the reason is in budget.err.
type abortSignal struct{}

// budget counts the work and memory of one run. Each runner owns one, and the schema
// extension and CEL decorators of the runner's compiled copies point at it, so concurrent
// runs never share a counter. Only the goroutine running the runner touches it.
type budget struct {
	// active: a Run is counting. Compiling a copy runs none of the hooks, but a hook that
	// did would otherwise abort at once (the limits are zero).
	active    bool
	ctx       context.Context
	step      string // Finding.Step of the work being counted
	assertion string // its assertion's name, "" for the schema
	steps     int64
	maxSteps  int64
	stepLimit string // "MaxSchemaSteps" or "CostLimit"
	nextCheck int64
	// cpuStart is the thread's CPU time when the step started (cpuOK: it could be read;
	// otherwise timeout is measured on the wall clock). wallStart is the wall clock then.
	cpuStart  time.Duration
	cpuOK     bool
	wallStart time.Time
	timeout   time.Duration
	timeLimit string // "SchemaTimeout" or "EvalTimeout"
	// stall is the wall time after which the worker, not the submission, is deemed to have
	// lost the time (StallTimeout); lostTime, when set (tests), runs before each look at
	// the clocks and stands in for a worker that is stopped meanwhile.
	stall    time.Duration
	lostTime func()
	memory   int64 // bytes built by the assertions of this run
	// err is why the work was aborted: a *LimitError, or the context's error.
	err error
}

func (b *budget) startRun(ctx context.Context, stall time.Duration, lostTime func()) {
	*b = budget{ctx: ctx, stall: stall, lostTime: lostTime}
}

func (b *budget) startSchema(timeout time.Duration) {
	b.start(StepSchema, "", MaxSchemaSteps, "MaxSchemaSteps", timeout, "SchemaTimeout")
}

func (b *budget) startAssertion(name string, timeout time.Duration) {
	b.start(StepAssertionPrefix+name, name, CostLimit, "CostLimit", timeout, "EvalTimeout")
}

func (b *budget) start(step, assertion string, maxSteps int64, stepLimit string, timeout time.Duration, timeLimit string) {
	b.active = true
	b.step, b.assertion = step, assertion
	b.steps, b.maxSteps, b.stepLimit = 0, maxSteps, stepLimit
	b.nextCheck = checkEvery
	b.timeout, b.timeLimit = timeout, timeLimit
	b.wallStart = time.Now()
	b.cpuStart, b.cpuOK = threadCPU()
	b.err = nil
}

// subject names the work in messages: "schema validation" or "assertion <name>".
func (b *budget) subject() string {
	if b.assertion == "" {
		return "schema validation"
	}
	return "assertion " + b.assertion
}

// charge counts n steps of work and aborts past the step limit, the deadline or the end of
// the caller's context.
func (b *budget) charge(n int64) {
	if !b.active {
		return
	}
	b.steps += n
	if b.steps > b.maxSteps {
		b.abort(b.stepLimit, b.stepsMessage())
	}
	if b.steps >= b.nextCheck {
		b.nextCheck = b.steps + checkEvery
		b.checkTime()
	}
}

func (b *budget) checkTime() {
	select {
	case <-b.ctx.Done():
		b.err = b.ctx.Err()
		panic(abortSignal{})
	default:
	}
	if b.lostTime != nil {
		b.lostTime()
	}
	wall := time.Since(b.wallStart)
	used := wall
	if b.cpuOK {
		now, ok := threadCPU()
		if ok {
			used = now - b.cpuStart
		}
	}
	if used > b.timeout {
		b.abort(b.timeLimit, fmt.Sprintf("%s needed more than %v of CPU time (%s): the rule is too costly for this "+
			"submission; simplify the rule or send smaller submissions", b.subject(), b.timeout, b.timeLimit))
	}
	if b.stall > 0 && wall > b.stall {
		b.err = fmt.Errorf("%w: %s took %v of wall time but only %v of CPU time (StallTimeout %v)",
			ErrWorkerStalled, b.subject(), wall.Round(time.Millisecond), used.Round(time.Millisecond), b.stall)
		panic(abortSignal{})
	}
}

func (b *budget) stepsMessage() string {
	if b.assertion == "" {
		return fmt.Sprintf("schema validation needed more than %d steps (MaxSchemaSteps) for this submission: "+
			"the schema applies too many subschemas to it (allOf, anyOf, oneOf or $ref nested in one another, "+
			"or applied to every item of a large array); flatten the schema or send smaller submissions", b.maxSteps)
	}
	return fmt.Sprintf("assertion %s needed more than %d evaluation steps (CostLimit) for this submission: "+
		"every call and every element of a list it loops over, builds or compares is a step; "+
		"avoid loops inside loops over the submission, or send smaller submissions", b.assertion, b.maxSteps)
}

// allocate counts bytes built by an assertion against MemoryLimit.
func (b *budget) allocate(bytes int64) {
	if !b.active {
		return
	}
	b.memory += bytes
	if b.memory > MemoryLimit {
		b.abort("MemoryLimit", fmt.Sprintf("the assertions of this run built more than %d MiB of strings, lists and maps "+
			"(MemoryLimit) by the time assertion %s ran: build fewer or smaller values, for example test each element "+
			"in a loop rather than building a new list of them", MemoryLimit>>20, b.assertion))
	}
}

// tooBig aborts because a value is, or would be, larger than MaxValueSize; what says which,
// such as "built a string of 2097152 bytes".
func (b *budget) tooBig(what string) {
	b.abort("MaxValueSize", fmt.Sprintf("assertion %s %s, more than MaxValueSize (%d): an expression that doubles "+
		"a value at every step (s + s, l + l, [v, v], or replace, join or format of shared values) soon outgrows "+
		"anything a submission holds; build smaller values", b.assertion, what, MaxValueSize))
}

func (b *budget) abort(limit, msg string) {
	b.err = &LimitError{Step: b.step, Limit: limit, Msg: msg}
	panic(abortSignal{})
}
