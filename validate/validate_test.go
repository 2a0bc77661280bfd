package validate_test

import (
	"context"
	"encoding/json"
	"errors"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/validate"
)

// orderSchema is a typical workflow schema: a nested object and an array of objects.
const orderSchema = `{
	"type": "object",
	"required": ["customer", "items"],
	"properties": {
		"customer": {
			"type": "object",
			"required": ["name"],
			"properties": {
				"name": {"type": "string", "minLength": 1},
				"email": {"type": "string", "format": "email"}
			}
		},
		"items": {
			"type": "array",
			"minItems": 1,
			"items": {
				"type": "object",
				"required": ["sku", "price"],
				"properties": {
					"sku": {"type": "string"},
					"price": {"type": "number", "minimum": 0}
				}
			}
		}
	}
}`

var orderAssertions = []validate.Assertion{
	{Name: "positive_prices", Expr: `submission.items.all(i, i.price > 0)`, Severity: validate.SeverityWarning, Message: "every item needs a positive price"},
	{Name: "has_email", Expr: `has(submission.customer.email)`},
	{Name: "single_item", Expr: `size(submission.items) < 2`, Severity: validate.SeverityInfo},
}

func mustCompile(t testing.TB, schema string, assertions ...validate.Assertion) *validate.Program {
	t.Helper()
	p, _, err := validate.Compile(json.RawMessage(schema), assertions)
	require.NoError(t, err)
	return p
}

func TestCompileErrors(t *testing.T) {
	t.Parallel()
	ok := validate.Assertion{Name: "ok", Expr: "true"}
	tests := []struct {
		name       string
		schema     string
		assertions []validate.Assertion
		wantField  string
		wantName   string
		wantMsg    string // a substring of Msg, when it matters
	}{
		{name: "schema not JSON", schema: `{"type":`, wantField: "schema", wantMsg: "invalid JSON"},
		{name: "schema with trailing data", schema: `{} {}`, wantField: "schema", wantMsg: "invalid JSON"},
		{name: "schema type of wrong type", schema: `{"type": 5}`, wantField: "schema", wantMsg: "'/type'"},
		{name: "schema not an object", schema: `[1]`, wantField: "schema", wantMsg: "not a valid JSON Schema"},
		{name: "schema bad regex", schema: `{"pattern": "("}`, wantField: "schema", wantMsg: "'/pattern'"},
		{name: "schema local ref not found", schema: `{"$ref": "#/$defs/missing"}`, wantField: "schema", wantMsg: "#/$defs/missing"},
		{name: "remote https ref", schema: `{"$ref": "https://example.com/s.json"}`, wantField: "schema", wantMsg: "remote references are not allowed"},
		{name: "remote http ref", schema: `{"properties": {"a": {"$ref": "http://example.com/s.json#/x"}}}`, wantField: "schema", wantMsg: "remote references are not allowed"},
		{name: "file ref", schema: `{"$ref": "file:///etc/passwd"}`, wantField: "schema", wantMsg: "remote references are not allowed"},
		{name: "relative ref", schema: `{"$ref": "other.json"}`, wantField: "schema", wantMsg: "remote references are not allowed"},
		{name: "unknown remote metaschema", schema: `{"$schema": "https://example.com/meta"}`, wantField: "schema", wantMsg: "remote references are not allowed"},
		{
			name:       "CEL syntax error",
			assertions: []validate.Assertion{ok, {Name: "broken", Expr: "1 +"}},
			wantField:  "assertions[1]", wantName: "broken", wantMsg: "Syntax error",
		},
		{
			name:       "CEL not bool",
			assertions: []validate.Assertion{{Name: "sum", Expr: "1 + 1"}},
			wantField:  "assertions[0]", wantName: "sum", wantMsg: "want bool",
		},
		{
			name:       "CEL unknown variable",
			assertions: []validate.Assertion{{Name: "unknown", Expr: "payload.x > 1"}},
			wantField:  "assertions[0]", wantName: "unknown", wantMsg: "undeclared reference to 'payload'",
		},
		{
			name:       "CEL type error",
			assertions: []validate.Assertion{{Name: "typed", Expr: `"a" > 1`}},
			wantField:  "assertions[0]", wantName: "typed", wantMsg: "no matching overload",
		},
		{
			name:       "duplicate names",
			assertions: []validate.Assertion{ok, {Name: "other", Expr: "true"}, {Name: "ok", Expr: "false"}},
			wantField:  "assertions[2]", wantName: "ok", wantMsg: "duplicate",
		},
		{
			name:       "bad severity",
			assertions: []validate.Assertion{{Name: "sev", Expr: "true", Severity: "fatal"}},
			wantField:  "assertions[0]", wantName: "sev", wantMsg: "fatal",
		},
		{
			name:       "severity is case sensitive",
			assertions: []validate.Assertion{{Name: "sev", Expr: "true", Severity: "Error"}},
			wantField:  "assertions[0]", wantName: "sev",
		},
		{
			name:       "empty name",
			assertions: []validate.Assertion{{Name: " ", Expr: "true"}},
			wantField:  "assertions[0]", wantName: " ", wantMsg: "name is empty",
		},
		{
			name:       "name too long",
			assertions: []validate.Assertion{{Name: strings.Repeat("n", 101), Expr: "true"}},
			wantField:  "assertions[0]", wantName: strings.Repeat("n", 101), wantMsg: "longer than 100",
		},
		{
			name:       "empty expr",
			assertions: []validate.Assertion{{Name: "blank", Expr: "  "}},
			wantField:  "assertions[0]", wantName: "blank", wantMsg: "expr is empty",
		},
		{
			name:       "schema is checked before assertions",
			schema:     `{"type": 5}`,
			assertions: []validate.Assertion{{Name: "broken", Expr: "1 +"}},
			wantField:  "schema",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p, normalised, err := validate.Compile(json.RawMessage(tt.schema), tt.assertions)
			require.Error(t, err)
			require.Nil(t, p)
			require.Nil(t, normalised)
			var ce *validate.CompileError
			require.ErrorAs(t, err, &ce)
			require.Equal(t, tt.wantField, ce.Field)
			require.Equal(t, tt.wantName, ce.Name)
			require.NotEmpty(t, ce.Msg)
			require.Contains(t, ce.Msg, tt.wantMsg)
			require.Contains(t, err.Error(), tt.wantField)
		})
	}
}

