package validate

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strings"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

// schemaURL names the workflow's schema inside the compiler. The scheme is made up so that
// a relative $ref ("other.json") resolves to a URL that no loader serves, rather than to a
// file next to the worker's working directory.
const schemaURL = "valruns:///schema.json"

// printer renders the library's messages; message.Printer keeps no state between calls.
// en-US-POSIX rather than English: English groups digits ("got 1,000"), which reads as two
// values next to JSON.
var printer = message.NewPrinter(language.MustParse("en-US-POSIX"))

// errRemoteRef is what the loader answers for every URL: a workflow's schema must be
// self-contained, and a validation must never touch the network or the file system.
var errRemoteRef = errors.New("remote references are not allowed (no network or file access); put the definition in $defs and use \"#/$defs/...\"")

type refuseLoader struct{}

func (refuseLoader) Load(string) (any, error) { return nil, errRemoteRef }

// compileSchema compiles a schema (nil for none) with a stepCounter in every subschema that
// charges b, the budget of the runner that will use the compiled copy.
func compileSchema(raw json.RawMessage, b *budget) (*jsonschema.Schema, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, nil
	}
	fail := func(format string, args ...any) error {
		return &CompileError{Field: "schema", Msg: fmt.Sprintf(format, args...)}
	}
	doc, err := decodeJSON(raw)
	if err != nil {
		return nil, fail("invalid JSON: %v", err)
	}
	c := jsonschema.NewCompiler()
	// The library's default follows its newest draft; pin ours so stored schemas keep meaning
	// the same thing across upgrades. $schema still selects another draft.
	c.DefaultDraft(jsonschema.Draft2020)
	// 2020-12 makes "format" an annotation only; people who write "format": "email" in a
	// workflow mean it to be checked.
	c.AssertFormat()
	// The metaschemas of the known drafts are embedded in the library and load without this.
	c.UseLoader(refuseLoader{})
	// The step counter is a vocabulary without keywords: its Compile runs for every schema
	// object, so its extension runs at every subschema the validation applies. Drafts from
	// 2019-09 on enable a custom vocabulary only with AssertVocabs (older ones always do); the
	// vocabulary has no metaschema, so this changes nothing else.
	c.RegisterVocabulary(stepVocabulary(b))
	c.AssertVocabs()
	// Go's regexp, as the library's default, with every match counted: a patternProperties
	// of many patterns runs them all on every member of an object, inside one subschema.
	c.UseRegexpEngine(countedRegexpEngine(b))
	if err := c.AddResource(schemaURL, doc); err != nil {
		return nil, fail("%v", err)
	}
	sch, err := c.Compile(schemaURL)
	if err != nil {
		return nil, fail("%s", schemaCompileMessage(err))
	}
	takeOverEnums(sch)
	return sch, nil
}

// schemaCompileMessage turns the compiler's error into one line a workflow author can act on.
func schemaCompileMessage(err error) string {
	var loadErr *jsonschema.LoadURLError
	if errors.As(err, &loadErr) && errors.Is(loadErr.Err, errRemoteRef) {
		return fmt.Sprintf("cannot load %q: %v", loadErr.URL, errRemoteRef)
	}
	var metaErr *jsonschema.SchemaValidationError
	if errors.As(err, &metaErr) {
		var verr *jsonschema.ValidationError
		if errors.As(metaErr.Err, &verr) {
			var parts []string
			for _, leaf := range leaves(verr, nil) {
				parts = append(parts, fmt.Sprintf("at %s: %s", quotePointer(leaf.InstanceLocation), kindMessage(leaf.ErrorKind)))
			}
			slices.Sort(parts)
			return "not a valid JSON Schema: " + strings.Join(slices.Compact(parts), "; ")
		}
	}
	return strings.ReplaceAll(err.Error(), schemaURL, "")
}

func quotePointer(tokens []string) string {
	p := jsonPointer(tokens)
	if p == "" {
		return "the root"
	}
	return "'" + p + "'"
}

// schemaFindings validates doc under the runner's budget and returns one finding per leaf
// error, sorted by path then message, without duplicates (two failed branches of an anyOf
// can say the same thing). Past a limit, or when ctx ends, it returns the budget's error.
//
// jsonschema has no cancellation: the step counter in every subschema panics out of the
// library's recursion, and the recover here ends the validation in this goroutine, so
// nothing is left running.
func (r *runner) schemaFindings(doc any, timeout time.Duration) (findings []Finding, err error) {
	r.b.startSchema(timeout)
	defer func() {
		if rec := recover(); rec != nil {
			if _, ok := rec.(abortSignal); !ok {
				panic(rec)
			}
			r.aborted = true
			findings, err = nil, r.b.err
		}
	}()
	verr := r.schema.Validate(doc)
	if verr == nil {
		return nil, nil
	}
	var ve *jsonschema.ValidationError
	if !errors.As(verr, &ve) {
		// Validate documents only *ValidationError; keep any other failure visible all the same.
		return []Finding{{Step: StepSchema, Severity: SeverityError, Message: verr.Error()}}, nil
	}
	return leafFindings(leaves(ve, nil)), nil
}

