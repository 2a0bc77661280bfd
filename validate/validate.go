// Package validate is the validation engine a run executes. A workflow's rules, an optional
// JSON Schema and an optional list of CEL assertions, are compiled once into a [Program];
// [Program.Run] checks one submission against them and returns the problems as [Finding]s.
//
// The package is pure: no database, no network (a schema $ref is never fetched), no mutable
// globals. A Program is safe for concurrent use once compiled, so workers may cache and
// share it.
//
// Rules are written by API clients and run inside a shared worker (with `serve --worker`,
// inside the API's process), so every rule is bounded twice. Compile rejects, as a
// *CompileError, definitions whose size alone is a problem: a schema that expands past
// MaxSchemaNodes, more than MaxAssertions assertions, expressions longer than MaxExprLength
// or nested deeper than MaxExprDepth, and expressions whose worst-case cost on a
// SizeHintBytes submission is past MaxEstimatedCost. Run then counts the work and memory of
// each submission: MaxSchemaSteps and SchemaTimeout for the schema; CostLimit, MaxValueSize
// and EvalTimeout for each assertion; MemoryLimit for the assertions of a run together. Past
// any of them Run stops at once, in the calling goroutine, and returns a *LimitError wrapping
// ErrLimitExceeded: the submission cannot pass on a retry, so the run ends in error, with
// the error's message as its reason. The time limits count the CPU time of the validating
// thread, not the wall clock, so a worker that is stopped or starved of CPU does not blame
// the submission; past StallTimeout of wall time it returns ErrWorkerStalled instead, and
// the run is retried.
//
// A submission that an assertion cannot be evaluated on (a field missing or of another type
// than the rule expects) is not a limit: it yields a finding, of the assertion's own
// severity (see Finding).
package validate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"cel.dev/cel-go/cel"
	"github.com/santhosh-tekuri/jsonschema/v6"
)

// Severities of assertions and findings. Only SeverityError makes a run fail.
const (
	SeverityError   = "error"
	SeverityWarning = "warning"
	SeverityInfo    = "info"
)

// Step values of findings; an assertion's step is StepAssertionPrefix + its name.
const (
	StepSchema          = "schema"
	StepAssertionPrefix = "assertion:"
)

// MaxAssertionNameLen is the longest assertion name accepted, in characters (runes).
const MaxAssertionNameLen = 100

var (
	// ErrInvalidSubmission is returned by Run when the submission is not a single JSON value.
	ErrInvalidSubmission = errors.New("validate: submission is not valid JSON")
	// ErrInvalidMetadata is returned by Run when metadata is neither empty, null nor a JSON object.
	ErrInvalidMetadata = errors.New("validate: metadata is not a JSON object")
	// ErrLimitExceeded is wrapped by the error Run returns when validating one submission
	// went past a limit of time, work or memory (the error says which). Retrying the same
	// submission cannot succeed: the worker ends the run in status error with that reason.
	ErrLimitExceeded = errors.New("validate: limit exceeded")
)

// Assertion is one CEL rule of a workflow, as the API receives and stores it.
type Assertion struct {
	// Name is 1-100 characters, unique within the workflow.
	Name string `json:"name" validate:"required" minLength:"1" maxLength:"100" extensions:"x-pattern=\\S" example:"positive_total"`
	// Expr is CEL over `submission` (dyn) and `metadata` (map(string, dyn)); it must evaluate
	// to bool. At most MaxExprLength bytes, nested at most MaxExprDepth levels deep.
	Expr string `json:"expr" validate:"required" minLength:"1" extensions:"x-pattern=\\S" example:"submission.total > 0"`
	// Severity is error (the default when empty), warning or info. It is the severity of the
	// assertion's findings, both when the expression is false and when it cannot be
	// evaluated on a submission.
	Severity string `json:"severity,omitempty" enums:"error,warning,info" example:"error"`
	// Message is shown when the expression is false; empty means "assertion <name> failed".
	Message string `json:"message,omitempty" example:"total must be positive"`
}

// Finding is one problem found in a submission.
type Finding struct {
	// Step is "schema" or "assertion:<name>".
	Step string `json:"step"`
	// Severity is error for schema findings, and the assertion's severity for assertion
	// findings, including "assertion <name> could not be evaluated: ..." when the expression
	// fails on this submission (a field is missing, or has another type than the rule
	// expects). A rule that cannot be evaluated has not established its condition: for an
	// error rule that fails the run, as a false result would; for a warning or info rule it
	// stays advisory, because the author said a violation of that rule must not fail a run,
	// and a submission that a warning rule cannot read (say, a total sent as a string) is
	// rejected, if at all, by the schema or by an error rule that checks the type.
	Severity string `json:"severity"`
	// Path is the JSON pointer of the offending value for schema findings ("" is the root
	// value itself), and always "" for assertions.
	Path    string `json:"path"`
	Message string `json:"message"`
}