func TestCompileAccepts(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		schema     string
		assertions []validate.Assertion
	}{
		{name: "nothing"},
		{name: "null schema", schema: " null "},
		{name: "boolean schema", schema: `true`},
		{name: "local refs", schema: `{"$defs": {"price": {"type": "number"}}, "properties": {"p": {"$ref": "#/$defs/price"}}}`},
		{name: "draft-07 by $schema", schema: `{"$schema": "http://json-schema.org/draft-07/schema#", "definitions": {"a": {}}, "items": [{"type": "string"}]}`},
		{name: "dyn result is checked at run time", assertions: []validate.Assertion{{Name: "flag", Expr: "submission.ok"}}},
		{name: "100 characters of name", assertions: []validate.Assertion{{Name: strings.Repeat("é", 100), Expr: "true"}}},
		{name: "extensions", assertions: []validate.Assertion{
			{Name: "strings", Expr: `"Ab".lowerAscii() == "ab"`},
			{Name: "encoders", Expr: `base64.encode(b"a") == "YQ=="`},
			{Name: "optional", Expr: `submission.?missing.orValue(1) == 1`},
			{Name: "math", Expr: `math.greatest(1, 2) == 2`},
			{Name: "cross type", Expr: `size(submission.items) > 0.5`},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p, _, err := validate.Compile(json.RawMessage(tt.schema), tt.assertions)
			require.NoError(t, err)
			require.NotNil(t, p)
		})
	}
}

func TestCompileNormalises(t *testing.T) {
	t.Parallel()
	in := []validate.Assertion{
		{Name: "a", Expr: "true"},
		{Name: "b", Expr: "true", Severity: validate.SeverityInfo, Message: "custom"},
	}
	_, got, err := validate.Compile(nil, in)
	require.NoError(t, err)
	require.Equal(t, []validate.Assertion{
		{Name: "a", Expr: "true", Severity: validate.SeverityError, Message: "assertion a failed"},
		{Name: "b", Expr: "true", Severity: validate.SeverityInfo, Message: "custom"},
	}, got)
	require.Empty(t, in[0].Severity, "the caller's slice is not modified")

	_, got, err = validate.Compile(nil, nil)
	require.NoError(t, err)
	require.NotNil(t, got, "an empty list is stored as [], not null")
	require.Empty(t, got)
}

