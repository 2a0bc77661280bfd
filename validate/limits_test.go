package validate_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/validate"
)

// hangGuard is how long a test waits for Run before it declares a hang. It guards against a
// build that never stops (the bug these tests are about); it is not a timing assertion. Its
// limits count CPU time, which a box with many times more work than cores hands out slowly
// (at a load of 25 on two cores, 60 s were not enough).
const hangGuard = 2 * time.Minute

// runGuarded runs p.Run in its own goroutine and fails the test if it never returns.
func runGuarded(t *testing.T, ctx context.Context, p *validate.Program, submission []byte) ([]validate.Finding, error) {
	t.Helper()
	type result struct {
		findings []validate.Finding
		err      error
	}
	done := make(chan result, 1)
	go func() {
		f, err := p.Run(ctx, submission, nil)
		done <- result{f, err}
	}()
	select {
	case r := <-done:
		return r.findings, r.err
	case <-time.After(hangGuard):
		t.Fatalf("Run did not return within %v", hangGuard)
		return nil, nil
	}
}

// requireGoroutinesBack waits until the goroutine count is back to baseline: a validation
// that hit a limit must not keep running in an abandoned goroutine. (Not require.Eventually:
// it runs its condition in a goroutine of its own.)
func requireGoroutinesBack(t *testing.T, baseline int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); runtime.NumGoroutine() > baseline; {
		if time.Now().After(deadline) {
			t.Fatalf("goroutines: %d, baseline %d", runtime.NumGoroutine(), baseline)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// requireLimit checks that err is the LimitError of step for limit.
func requireLimit(t *testing.T, err error, step, limit string) *validate.LimitError {
	t.Helper()
	require.ErrorIs(t, err, validate.ErrLimitExceeded)
	var le *validate.LimitError
	require.ErrorAs(t, err, &le)
	require.Equal(t, step, le.Step, "error: %v", err)
	require.Equal(t, limit, le.Limit, "error: %v", err)
	require.Contains(t, err.Error(), limit, "the message names the limit")
	if name, ok := strings.CutPrefix(step, validate.StepAssertionPrefix); ok {
		require.Contains(t, err.Error(), "assertion "+name, "the message names the assertion")
	}
	return le
}

// fanOutDefs are the definitions of the schema from the report: d0..d(levels-1), each
// applying the next one twice through kw (allOf, anyOf, oneOf, or properties a and b), so that
// validating a value visits about 2^levels subschemas; d(levels) is leaf.
func fanOutDefs(levels int, kw, leaf string) string {
	defs := make([]string, 0, levels+1)
	for i := range levels {
		ref := fmt.Sprintf(`{"$ref": "#/$defs/d%d"}`, i+1)
		if kw == "properties" {
			defs = append(defs, fmt.Sprintf(`"d%d": {"properties": {"a": %s, "b": %s}}`, i, ref, ref))
			continue
		}
		defs = append(defs, fmt.Sprintf(`"d%d": {%q: [%s, %s]}`, i, kw, ref, ref))
	}
	defs = append(defs, fmt.Sprintf(`"d%d": %s`, levels, leaf))
	return `"$defs": {` + strings.Join(defs, ", ") + `}`
}

// fanOutSchema applies the fan-out to the submission itself: the report's schema.
func fanOutSchema(levels int, kw string) string {
	return `{` + fanOutDefs(levels, kw, `{"type": "number"}`) + `, "$ref": "#/$defs/d0"}`
}

func TestCompileRejectsSchemaFanOut(t *testing.T) {
	t.Parallel()
	bigEnum := make([]string, validate.MaxSchemaNodes+1)
	for i := range bigEnum {
		bigEnum[i] = fmt.Sprint(i)
	}
	tests := []struct {
		name   string
		schema string
	}{
		{name: "40 levels of allOf, the report's 2.9 KB schema", schema: fanOutSchema(40, "allOf")},
		{name: "40 levels of anyOf", schema: fanOutSchema(40, "anyOf")},
		{name: "40 levels of oneOf", schema: fanOutSchema(40, "oneOf")},
		{name: "15 levels, the first past the limit", schema: fanOutSchema(15, "allOf")},
		{name: "fan-out through properties", schema: fanOutSchema(40, "properties")},
		{name: "an enum longer than the limit", schema: `{"enum": [` + strings.Join(bigEnum, ",") + `]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.True(t, json.Valid([]byte(tt.schema)), tt.schema)
			p, _, err := validate.Compile(json.RawMessage(tt.schema), nil)
			require.True(t, p == nil, "compiled")
			var ce *validate.CompileError
			require.ErrorAs(t, err, &ce)
			require.Equal(t, "schema", ce.Field)
			require.Contains(t, ce.Msg, "MaxSchemaNodes")
			require.Contains(t, ce.Msg, fmt.Sprint(validate.MaxSchemaNodes))
		})
	}
}

func TestCompileAcceptsSchemasWithinLimits(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		schema string
	}{
		{name: "14 levels of allOf, the most under the limit", schema: fanOutSchema(14, "allOf")},
		{name: "recursive tree", schema: `{"$defs": {"node": {"type": "object", "properties": {"name": {"type": "string"},
			"children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}}, "$ref": "#/$defs/node"}`},
		{name: "a definition referenced from many places", schema: `{"$defs": {"money": {"type": "number", "minimum": 0}},
			"properties": {"a": {"$ref": "#/$defs/money"}, "b": {"$ref": "#/$defs/money"}, "c": {"items": {"$ref": "#/$defs/money"}}}}`},
		{name: "README invoice", schema: readmeSchema},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, _, err := validate.Compile(json.RawMessage(tt.schema), nil)
			require.NoError(t, err)
		})
	}
}

// TestRunStopsSlowSchema runs schemas that compile but would take minutes or years on a crafted
// submission. Run must stop at the work limit, return ErrLimitExceeded, and leave nothing
// running. Not parallel: it counts goroutines.
func TestRunStopsSlowSchema(t *testing.T) {
	nested := func(depth int) []byte { return []byte(strings.Repeat("[", depth) + strings.Repeat("]", depth)) }
	tests := []struct {
		name       string
		schema     string
		submission []byte
	}{
		{
			// Compiles (the recursion is cut at the back edge) yet doubles at every level of
			// the instance: 2^40 visits for an 80-byte submission.
			name: "recursive fan-out on a nested array",
			schema: `{"$defs": {"r": {"type": "array", "items": {"allOf": [{"$ref": "#/$defs/r"}, {"$ref": "#/$defs/r"}]}}},
				"$ref": "#/$defs/r"}`,
			submission: nested(40),
		},
		{
			// Draft-07 ignores the keywords beside a $ref, extensions included.
			name: "recursive fan-out, draft-07",
			schema: `{"$schema": "http://json-schema.org/draft-07/schema#", "definitions": {"r": {"type": "array",
				"items": {"allOf": [{"$ref": "#/definitions/r"}, {"$ref": "#/definitions/r"}]}}}, "$ref": "#/definitions/r"}`,
			submission: nested(40),
		},
		{
			// 2^13 subschema visits per item, within MaxSchemaNodes, times 50,000 items.
			name:       "fan-out within the compile limit times a big array",
			schema:     `{` + fanOutDefs(13, "allOf", `{"type": "number"}`) + `, "items": {"$ref": "#/$defs/d0"}}`,
			submission: []byte("[" + strings.Repeat("1,", 50_000) + "1]"),
		},
		{
			// Every member of the object is matched against every pattern, inside one
			// subschema's loop: the regexp engine counts each match.
			name: "many patternProperties on a big object",
			schema: func() string {
				patterns := make([]string, 1000)
				for i := range patterns {
					patterns[i] = fmt.Sprintf(`"^p%d$": {"type": "string"}`, i)
				}
				return `{"patternProperties": {` + strings.Join(patterns, ", ") + `}}`
			}(),
			submission: func() []byte {
				members := make([]string, 100_000)
				for i := range members {
					members[i] = fmt.Sprintf(`"m%d": 1`, i)
				}
				return []byte("{" + strings.Join(members, ", ") + "}")
			}(),
		},
		{
			name:       "anyOf whose branches all fail, on every item",
			schema:     `{` + fanOutDefs(13, "anyOf", `{"type": "string"}`) + `, "items": {"$ref": "#/$defs/d0"}}`,
			submission: []byte("[" + strings.Repeat("1,", 50_000) + "1]"),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustCompile(t, tt.schema)
			// MaxSchemaSteps comes first on any machine, -race included; the backstop is
			// tested below.
			validate.SetSchemaTimeout(p, time.Hour)
			baseline := runtime.NumGoroutine()
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			got, err := runGuarded(t, context.Background(), p, tt.submission)
			runtime.ReadMemStats(&after)
			require.Nil(t, got)
			le := requireLimit(t, err, validate.StepSchema, "MaxSchemaSteps")
			require.Contains(t, le.Error(), fmt.Sprint(validate.MaxSchemaSteps))
			// Generous: the library keeps every error it finds until the validation ends,
			// about a hundred bytes a step at worst; unbounded, these never end.
			allocated := after.TotalAlloc - before.TotalAlloc
			require.Less(t, allocated, uint64(512<<20), "allocated %d MiB", allocated>>20)
			requireGoroutinesBack(t, baseline)
		})
	}

	t.Run("the caller's context stops it too", func(t *testing.T) {
		p := mustCompile(t, tests[0].schema)
		baseline := runtime.NumGoroutine()
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		// Already cancelled: Run checks before starting. Cancelled during validation:
		ctx2, cancel2 := context.WithCancel(context.Background())
		time.AfterFunc(10*time.Millisecond, cancel2)
		_, err := runGuarded(t, ctx, p, nested(40))
		require.ErrorIs(t, err, context.Canceled)
		_, err = runGuarded(t, ctx2, p, nested(40))
		require.ErrorIs(t, err, context.Canceled)
		require.NotErrorIs(t, err, validate.ErrLimitExceeded, "the caller stopped it: not the submission's fault")
		requireGoroutinesBack(t, baseline)
	})

	t.Run("timeout backstop", func(t *testing.T) {
		p := mustCompile(t, tests[0].schema)
		validate.SetSchemaTimeout(p, time.Millisecond)
		_, err := runGuarded(t, context.Background(), p, nested(40))
		// Whichever comes first on this machine; both are limits of this submission.
		var le *validate.LimitError
		require.ErrorAs(t, err, &le)
		require.Contains(t, []string{"SchemaTimeout", "MaxSchemaSteps"}, le.Limit)
	})
}

// TestRunEnumAndConst: enum and const are checked by the step counter, in a set rather than
// by the library's comparison with every value in turn.
func TestRunEnumAndConst(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, schema, submission string
		want                     []validate.Finding
	}{
		{name: "number by value", schema: `{"enum": [1, 2.5, "x"]}`, submission: `1.0`, want: []validate.Finding{}},
		{name: "exponent", schema: `{"enum": [100]}`, submission: `1e2`, want: []validate.Finding{}},
		{name: "big integers stay exact", schema: `{"enum": [12345678901234567890]}`, submission: `12345678901234567891`,
			want: []validate.Finding{{Step: "schema", Severity: "error", Message: "value must be 12345678901234567890"}}},
		{name: "object in any key order", schema: `{"enum": [{"a": 1, "b": [true, null]}]}`, submission: `{"b": [true, null], "a": 1.0}`, want: []validate.Finding{}},
		{name: "not one of", schema: `{"enum": ["a", "b"]}`, submission: `"c"`,
			want: []validate.Finding{{Step: "schema", Severity: "error", Message: "value must be one of 'a', 'b'"}}},
		{name: "string is not a number", schema: `{"enum": [1]}`, submission: `"1"`,
			want: []validate.Finding{{Step: "schema", Severity: "error", Message: "value must be 1"}}},
		{name: "const", schema: `{"properties": {"v": {"const": "x"}}}`, submission: `{"v": "y"}`,
			want: []validate.Finding{{Step: "schema", Severity: "error", Path: "/v", Message: "value must be 'x'"}}},
		{name: "const object", schema: `{"const": {"a": [1, 2]}}`, submission: `{"a": [1, 2.0]}`, want: []validate.Finding{}},
		{
			// The library stopped at enum; the other keywords of the subschema now speak too.
			name: "enum and another keyword", schema: `{"type": "string", "enum": ["abcd"], "minLength": 3}`, submission: `"x"`,
			want: []validate.Finding{
				{Step: "schema", Severity: "error", Message: "minLength: got 1, want 3"},
				{Step: "schema", Severity: "error", Message: "value must be 'abcd'"},
			},
		},
		{
			name:       "draft-07 ignores an enum beside a $ref, as before",
			schema:     `{"$schema": "http://json-schema.org/draft-07/schema#", "definitions": {"s": {"type": "string"}}, "properties": {"v": {"$ref": "#/definitions/s", "enum": ["z"]}}}`,
			submission: `{"v": "y"}`, want: []validate.Finding{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := mustCompile(t, tt.schema).Run(context.Background(), []byte(tt.submission), nil)
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}

	t.Run("an enum of numbers on every item of a big array", func(t *testing.T) {
		t.Parallel()
		values := make([]string, 1000)
		for i := range values {
			values[i] = fmt.Sprint(i)
		}
		// The library compares each item with each value, parsing both as big.Rat: 300
		// million comparisons, minutes. Counted: one set lookup per item.
		p := mustCompile(t, `{"items": {"enum": [`+strings.Join(values, ",")+`]}}`)
		validate.SetSchemaTimeout(p, time.Hour) // the work is what is counted, on any machine
		got, err := runGuarded(t, context.Background(), p, []byte("["+strings.Repeat("999.0,", 299_999)+"1000]"))
		require.NoError(t, err)
		require.Len(t, got, 1)
		require.Equal(t, "/299999", got[0].Path)
		require.True(t, strings.HasPrefix(got[0].Message, "value must be one of 0, 1, 2, 3,"), got[0].Message)
	})
}

func TestRunCapsSchemaFindings(t *testing.T) {
	t.Parallel()
	p := mustCompile(t, `{"items": {"type": "string"}}`)
	n := validate.MaxSchemaFindings + 400
	got, err := p.Run(context.Background(), []byte("["+strings.Repeat("1,", n-1)+"1]"), nil)
	require.NoError(t, err)
	require.Len(t, got, validate.MaxSchemaFindings+1)
	// Path order is string order: /0, /1, /10, /100, /101...
	require.Equal(t, validate.Finding{Step: "schema", Severity: "error", Path: "/0", Message: "got number, want string"}, got[0])
	require.Equal(t, validate.Finding{Step: "schema", Severity: "error", Path: "/10", Message: "got number, want string"}, got[2])
	require.Equal(t, validate.Finding{Step: "schema", Severity: "error",
		Message: "400 more schema errors are not listed: only the first 100 findings in path order are (MaxSchemaFindings)"},
		got[validate.MaxSchemaFindings])
	require.True(t, validate.Failed(got))

	again, err := p.Run(context.Background(), []byte("["+strings.Repeat("1,", n-1)+"1]"), nil)
	require.NoError(t, err)
	require.Equal(t, got, again)
}

// TestRunBudgetsArePerRun runs heavy and light submissions of one Program concurrently: each
// run has its own counters, so the light ones pass whatever the heavy ones do.
func TestRunBudgetsArePerRun(t *testing.T) {
	t.Parallel()
	p := mustCompile(t, `{"$defs": {"r": {"type": "array", "items": {"allOf": [{"$ref": "#/$defs/r"}, {"$ref": "#/$defs/r"}]}}},
		"$ref": "#/$defs/r"}`,
		validate.Assertion{Name: "small", Expr: `size(submission) < 3 || [["ab"]].map(l, l + l).map(l, l + l).map(l, l + l).map(l, l + l).map(l, l + l).map(l, l + l).map(l, l + l).map(l, l + l).map(l, l + l).map(l, l + l).map(l, l + l).map(l, l + l).map(l, l + l).map(l, l + l).map(l, l + l).map(l, l + l).map(l, l + l).map(l, l + l).map(l, l + l).map(l, l + l).map(l, l + l).map(l, l + l).map(l, l + l).map(l, l + l)[0].join("") != ""`},
	)
	// Step and size limits come first on any machine, -race and a loaded CPU included.
	validate.SetSchemaTimeout(p, time.Hour)
	validate.SetEvalTimeout(p, time.Hour)
	heavySchema := []byte(strings.Repeat("[", 40) + strings.Repeat("]", 40))
	heavyCEL := []byte(`[[], [], []]`)
	light := []byte(`[[[]], []]`)
	var wg sync.WaitGroup
	errs := make([]error, 12)
	for i := range errs {
		sub := [][]byte{heavySchema, heavyCEL, light}[i%3]
		wg.Go(func() {
			_, errs[i] = p.Run(context.Background(), sub, nil)
		})
	}
	wg.Wait()
	for i, err := range errs {
		switch i % 3 {
		case 0:
			requireLimit(t, err, validate.StepSchema, "MaxSchemaSteps")
		case 1:
			requireLimit(t, err, "assertion:small", "MaxValueSize")
		default:
			require.NoError(t, err, "run %d", i)
		}
	}
}

func TestCompileRejectsUnboundedExpressions(t *testing.T) {
	t.Parallel()
	// The report's 69 KB expression: a balanced tree of concatenations of one field.
	var tree func(depth int) string
	tree = func(depth int) string {
		if depth == 0 {
			return "submission.s"
		}
		s := tree(depth - 1)
		return "(" + s + " + " + s + ")"
	}
	tooMany := make([]validate.Assertion, validate.MaxAssertions+1)
	for i := range tooMany {
		tooMany[i] = validate.Assertion{Name: fmt.Sprintf("a%d", i), Expr: "true"}
	}
	tests := []struct {
		name       string
		assertions []validate.Assertion
		wantField  string
		wantMsg    []string
	}{
		{
			name:       "the report's 69 KB concatenation tree",
			assertions: []validate.Assertion{{Name: "tree", Expr: tree(12) + ` == ""`}},
			wantField:  "assertions[0]", wantMsg: []string{"MaxExprLength", fmt.Sprint(validate.MaxExprLength)},
		},
		{
			name:       "just past the length limit",
			assertions: []validate.Assertion{{Name: "long", Expr: strings.Repeat(" ", validate.MaxExprLength-3) + "true"}},
			wantField:  "assertions[0]", wantMsg: []string{"MaxExprLength"},
		},
		{
			name:       "nesting past the depth limit",
			assertions: []validate.Assertion{{Name: "deep", Expr: strings.Repeat("[", 40) + "1" + strings.Repeat("]", 40) + ` != []`}},
			wantField:  "assertions[0]", wantMsg: []string{"MaxExprDepth", fmt.Sprint(validate.MaxExprDepth)},
		},
		{
			name:       "a concatenation chain past the depth limit",
			assertions: []validate.Assertion{{Name: "chain", Expr: strings.Repeat(`submission.s + `, 60) + `"" != ""`}},
			wantField:  "assertions[0]", wantMsg: []string{"MaxExprDepth"},
		},
		{
			name:       "a loop over the submission inside a loop over it",
			assertions: []validate.Assertion{{Name: "quadratic", Expr: `submission.items.all(i, submission.items.exists_one(j, j.id == i.id))`}},
			wantField:  "assertions[0]", wantMsg: []string{"MaxEstimatedCost", "estimated"},
		},
		{
			name:       "three nested loops over constant ranges",
			assertions: []validate.Assertion{{Name: "cubic", Expr: `lists.range(10000).all(i, lists.range(10000).all(j, lists.range(10000).all(k, k >= 0)))`}},
			wantField:  "assertions[0]", wantMsg: []string{"MaxEstimatedCost"},
		},
		{
			// Replace with a replacement of unknown size can square the string. (Up to
			// cel-go v0.31 a literal's loop variable was of unknown size too; since
			// cel.dev/cel-go v0.32 the estimate knows ["aaaaaaaaaa"]'s element is 10 bytes.)
			name:       "replace squaring a string",
			assertions: []validate.Assertion{{Name: "square", Expr: `submission.s.replace("a", submission.s) != ""`}},
			wantField:  "assertions[0]", wantMsg: []string{"MaxEstimatedCost"},
		},
		{
			// Of a list of the submission: since cel.dev/cel-go v0.32 the estimate knows
			// that lists.range(10000) has 10,000 elements, and 128 times that is within it.
			name:       "flatten of a list of doubled lists",
			assertions: []validate.Assertion{{Name: "flat", Expr: `[[submission.items]]` + strings.Repeat(`.map(m, m + m)`, 7) + `[0].flatten().size() > 0`}},
			wantField:  "assertions[0]", wantMsg: []string{"MaxEstimatedCost"},
		},
		{
			// Since cel.dev/cel-go v0.32 the estimate follows the size of a string built
			// by doubling a literal: a 128 KB string joined 1,024 times (128 MB) is
			// refused here; up to v0.31 only the run stopped it (MaxValueSize).
			name: "join of a 128 KB string shared by 1,024 elements",
			assertions: []validate.Assertion{{Name: "join", Expr: `[` + `["a"]` + strings.Repeat(`.map(s, s + s)`, 17) + `]` +
				strings.Repeat(`.map(l, l + l)`, 10) + `[0].join("") == ""`}},
			wantField: "assertions[0]", wantMsg: []string{"MaxEstimatedCost", "estimated"},
		},
		{
			name:       "more assertions than the limit",
			assertions: tooMany,
			wantField:  "assertions", wantMsg: []string{"MaxAssertions", fmt.Sprint(validate.MaxAssertions)},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p, _, err := validate.Compile(nil, tt.assertions)
			require.Nil(t, p)
			var ce *validate.CompileError
			require.ErrorAs(t, err, &ce)
			require.Equal(t, tt.wantField, ce.Field)
			for _, m := range tt.wantMsg {
				require.Contains(t, ce.Msg, m)
			}
		})
	}
}

// The README's example assertions and the everyday shapes of rules must keep compiling.
func TestCompileAcceptsEverydayExpressions(t *testing.T) {
	t.Parallel()
	for _, expr := range []string{
		`submission.total > 0`,
		`submission.total < 10000`,
		`submission.items.all(i, i.qty > 0)`,
		`size(submission.name) < 100`,
		`submission.?x.orValue(0) == 0`,
		`metadata.?source.orValue("") == "api"`,
		`submission.items.all(i, i.tags.all(t, size(t) < 20))`,
		`submission.items.all(i, i.email.matches("^[^@]+@[^@]+$"))`,
		`submission.items.map(i, i.price * i.qty).exists(x, x > 1000)`,
		`submission.items.filter(i, i.qty > 10).size() < 5`,
		`submission.tags.join(",").size() < 200`,
		`submission.name.lowerAscii().startsWith("a")`,
		`submission.customer.name + " " + submission.customer.surname != ""`,
		`lists.range(1000).map(i, lists.range(1000)).size() > 0`,
		strings.Repeat(`submission.a > 0 && `, 30) + `true`,
	} {
		t.Run(expr, func(t *testing.T) {
			t.Parallel()
			_, _, err := validate.Compile(nil, []validate.Assertion{{Name: "a", Expr: expr}})
			require.NoError(t, err)
		})
	}
}

// TestRunStopsCELGrowth evaluates expressions that double a value at every step. Each must
// stop at a limit, long before it allocates much, and name the assertion and the limit.
// Not parallel: it measures allocations.
func TestRunStopsCELGrowth(t *testing.T) {
	doubled := func(seed, step string, n int) string { return seed + strings.Repeat(step, n) }
	var tree func(depth int) string
	tree = func(depth int) string {
		if depth == 0 {
			return "submission.s"
		}
		s := tree(depth - 1)
		return "(" + s + " + " + s + ")"
	}
	big := func(n int) []byte { return []byte(`{"s": "` + strings.Repeat("a", n) + `"}`) }
	tests := []struct {
		name       string
		expr       string
		submission []byte
		limit      string
	}{
		{
			name:  "list concatenation doubling, then join",
			expr:  doubled(`[["a"]]`, `.map(l, l + l)`, 24) + `[0].join("") == ""`,
			limit: "MaxValueSize",
		},
		{
			name:  "string concatenation doubling",
			expr:  doubled(`["ab"]`, `.map(s, s + s)`, 24) + `[0] == ""`,
			limit: "MaxValueSize",
		},
		{
			name:  "replace growing a long string",
			expr:  doubled(`["a"]`, `.map(s, s + s)`, 19) + `[0].replace("a", "aaaa") == ""`,
			limit: "MaxValueSize",
		},
		{
			// 64 KB joined 1,024 times: within the static estimate (the 128 KB one is
			// refused when it compiles), past MaxValueSize.
			name:  "join of one big string shared by many elements",
			expr:  doubled(`[`+doubled(`["a"]`, `.map(s, s + s)`, 16)+`]`, `.map(l, l + l)`, 10) + `[0].join("") == ""`,
			limit: "MaxValueSize",
		},
		{
			name:  "format of a list of one big shared string",
			expr:  `"%s".format([` + doubled(`[`+doubled(`["a"]`, `.map(s, s + s)`, 16)+`]`, `.map(l, l + l)`, 10) + `[0]]) == ""`,
			limit: "MaxValueSize",
		},
		{
			name:  "equality of a value that shares itself at every level",
			expr:  doubled(`[[1]]`, `.map(v, [v, v])`, 24) + `.map(d, d == d)[0]`,
			limit: "MaxValueSize",
		},
		{
			name:       "the report's concatenation tree, over a 200 KB string",
			expr:       tree(6) + ` == ""`,
			submission: big(200_000),
			limit:      "MaxValueSize",
		},
		{
			name:       "many strings each under the size limit",
			expr:       `lists.range(200).map(i, submission.s + submission.s).size() == 0`,
			submission: big(400_000),
			limit:      "MemoryLimit",
		},
		{
			name:  "nested loops within the static estimate",
			expr:  `lists.range(3000).all(i, lists.range(3000).all(j, j >= 0))`,
			limit: "CostLimit",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustCompile(t, "", validate.Assertion{Name: "grow", Expr: tt.expr, Severity: validate.SeverityInfo})
			// The limits counted here come first on any machine, -race included; the
			// backstop's own test is TestRunEvalTimeout.
			validate.SetEvalTimeout(p, time.Hour)
			sub := tt.submission
			if sub == nil {
				sub = []byte(`{}`)
			}
			baseline := runtime.NumGoroutine()
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			got, err := runGuarded(t, context.Background(), p, sub)
			runtime.ReadMemStats(&after)
			require.Nil(t, got)
			requireLimit(t, err, "assertion:grow", tt.limit)
			// Generous: the limits allow MemoryLimit of produced values; unbounded, these
			// cases allocate gigabytes or never finish.
			allocated := after.TotalAlloc - before.TotalAlloc
			require.Less(t, allocated, uint64(2*validate.MemoryLimit), "allocated %d MiB", allocated>>20)
			requireGoroutinesBack(t, baseline)
		})
	}
}

func TestRunEvaluationErrorMessages(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, expr, submission, want string
	}{
		{
			name: "the README's rule on a string", expr: `submission.total > 0`, submission: `{"total": "12"}`,
			want: "no such overload for _>_ with operands string and int at submission.total",
		},
		{
			name: "size of a number", expr: `size(submission.n) > 0`, submission: `{"n": 5}`,
			want: "no such overload for size with operands int at submission.n",
		},
		{
			name: "inside a loop", expr: `submission.items.all(i, i.qty > 0)`, submission: `{"items": [{"qty": 1}, {"qty": "x"}]}`,
			want: "no such overload for _>_ with operands string and int at i.qty",
		},
		{
			name: "missing field", expr: `submission.missing > 1`, submission: `{}`,
			want: "no such key: missing at submission.missing",
		},
		{
			name: "division by zero", expr: `submission.n / 0 == 1`, submission: `{"n": 1}`,
			want: "division by zero at submission.n / 0",
		},
		{
			name: "result not bool", expr: `submission.name`, submission: `{"name": "x"}`,
			want: "result is string, want bool",
		},
		{
			name: "null result", expr: `submission.name`, submission: `{"name": null}`,
			want: "result is null_type, want bool",
		},
	}
	for _, tt := range tests {
		for _, severity := range []string{validate.SeverityError, validate.SeverityWarning, validate.SeverityInfo} {
			t.Run(tt.name+"/"+severity, func(t *testing.T) {
				t.Parallel()
				p := mustCompile(t, "", validate.Assertion{Name: "rule", Expr: tt.expr, Severity: severity})
				got, err := p.Run(context.Background(), []byte(tt.submission), nil)
				require.NoError(t, err)
				require.Equal(t, []validate.Finding{{
					Step:     "assertion:rule",
					Severity: severity, // the assertion's own severity: see Finding
					Message:  "assertion rule could not be evaluated: " + tt.want,
				}}, got)
				require.Equal(t, severity == validate.SeverityError, validate.Failed(got))
			})
		}
	}
}

// readmeSchema and readmeAssertions are the README's example workflow.
const readmeSchema = `{"type": "object", "required": ["customer", "total"],
	"properties": {"customer": {"type": "string", "minLength": 1}, "total": {"type": "number"}}}`

var readmeAssertions = []validate.Assertion{
	{Name: "positive_total", Expr: "submission.total > 0", Severity: "error", Message: "total must be positive"},
	{Name: "large_total", Expr: "submission.total < 10000", Severity: "warning", Message: "total is unusually large"},
}

func TestRunReadmeWorkflow(t *testing.T) {
	t.Parallel()
	p := mustCompile(t, readmeSchema, readmeAssertions...)
	tests := []struct {
		submission string
		want       []validate.Finding
	}{
		{`{"customer": "Ada", "total": 12.5}`, []validate.Finding{}},
		{`{"customer": "Ada", "total": 12000}`, []validate.Finding{{Step: "assertion:large_total", Severity: "warning", Message: "total is unusually large"}}},
		{`{"customer": "Ada", "total": -1}`, []validate.Finding{{Step: "assertion:positive_total", Severity: "error", Message: "total must be positive"}}},
		{`{"customer": "", "total": "12"}`, []validate.Finding{
			{Step: "schema", Severity: "error", Path: "/customer", Message: "minLength: got 0, want 1"},
			{Step: "schema", Severity: "error", Path: "/total", Message: "got string, want number"},
			{Step: "assertion:positive_total", Severity: "error", Message: "assertion positive_total could not be evaluated: no such overload for _>_ with operands string and int at submission.total"},
			{Step: "assertion:large_total", Severity: "warning", Message: "assertion large_total could not be evaluated: no such overload for _<_ with operands string and int at submission.total"},
		}},
	}
	for _, tt := range tests {
		got, err := p.Run(context.Background(), []byte(tt.submission), nil)
		require.NoError(t, err)
		require.Equal(t, tt.want, got, tt.submission)
	}
}

func TestLimitErrorMessage(t *testing.T) {
	t.Parallel()
	err := error(&validate.LimitError{Step: "assertion:x", Limit: "CostLimit", Msg: "boom"})
	require.ErrorIs(t, err, validate.ErrLimitExceeded)
	require.Equal(t, "validate: limit exceeded: boom", err.Error())
	require.False(t, errors.Is(errors.New("x"), validate.ErrLimitExceeded))
}

// BenchmarkRunReadmeWorkflow is the overhead of Run, limits included, on the README's workflow.
func BenchmarkRunReadmeWorkflow(b *testing.B) {
	p := mustCompile(b, readmeSchema, readmeAssertions...)
	sub := []byte(`{"customer": "Ada Lovelace", "total": 1234.5}`)
	meta := []byte(`{"source": "api"}`)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := p.Run(ctx, sub, meta); err != nil {
			b.Fatal(err)
		}
	}
}

// TestTimeLimitsCountWorkNotLostTime: a worker stopped (SIGSTOP, a paused VM) or starved of
// CPU in the middle of a validation loses wall time without doing work. The time limits
// count the validating thread's CPU time, so a submission well within its budget passes
// exactly as on an idle worker; only a stop longer than StallTimeout stops the validation,
// and then as the worker's fault (ErrWorkerStalled), which the worker retries, never as a
// limit of the submission. The stop is a sleep inside the validation (SetLostTime): it
// loses wall time on purpose, whatever the machine's speed.
func TestTimeLimitsCountWorkNotLostTime(t *testing.T) {
	t.Parallel()
	const limit = time.Second
	sub := []byte("[" + strings.Repeat("1,", 9_999) + "1]")
	compile := func(t *testing.T) *validate.Program {
		p := mustCompile(t, `{"items": {"type": "integer"}}`,
			validate.Assertion{Name: "scan", Expr: "submission.all(x, x >= 0)"})
		validate.SetSchemaTimeout(p, limit)
		validate.SetEvalTimeout(p, limit)
		return p
	}
	want, err := compile(t).Run(context.Background(), sub, nil)
	require.NoError(t, err)

	t.Run("stopped for longer than the limits", func(t *testing.T) {
		t.Parallel()
		p := compile(t)
		stops := 0
		validate.SetLostTime(p, func() {
			stops++
			if stops == 1 || stops == 3 { // once in the schema, once in the assertion
				time.Sleep(limit + limit/2)
			}
		})
		got, err := runGuarded(t, context.Background(), p, sub)
		require.NoError(t, err, "the worker lost the time, the submission used little of its budget")
		require.Equal(t, want, got)
		require.Greater(t, stops, 3, "the validation looked at the clocks after each stop")
	})

	t.Run("stopped past StallTimeout", func(t *testing.T) {
		t.Parallel()
		p := compile(t)
		validate.SetStallTimeout(p, limit)
		validate.SetLostTime(p, func() { time.Sleep(limit + limit/2) })
		got, err := runGuarded(t, context.Background(), p, sub)
		require.Nil(t, got)
		require.ErrorIs(t, err, validate.ErrWorkerStalled)
		require.NotErrorIs(t, err, validate.ErrLimitExceeded, "the worker's fault, not the submission's")
	})
}

// TestTimeLimitsSurviveCPUStarvation: beside busy goroutines that take most of the CPU,
// a validation takes many times its own work in wall time. Its time limit, set from
// what an unloaded run of the same validation took, counts its work only: none of the
// starved runs ends past a limit. (Not parallel: it sets GOMAXPROCS to 1, so that the
// busy goroutines starve the validation on any machine, and puts it back.)
func TestTimeLimitsSurviveCPUStarvation(t *testing.T) {
	p := mustCompile(t, "", validate.Assertion{Name: "scan", Expr: "submission.all(x, x >= 0)"})
	sub := []byte("[" + strings.Repeat("1,", 19_999) + "1]")
	// An upper bound on the validation's work: the fastest of a few wall times.
	fastest := time.Duration(1<<63 - 1)
	for range 3 {
		start := time.Now()
		_, err := p.Run(context.Background(), sub, nil)
		require.NoError(t, err)
		fastest = min(fastest, time.Since(start))
	}
	validate.SetEvalTimeout(p, 2*fastest)

	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	const hogs = 15
	var stop atomic.Bool
	var wg sync.WaitGroup
	for range hogs {
		wg.Go(func() {
			for !stop.Load() {
			}
		})
	}
	defer wg.Wait()
	defer stop.Store(true)

	const runs = 5
	overLimit := 0
	var slowest time.Duration
	for range runs {
		start := time.Now()
		_, err := p.Run(context.Background(), sub, nil)
		slowest = max(slowest, time.Since(start))
		if errors.Is(err, validate.ErrLimitExceeded) {
			overLimit++
		} else {
			require.NoError(t, err)
		}
	}
	t.Logf("limit %v (twice the fastest unloaded run); slowest starved run %v", 2*fastest, slowest)
	require.Zero(t, overLimit, "of %d starved runs, %d ended past the time limit, though their work is within it", runs, overLimit)
}