// CompileError says which part of a workflow definition does not compile, so an API can
// answer 400 naming the field.
type CompileError struct {
	// Field is "schema" or "assertions[i]", i zero-based.
	Field string
	// Name is the assertion's name as given; empty for the schema.
	Name string
	// Msg is the compiler's message.
	Msg string
}

func (e *CompileError) Error() string {
	if e.Name != "" {
		return fmt.Sprintf("%s (%q): %s", e.Field, e.Name, e.Msg)
	}
	return e.Field + ": " + e.Msg
}

// Program is a compiled workflow definition, safe for concurrent use.
type Program struct {
	schema     json.RawMessage // nil: the workflow has no schema
	assertions []compiledAssertion
	// runners holds compiled copies of the definition, each with its own budget. The hooks
	// that count work (a jsonschema extension, cel-go decorators) receive no per-call state,
	// so each copy is bound to one budget when compiled, and a Run takes a copy for itself.
	// Idle copies go with the garbage collector.
	runners sync.Pool
	// evalTimeout, schemaTimeout and stallTimeout are EvalTimeout, SchemaTimeout and
	// StallTimeout; fields so that tests can reach them without waiting for them.
	evalTimeout, schemaTimeout, stallTimeout time.Duration
	// lostTime, when set (tests), runs at each look at the clocks: see budget.lostTime.
	lostTime func()
}

// runner is one compiled copy of a Program, used by one Run at a time.
type runner struct {
	program *Program
	b       budget
	schema  *jsonschema.Schema
	progs   []cel.Program
	// aborted: a limit unwound the copy mid-validation; it is dropped rather than reused.
	aborted bool
}

// Compile checks and compiles a schema (nil, empty or JSON `null` mean no schema) and
// assertions. It returns the assertions normalised (default severity and message filled in),
// which is what the caller should store, so a stored workflow shows what actually applies.
//
// Every failure is a *CompileError; the first problem found is reported, schema first, then
// assertions in order.
func Compile(schema json.RawMessage, assertions []Assertion) (*Program, []Assertion, error) {
	p := &Program{evalTimeout: EvalTimeout, schemaTimeout: SchemaTimeout, stallTimeout: StallTimeout}
	first := &runner{program: p}
	sch, err := compileSchema(schema, &first.b)
	if err != nil {
		return nil, nil, err
	}
	if sch != nil {
		if msg := checkSchemaSize(sch); msg != "" {
			return nil, nil, &CompileError{Field: "schema", Msg: msg}
		}
		// A copy: the caller may reuse its buffer, and runners compile from this one.
		p.schema = slices.Clone(bytes.TrimSpace(schema))
		first.schema = sch
	}
	if len(assertions) > MaxAssertions {
		return nil, nil, &CompileError{Field: "assertions", Msg: fmt.Sprintf("%d assertions, more than MaxAssertions (%d): "+
			"combine related checks with && in one assertion", len(assertions), MaxAssertions)}
	}
	p.assertions = make([]compiledAssertion, 0, len(assertions))
	// Never nil, so a stored definition reads [] rather than null.
	normalised := make([]Assertion, 0, len(assertions))
	seen := make(map[string]int, len(assertions))
	for i, a := range assertions {
		fail := func(format string, args ...any) error {
			return &CompileError{Field: fmt.Sprintf("assertions[%d]", i), Name: a.Name, Msg: fmt.Sprintf(format, args...)}
		}
		switch {
		case strings.TrimSpace(a.Name) == "":
			return nil, nil, fail("name is empty")
		case utf8.RuneCountInString(a.Name) > MaxAssertionNameLen:
			return nil, nil, fail("name is longer than %d characters", MaxAssertionNameLen)
		case !utf8.ValidString(a.Name):
			return nil, nil, fail("name is not valid UTF-8")
		}
		if j, dup := seen[a.Name]; dup {
			return nil, nil, fail("duplicate assertion name %q (also assertions[%d])", a.Name, j)
		}
		seen[a.Name] = i
		if strings.TrimSpace(a.Expr) == "" {
			return nil, nil, fail("expr is empty")
		}
		switch a.Severity {
		case "":
			a.Severity = SeverityError
		case SeverityError, SeverityWarning, SeverityInfo:
		default:
			return nil, nil, fail("unknown severity %q (want %s, %s or %s)", a.Severity, SeverityError, SeverityWarning, SeverityInfo)
		}
		if a.Message == "" {
			a.Message = fmt.Sprintf("assertion %s failed", a.Name)
		}
		checked, msg := compileExpr(a.Expr)
		if msg != "" {
			return nil, nil, fail("%s", msg)
		}
		normalised = append(normalised, a)
		p.assertions = append(p.assertions, compiledAssertion{Assertion: a, step: StepAssertionPrefix + a.Name, ast: checked})
		prg, err := newProgram(&p.assertions[len(p.assertions)-1], &first.b)
		if err != nil {
			return nil, nil, fail("%v", err)
		}
		first.progs = append(first.progs, prg)
	}
	p.runners.Put(first)
	return p, normalised, nil
}