func TestRun(t *testing.T) {
	t.Parallel()
	p := mustCompile(t, orderSchema, orderAssertions...)
	tests := []struct {
		name       string
		submission string
		want       []validate.Finding
	}{
		{
			name:       "valid",
			submission: `{"customer": {"name": "Ada", "email": "ada@example.com"}, "items": [{"sku": "a", "price": 1.5}]}`,
			want:       []validate.Finding{},
		},
		{
			name:       "invalid",
			submission: `{"customer": {"email": "nope"}, "items": [{"sku": "a", "price": -1}, {"price": "x"}]}`,
			want: []validate.Finding{
				{Step: "schema", Severity: "error", Path: "/customer", Message: "missing property 'name'"},
				{Step: "schema", Severity: "error", Path: "/customer/email", Message: "'nope' is not valid email: missing @"},
				{Step: "schema", Severity: "error", Path: "/items/0/price", Message: "minimum: got -1, want 0"},
				{Step: "schema", Severity: "error", Path: "/items/1", Message: "missing property 'sku'"},
				{Step: "schema", Severity: "error", Path: "/items/1/price", Message: "got string, want number"},
				// false && error is false in CEL: the first item decides.
				{Step: "assertion:positive_prices", Severity: "warning", Message: "every item needs a positive price"},
				{Step: "assertion:single_item", Severity: "info", Message: "assertion single_item failed"},
			},
		},
		{
			name:       "root of the wrong type",
			submission: `[1, 2]`,
			want: []validate.Finding{
				{Step: "schema", Severity: "error", Path: "", Message: "got array, want object"},
				// An assertion that cannot be evaluated keeps its own severity (see Finding).
				{Step: "assertion:positive_prices", Severity: "warning", Message: "assertion positive_prices could not be evaluated: unsupported index type 'string' in list at submission.items"},
				{Step: "assertion:has_email", Severity: "error", Message: "assertion has_email could not be evaluated: unsupported index type 'string' in list at has(submission.customer.email)"},
				{Step: "assertion:single_item", Severity: "info", Message: "assertion single_item could not be evaluated: unsupported index type 'string' in list at submission.items"},
			},
		},
		{
			name:       "keys that need escaping in a pointer",
			submission: `{"customer": {"name": ""}, "items": [{"sku": "a", "price": 1}]}`,
			want: []validate.Finding{
				{Step: "schema", Severity: "error", Path: "/customer/name", Message: "minLength: got 0, want 1"},
				{Step: "assertion:has_email", Severity: "error", Message: "assertion has_email failed"},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := p.Run(context.Background(), []byte(tt.submission), nil)
			require.NoError(t, err)
			require.Empty(t, cmp.Diff(tt.want, got))
		})
	}
}

func TestRunPointerEscaping(t *testing.T) {
	t.Parallel()
	p := mustCompile(t, `{"additionalProperties": {"type": "string"}}`)
	got, err := p.Run(context.Background(), []byte(`{"a/b": 1, "c~d": 2}`), nil)
	require.NoError(t, err)
	require.Equal(t, []validate.Finding{
		{Step: "schema", Severity: "error", Path: "/a~1b", Message: "got number, want string"},
		{Step: "schema", Severity: "error", Path: "/c~0d", Message: "got number, want string"},
	}, got)
}

func TestRunEvaluationErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		expr       string
		submission string
		wantMsg    string
	}{
		{name: "no such key", expr: "submission.missing > 1", submission: `{}`, wantMsg: "no such key: missing"},
		{name: "type error", expr: "submission.name > 1", submission: `{"name": "x"}`, wantMsg: "no such overload"},
		{name: "result not bool", expr: "submission.name", submission: `{"name": "x"}`, wantMsg: "result is string, want bool"},
		{name: "null result", expr: "submission.name", submission: `{"name": null}`, wantMsg: "want bool"},
		{name: "division by zero", expr: "submission.n / 0 == 1", submission: `{"n": 1}`, wantMsg: "division by zero"},
		// Limits are not findings: TestRunStopsCELGrowth.
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			// An evaluation error has the assertion's own severity (see Finding): a warning
			// rule that cannot be evaluated does not fail the run.
			p := mustCompile(t, "", validate.Assertion{Name: "rule", Expr: tt.expr, Severity: validate.SeverityWarning})
			got, err := p.Run(context.Background(), []byte(tt.submission), nil)
			require.NoError(t, err)
			require.Len(t, got, 1)
			require.Equal(t, "assertion:rule", got[0].Step)
			require.Equal(t, validate.SeverityWarning, got[0].Severity)
			require.Empty(t, got[0].Path)
			require.Contains(t, got[0].Message, "assertion rule")
			require.Contains(t, got[0].Message, tt.wantMsg)
			require.False(t, validate.Failed(got))
		})
	}
}

