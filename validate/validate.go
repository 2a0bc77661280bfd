// Package validate is the validation engine a run executes. A workflow's rules, an optional
// JSON Schema and an optional list of CEL assertions, are compiled once into a [Program];
// [Program.Run] checks one submission against them and returns the problems as [Finding]s.
//
// The package is pure: no database, no network (a schema $ref is never fetched), no mutable
// globals. A Program is immutable once compiled, so workers may cache and share it.
package validate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/cel-go/cel"
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
	Name string `json:"name"`
	// Expr is CEL over `submission` (dyn) and `metadata` (map(string, dyn)); it must evaluate to bool.
	Expr string `json:"expr"`
	// Severity is error (the default when empty), warning or info.
	Severity string `json:"severity,omitempty"`
	// Message is shown when the expression is false; empty means "assertion <name> failed".
	Message string `json:"message,omitempty"`
}

// Finding is one problem found in a submission.
type Finding struct {
	// Step is "schema" or "assertion:<name>".
	Step     string `json:"step"`
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
	schema     *jsonschema.Schema // nil: the workflow has no schema
	assertions []compiledAssertion
	// evalTimeout is EvalTimeout; a field so that tests can reach it without waiting for it.
	evalTimeout time.Duration
}

type compiledAssertion struct {
	Assertion // normalised: severity and message filled in
	step      string
	prg       cel.Program
}

// Compile checks and compiles a schema (nil, empty or JSON `null` mean no schema) and
// assertions. It returns the assertions normalised (default severity and message filled in),
// which is what the caller should store, so a stored workflow shows what actually applies.
//
// Every failure is a *CompileError; the first problem found is reported, schema first, then
// assertions in order.
func Compile(schema json.RawMessage, assertions []Assertion) (*Program, []Assertion, error) {
	sch, err := compileSchema(schema)
	if err != nil {
		return nil, nil, err
	}
	p := &Program{schema: sch, assertions: make([]compiledAssertion, 0, len(assertions)), evalTimeout: EvalTimeout}
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
		prg, msg := compileExpr(a.Expr)
		if msg != "" {
			return nil, nil, fail("%s", msg)
		}
		normalised = append(normalised, a)
		p.assertions = append(p.assertions, compiledAssertion{Assertion: a, step: StepAssertionPrefix + a.Name, prg: prg})
	}
	return p, normalised, nil
}

// Run validates one submission. submission is raw JSON (any JSON value); metadata is a raw
// JSON object, or nil, empty or `null` for {}.
//
// Findings come in a deterministic order: schema findings sorted by path then message, then
// assertion findings in definition order. The slice is never nil, so it encodes as [].
// A problem with the submission, including an assertion that cannot be evaluated, is a
// finding; err is only for input that is not JSON (ErrInvalidSubmission, ErrInvalidMetadata)
// or ctx ending (ctx.Err()).
func (p *Program) Run(ctx context.Context, submission, metadata []byte) ([]Finding, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	doc, err := decodeJSON(submission)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidSubmission, err)
	}
	meta, err := decodeMetadata(metadata)
	if err != nil {
		return nil, err
	}

	findings := []Finding{}
	if p.schema != nil {
		findings = append(findings, schemaFindings(p.schema, doc)...)
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
	for _, a := range p.assertions {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		f, ok := a.eval(ctx, vars, p.evalTimeout)
		if err := ctx.Err(); err != nil {
			// The evaluation error, if any, was the interruption: not the submission's fault.
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