// runner returns an idle compiled copy, or compiles one.
func (p *Program) runner() (*runner, error) {
	if r, ok := p.runners.Get().(*runner); ok {
		return r, nil
	}
	r := &runner{program: p}
	if p.schema != nil {
		sch, err := compileSchema(p.schema, &r.b)
		if err != nil {
			// It compiled in Compile; compiling is deterministic.
			return nil, fmt.Errorf("validate: compile a copy of the schema: %w", err)
		}
		r.schema = sch
	}
	for i := range p.assertions {
		prg, err := newProgram(&p.assertions[i], &r.b)
		if err != nil {
			return nil, fmt.Errorf("validate: plan a copy of assertion %s: %w", p.assertions[i].Name, err)
		}
		r.progs = append(r.progs, prg)
	}
	return r, nil
}

func (p *Program) release(r *runner) {
	if r.aborted {
		return
	}
	r.b = budget{} // forget the caller's context
	p.runners.Put(r)
}

// Run validates one submission. submission is raw JSON (any JSON value); metadata is a raw
// JSON object, or nil, empty or `null` for {}.
//
// Findings come in a deterministic order: schema findings sorted by path then message, then
// assertion findings in definition order. The slice is never nil, so it encodes as [].
// A problem with the submission, including an assertion that cannot be evaluated, is a
// finding. err is for input that is not JSON (ErrInvalidSubmission, ErrInvalidMetadata), for
// a submission that went past a limit of time, work or memory (a *LimitError, which wraps
// ErrLimitExceeded), for a worker that lost the time (ErrWorkerStalled: retry the run), and
// for ctx ending (ctx.Err()). Either way the validation has stopped
// when Run returns: nothing keeps running in another goroutine.
func (p *Program) Run(ctx context.Context, submission, metadata []byte) ([]Finding, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if p.schema == nil && len(p.assertions) == 0 {
		// No rule reads the submission: check it without building it (a
		// 1 MB array of numbers decodes to tens of megabytes).
		if !json.Valid(submission) {
			return nil, fmt.Errorf("%w: not a single JSON value", ErrInvalidSubmission)
		}
		if _, err := decodeMetadata(metadata); err != nil {
			return nil, err
		}
		return []Finding{}, nil
	}
	doc, err := decodeJSON(submission)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidSubmission, err)
	}
	meta, err := decodeMetadata(metadata)
	if err != nil {
		return nil, err
	}
	r, err := p.runner()
	if err != nil {
		return nil, err
	}
	defer p.release(r)
	// The time limits count this thread's CPU time: the goroutine must stay on it.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	r.b.startRun(ctx, p.stallTimeout, p.lostTime)

	findings := []Finding{}
	if r.schema != nil {
		sf, err := r.schemaFindings(doc, p.schemaTimeout)
		if err != nil {
			return nil, err
		}
		findings = append(findings, sf...)
	}
	if len(p.assertions) == 0 {
		return findings, nil
	}
	// The schema saw exact json.Numbers; CEL wants int64 or float64. The tree is ours, so
	// convert it in place rather than copy it.
	vars, err := cel.NewActivation(map[string]any{
		"submission": toCEL(doc),
		"metadata":   toCEL(meta),
	})
	if err != nil {
		return nil, fmt.Errorf("validate: bind variables: %w", err)
	}
	for i := range p.assertions {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		f, ok, err := r.eval(i, vars, p.evalTimeout)
		if err != nil {
			return nil, err
		}
		if !ok {
			findings = append(findings, f)
		}
	}
	return findings, nil
}

// Failed reports whether findings contain any of severity error, which makes a run "failed".
func Failed(findings []Finding) bool {
	return slices.ContainsFunc(findings, func(f Finding) bool { return f.Severity == SeverityError })
}