func TestRunNumbers(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		schema     string
		expr       string
		submission string
		wantSteps  []string // steps of the findings; nil means none
	}{
		{name: "1.0 == 1", expr: "submission.n == 1", submission: `{"n": 1.0}`},
		{name: "1 == 1", expr: "submission.n == 1", submission: `{"n": 1}`},
		{name: "1e2 == 100", expr: "submission.n == 100", submission: `{"n": 1e2}`},
		{name: "integral decimal is an int", expr: "type(submission.n) == int", submission: `{"n": 1.0}`},
		{name: "fraction is a double", expr: "type(submission.n) == double", submission: `{"n": 1.5}`},
		{name: "12 > 10", expr: "submission.amount > 10", submission: `{"amount": 12}`},
		{name: "12.5 > 10", expr: "submission.amount > 10", submission: `{"amount": 12.5}`},
		{name: "10 > 10 is false", expr: "submission.amount > 10", submission: `{"amount": 10}`, wantSteps: []string{"assertion:a"}},
		{name: "10.5 > 10.25", expr: "submission.amount > 10.25", submission: `{"amount": 10.5}`},
		{name: "int64 max is exact", expr: "submission.n == 9223372036854775807", submission: `{"n": 9223372036854775807}`},
		{name: "int64 min is exact", expr: "submission.n == -9223372036854775807 - 1", submission: `{"n": -9223372036854775808}`},
		{
			name: "past int64 becomes a double", expr: "type(submission.n) == double && submission.n > 9223372036854775807",
			submission: `{"n": 18446744073709551616}`,
		},
		{name: "numbers in arrays", expr: "submission.xs == [1, 2.5]", submission: `{"xs": [1.0, 2.5]}`},
		{name: "schema: 1.0 is an integer", schema: `{"type": "integer"}`, submission: `1.0`},
		{name: "schema: 1.5 is not an integer", schema: `{"type": "integer"}`, submission: `1.5`, wantSteps: []string{"schema"}},
		{name: "schema: big integer at the maximum", schema: `{"maximum": 9007199254740993}`, submission: `9007199254740993`},
		{name: "schema: big integer past the maximum", schema: `{"maximum": 9007199254740993}`, submission: `9007199254740994`, wantSteps: []string{"schema"}},
		{name: "schema: big integers differ", schema: `{"const": 12345678901234567890}`, submission: `12345678901234567891`, wantSteps: []string{"schema"}},
		{name: "schema: decimal multipleOf", schema: `{"multipleOf": 0.01}`, submission: `0.07`},
		{name: "schema: decimal not a multipleOf", schema: `{"multipleOf": 0.01}`, submission: `0.075`, wantSteps: []string{"schema"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var assertions []validate.Assertion
			if tt.expr != "" {
				assertions = append(assertions, validate.Assertion{Name: "a", Expr: tt.expr})
			}
			p := mustCompile(t, tt.schema, assertions...)
			got, err := p.Run(context.Background(), []byte(tt.submission), nil)
			require.NoError(t, err)
			var steps []string
			for _, f := range got {
				steps = append(steps, f.Step)
			}
			require.Equal(t, tt.wantSteps, steps, "findings: %v", got)
		})
	}
}

func TestRunNumberMessages(t *testing.T) {
	t.Parallel()
	tests := []struct {
		schema, submission, want string
	}{
		{`{"maximum": 9007199254740993}`, `9007199254740994`, "maximum: got 9007199254740994, want 9007199254740993"},
		{`{"maximum": 0.1}`, `0.10000000000000000001`, "maximum: got 0.10000000000000000001, want 0.1"},
		{`{"minimum": 1000}`, `999.5`, "minimum: got 999.5, want 1000"},
		{`{"exclusiveMinimum": 0}`, `0`, "exclusiveMinimum: got 0, want 0"},
		{`{"multipleOf": 0.01}`, `1234567.123`, "multipleOf: got 1234567.123, want 0.01"},
		{`{"maximum": 1e-7}`, `1e300`, "maximum: got 1e+300, want 1e-07"},
		{`{"maxLength": 1000}`, `"` + strings.Repeat("x", 1234) + `"`, "maxLength: got 1234, want 1000"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			t.Parallel()
			got, err := mustCompile(t, tt.schema).Run(context.Background(), []byte(tt.submission), nil)
			require.NoError(t, err)
			require.Equal(t, []validate.Finding{{Step: "schema", Severity: "error", Path: "", Message: tt.want}}, got)
		})
	}
}