// leafFindings turns the leaf errors into findings sorted by path then message, without
// duplicates, at most MaxSchemaFindings of them and then one that says how many errors were
// left out. Messages are formatted only for the errors listed.
func leafFindings(ls []*jsonschema.ValidationError) []Finding {
	type leaf struct {
		path string
		err  *jsonschema.ValidationError
	}
	sorted := make([]leaf, len(ls))
	for i, l := range ls {
		sorted[i] = leaf{jsonPointer(l.InstanceLocation), l}
	}
	slices.SortStableFunc(sorted, func(a, b leaf) int { return cmp.Compare(a.path, b.path) })
	findings := []Finding{}
	listed := 0 // errors that the findings so far stand for, duplicates included
	for i := 0; i < len(sorted) && len(findings) < MaxSchemaFindings; {
		j := i + 1
		for j < len(sorted) && sorted[j].path == sorted[i].path {
			j++
		}
		messages := make([]string, 0, j-i)
		for _, l := range sorted[i:j] {
			messages = append(messages, kindMessage(l.err.ErrorKind))
		}
		slices.Sort(messages)
		for k := 0; k < len(messages) && len(findings) < MaxSchemaFindings; {
			n := 1
			for k+n < len(messages) && messages[k+n] == messages[k] {
				n++
			}
			// Two failed branches of an anyOf can say the same thing about the same value.
			findings = append(findings, Finding{Step: StepSchema, Severity: SeverityError, Path: sorted[i].path, Message: messages[k]})
			listed += n
			k += n
		}
		i = j
	}
	if more := len(sorted) - listed; more > 0 {
		findings = append(findings, Finding{Step: StepSchema, Severity: SeverityError,
			Message: fmt.Sprintf("%d more schema errors are not listed: only the first %d findings in path order are (MaxSchemaFindings)",
				more, MaxSchemaFindings)})
	}
	return findings
}

// kindMessage is the library's message, except for the numeric keywords, whose messages
// round the exact values to float64 ("maximum: got 0.1, want 0.1") and print large ones in
// scientific notation.
func kindMessage(k jsonschema.ErrorKind) string {
	var name string
	var got, want *big.Rat
	switch k := k.(type) {
	case *kind.Minimum:
		name, got, want = "minimum", k.Got, k.Want
	case *kind.Maximum:
		name, got, want = "maximum", k.Got, k.Want
	case *kind.ExclusiveMinimum:
		name, got, want = "exclusiveMinimum", k.Got, k.Want
	case *kind.ExclusiveMaximum:
		name, got, want = "exclusiveMaximum", k.Got, k.Want
	case *kind.MultipleOf:
		name, got, want = "multipleOf", k.Got, k.Want
	default:
		return k.LocalizedString(printer)
	}
	return fmt.Sprintf("%s: got %s, want %s", name, ratString(got), ratString(want))
}

// ratString prints a number that came from JSON as the shortest decimal that identifies it
// at 256 bits, which is exact for any number a person writes; like JavaScript, in plain
// notation from 1e-6 to 1e21 and in scientific notation outside.
func ratString(r *big.Rat) string {
	f := new(big.Float).SetPrec(256).SetRat(r)
	abs := new(big.Float).Abs(f)
	if abs.Sign() == 0 || (abs.Cmp(big.NewFloat(1e-6)) >= 0 && abs.Cmp(big.NewFloat(1e21)) < 0) {
		return f.Text('f', -1)
	}
	return f.Text('g', -1)
}

// leaves collects the errors that have no causes: the ones that say what is wrong, where the
// inner nodes only say that a group, a $ref or an allOf failed.
func leaves(e *jsonschema.ValidationError, acc []*jsonschema.ValidationError) []*jsonschema.ValidationError {
	if len(e.Causes) == 0 {
		return append(acc, e)
	}
	for _, c := range e.Causes {
		acc = leaves(c, acc)
	}
	return acc
}

// jsonPointer builds an RFC 6901 pointer from instance location tokens; "" is the root.
func jsonPointer(tokens []string) string {
	var sb strings.Builder
	for _, t := range tokens {
		sb.WriteByte('/')
		sb.WriteString(strings.ReplaceAll(strings.ReplaceAll(t, "~", "~0"), "/", "~1"))
	}
	return sb.String()
}

// decodeJSON decodes exactly one JSON value, keeping numbers as json.Number so big integers
// and decimals are compared exactly by the schema.
func decodeJSON(b []byte) (any, error) {
	return jsonschema.UnmarshalJSON(bytes.NewReader(b))
}

// decodeMetadata accepts nil, empty or null as {}; anything else must be a JSON object.
func decodeMetadata(b []byte) (map[string]any, error) {
	b = bytes.TrimSpace(b)
	if len(b) == 0 || bytes.Equal(b, []byte("null")) {
		return map[string]any{}, nil
	}
	v, err := decodeJSON(b)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidMetadata, err)
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%w: got %s", ErrInvalidMetadata, jsonKind(v))
	}
	return m, nil
}

func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case json.Number:
		return "number"
	case string:
		return "string"
	case []any:
		return "array"
	default:
		return "object"
	}
}