func TestRunMetadata(t *testing.T) {
	t.Parallel()
	p := mustCompile(t, "",
		validate.Assertion{Name: "from_api", Expr: `metadata.?source.orValue("") == "api"`},
		validate.Assertion{Name: "empty", Expr: `size(metadata) == 0`},
	)
	tests := []struct {
		name      string
		metadata  []byte
		wantSteps []string
		wantErr   error
	}{
		{name: "absent", metadata: nil, wantSteps: []string{"assertion:from_api"}},
		{name: "empty", metadata: []byte{}, wantSteps: []string{"assertion:from_api"}},
		{name: "null", metadata: []byte(" null "), wantSteps: []string{"assertion:from_api"}},
		{name: "empty object", metadata: []byte(`{}`), wantSteps: []string{"assertion:from_api"}},
		{name: "present", metadata: []byte(`{"source": "api"}`), wantSteps: []string{"assertion:empty"}},
		{name: "other value", metadata: []byte(`{"source": "batch", "n": 1.0}`), wantSteps: []string{"assertion:from_api", "assertion:empty"}},
		{name: "not an object", metadata: []byte(`[1]`), wantErr: validate.ErrInvalidMetadata},
		{name: "not JSON", metadata: []byte(`{`), wantErr: validate.ErrInvalidMetadata},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := p.Run(context.Background(), []byte(`{}`), tt.metadata)
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
				require.Nil(t, got)
				return
			}
			require.NoError(t, err)
			var steps []string
			for _, f := range got {
				steps = append(steps, f.Step)
			}
			require.Equal(t, tt.wantSteps, steps)
		})
	}
}

func TestRunInvalidSubmission(t *testing.T) {
	t.Parallel()
	p := mustCompile(t, orderSchema, orderAssertions...)
	for _, sub := range []string{"", "{", `{"a": 1} {}`, "nul", "'x'"} {
		t.Run(sub, func(t *testing.T) {
			t.Parallel()
			got, err := p.Run(context.Background(), []byte(sub), nil)
			require.ErrorIs(t, err, validate.ErrInvalidSubmission)
			require.Nil(t, got)
		})
	}
}

// A workflow without rules reads nothing of the submission: a run checks
// that it is JSON without decoding it, so that a 1 MB array of numbers does
// not cost tens of megabytes per run in the worker.
func TestRunWithoutRules(t *testing.T) {
	p := mustCompile(t, "")
	for _, sub := range []string{"", "{", `{"a": 1} {}`} {
		got, err := p.Run(context.Background(), []byte(sub), nil)
		require.ErrorIs(t, err, validate.ErrInvalidSubmission, "%q", sub)
		require.Nil(t, got)
	}
	_, err := p.Run(context.Background(), []byte(`1`), []byte(`[]`))
	require.ErrorIs(t, err, validate.ErrInvalidMetadata)

	sub := []byte(`[` + strings.Repeat("1,", 500_000) + `1]`)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	got, err := p.Run(context.Background(), sub, []byte(`{"k":"v"}`))
	runtime.ReadMemStats(&after)
	require.NoError(t, err)
	require.Equal(t, []validate.Finding{}, got)
	require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(len(sub)), "the submission was decoded")
}

func TestRunAnyJSONValue(t *testing.T) {
	t.Parallel()
	p := mustCompile(t, "", validate.Assertion{Name: "a", Expr: "submission == null || submission == true || submission == 1 || submission == 'x'"})
	for _, sub := range []string{"null", "true", "1", `"x"`} {
		got, err := p.Run(context.Background(), []byte(sub), nil)
		require.NoError(t, err)
		require.Empty(t, got, sub)
	}
}

func TestRunDeterministic(t *testing.T) {
	t.Parallel()
	// anyOf and several errors per location are where an unordered walk would show.
	schema := `{
		"type": "object",
		"properties": {
			"a": {"anyOf": [{"type": "string"}, {"type": "integer", "minimum": 10}]},
			"b": {"type": "array", "items": {"type": "string", "minLength": 3, "pattern": "^x"}},
			"c": {"allOf": [{"minimum": 5}, {"multipleOf": 2}]}
		},
		"required": ["z", "y", "x"]
	}`
	p := mustCompile(t, schema, orderAssertions[1:]...)
	sub := []byte(`{"a": 1.5, "b": ["a", "bb", 3], "c": 3, "customer": {}, "items": []}`)
	first, err := p.Run(context.Background(), sub, nil)
	require.NoError(t, err)
	require.NotEmpty(t, first)

	var wg sync.WaitGroup
	results := make([][]validate.Finding, 8)
	for i := range results {
		wg.Go(func() {
			results[i], _ = p.Run(context.Background(), sub, nil)
		})
	}
	wg.Wait()
	for _, got := range results {
		require.Empty(t, cmp.Diff(first, got))
	}
}

func TestRunContext(t *testing.T) {
	t.Parallel()
	p := mustCompile(t, `{"type": "object"}`, validate.Assertion{Name: "a", Expr: "true"})

	t.Run("cancelled before", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		got, err := p.Run(ctx, []byte(`{}`), nil)
		require.ErrorIs(t, err, context.Canceled)
		require.Nil(t, got)
	})

	t.Run("cancelled during an evaluation", func(t *testing.T) {
		t.Parallel()
		// Long enough to be interrupted on any machine: cel-go's cost tracking is quadratic.
		slow := mustCompile(t, "", validate.Assertion{Name: "slow", Expr: "submission.all(x, x >= 0)"})
		sub := []byte("[" + strings.Repeat("1,", 100_000) + "1]")
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(20*time.Millisecond, cancel)
		got, err := slow.Run(ctx, sub, nil)
		require.ErrorIs(t, err, context.Canceled)
		require.Nil(t, got)
	})
}

func TestRunEvalTimeout(t *testing.T) {
	t.Parallel()
	p := mustCompile(t, "", validate.Assertion{Name: "slow", Expr: "submission.all(x, x >= 0)", Severity: validate.SeverityInfo})
	validate.SetEvalTimeout(p, time.Millisecond)
	sub := []byte("[" + strings.Repeat("1,", 100_000) + "1]")
	got, err := p.Run(context.Background(), sub, nil)
	// The caller's context is fine: the submission is at fault, and a retry cannot help.
	require.Nil(t, got)
	requireLimit(t, err, "assertion:slow", "EvalTimeout")
	require.NotErrorIs(t, err, context.DeadlineExceeded)
	require.Contains(t, err.Error(), "more than 1ms of CPU time")
}

func TestFailed(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		findings []validate.Finding
		want     bool
	}{
		{name: "nil", findings: nil, want: false},
		{name: "warnings and infos", findings: []validate.Finding{{Severity: validate.SeverityWarning}, {Severity: validate.SeverityInfo}}, want: false},
		{name: "one error", findings: []validate.Finding{{Severity: validate.SeverityInfo}, {Severity: validate.SeverityError}}, want: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.want, validate.Failed(tt.findings))
		})
	}
}

func TestCompileErrorMessage(t *testing.T) {
	t.Parallel()
	require.Equal(t, `assertions[3] ("x"): boom`, (&validate.CompileError{Field: "assertions[3]", Name: "x", Msg: "boom"}).Error())
	require.Equal(t, "schema: boom", (&validate.CompileError{Field: "schema", Msg: "boom"}).Error())
	var ce *validate.CompileError
	require.False(t, errors.As(errors.New("x"), &ce))
}

func BenchmarkRun(b *testing.B) {
	p := mustCompile(b, orderSchema, orderAssertions...)
	sub := []byte(`{"customer": {"name": "Ada", "email": "ada@example.com"}, "items": [{"sku": "a", "price": 1.5}, {"sku": "b", "price": 2}]}`)
	meta := []byte(`{"source": "api"}`)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := p.Run(ctx, sub, meta); err != nil {
			b.Fatal(err)
		}
	}
}

// A fresh environment compiles expressions at once from the first: one
// naming an unknown identifier and one with a comprehension, which in
// cel-go 0.33.2 race on the checker's symbol catalog unless the
// environment was readied (go test -race reports it).
func TestCompileConcurrentlyFromTheFirstExpression(t *testing.T) {
	for range 20 {
		env, err := validate.NewCELEnv()
		require.NoError(t, err)
		var wg sync.WaitGroup
		var known, unknown error
		wg.Go(func() { _, iss := env.Compile("[1, 2].all(x, x > 0)"); known = iss.Err() })
		wg.Go(func() { _, iss := env.Compile("undeclared_name > 1"); unknown = iss.Err() })
		wg.Wait()
		require.NoError(t, known)
		require.ErrorContains(t, unknown, "undeclared_name")
	}
}
