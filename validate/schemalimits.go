package validate

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"math/big"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
)

// stepVocabularyURL names the step counter's vocabulary; nothing loads it.
const stepVocabularyURL = "valruns:///vocab/steps"

// stepVocabulary makes every subschema count its work against b. jsonschema v6 has no
// context and no hook before a subschema runs, but it calls the extensions of a subschema
// each time it applies it, after the subschema's own keywords and its children: the counter
// charges that visit, and panics out of the validation past a limit (see schemaFindings).
func stepVocabulary(b *budget) *jsonschema.Vocabulary {
	return &jsonschema.Vocabulary{
		URL: stepVocabularyURL,
		Compile: func(_ *jsonschema.CompilerContext, obj map[string]any) (jsonschema.SchemaExt, error) {
			return newStepCounter(b, obj), nil
		},
	}
}

// stepCounter charges one application of its subschema to one value. The weights come from
// the subschema's keywords, so that the charge covers what the library did during the visit,
// including children that failed early and so never reached their own counter.
//
// It also checks the subschema's enum and const (see takeOverEnums).
type stepCounter struct {
	b *budget
	// base: the visit itself, and its required properties.
	base int64
	// inPlace: subschemas applied to the same value (allOf, anyOf, $ref, if/then/else...),
	// two steps each: the application, and the error it may add to the result (the
	// library keeps every error until the validation ends, so errors are its memory).
	inPlace int64
	// perMember and perItem: per member of an object or item of an array the subschema
	// iterates (properties, patternProperties, additionalProperties, items, contains...).
	perMember, perItem int64
	// scansStrings: the subschema reads a string value in full (pattern, format, lengths).
	scansStrings bool
	// uniqueItems hashes every item of an array, nested values included.
	uniqueItems bool

	// enum and constant, when set, are checked here rather than by the library.
	enum     *jsonschema.Enum
	enumKeys map[string]bool
	constant *any
	constKey string
}

func newStepCounter(b *budget, obj map[string]any) *stepCounter {
	has := func(k string) int64 {
		if _, ok := obj[k]; ok {
			return 1
		}
		return 0
	}
	count := func(k string) int64 {
		switch v := obj[k].(type) {
		case []any:
			return int64(len(v))
		case map[string]any:
			return int64(len(v))
		}
		return 0
	}
	s := &stepCounter{b: b}
	s.base = 1 + count("required") + count("dependentRequired")
	s.inPlace = 2 * (count("allOf") + count("anyOf") + count("oneOf") + count("dependentSchemas") + count("dependencies") +
		has("not") + has("if") + has("then") + has("else") + has("$ref") + has("$dynamicRef") + has("$recursiveRef"))
	s.perMember = 1 + count("patternProperties") + has("properties") + has("additionalProperties") +
		has("propertyNames") + has("unevaluatedProperties")
	s.perItem = 1 + has("items") + has("prefixItems") + has("additionalItems") + has("contains") + has("unevaluatedItems")
	s.scansStrings = has("pattern")+has("format")+has("minLength")+has("maxLength")+has("contentEncoding")+has("contentMediaType") > 0
	s.uniqueItems = obj["uniqueItems"] == true
	return s
}

// Validate implements jsonschema.SchemaExt: it counts, then checks enum and const.
func (s *stepCounter) Validate(ctx *jsonschema.ValidatorContext, v any) {
	n := s.base + s.inPlace
	switch v := v.(type) {
	case map[string]any:
		n += int64(len(v)) * s.perMember
	case []any:
		n += int64(len(v)) * s.perItem
		if s.uniqueItems {
			n += jsonNodes(v, s.b.maxSteps-s.b.steps)
		}
	case string:
		if s.scansStrings {
			n += int64(len(v)) / 64
		}
	}
	s.b.charge(n)
	if s.enum == nil && s.constant == nil {
		return
	}
	key, nodes := jsonKey(v, s.b.maxSteps-s.b.steps)
	s.b.charge(nodes)
	if s.constant != nil && key != s.constKey {
		ctx.AddError(&kind.Const{Got: v, Want: *s.constant})
	}
	if s.enum != nil && !s.enumKeys[key] {
		ctx.AddError(&kind.Enum{Got: v, Want: s.enum.Values})
	}
}

// takeOverEnums moves enum and const from the library to the step counters. The library
// compares a value with every enum value in turn, numbers as big.Rat parsed anew for each
// comparison (an enum of 250 numbers on 50,000 items: 10 s), before any hook can run; a
// step counter looks the value up in a set, in time proportional to the value. The findings
// say the same; a value that fails enum or const now also gets the findings of the
// subschema's other keywords, which the library skipped.
//
// Draft-07 and older ignore the keywords beside a $ref, and so do the library's extensions:
// there the library keeps its own.
func takeOverEnums(root *jsonschema.Schema) {
	seen := map[*jsonschema.Schema]bool{}
	var walk func(s *jsonschema.Schema)
	walk = func(s *jsonschema.Schema) {
		if s == nil || seen[s] {
			return
		}
		seen[s] = true
		for _, c := range children(s) {
			walk(c)
		}
		if (s.Enum == nil && s.Const == nil) || (s.Ref != nil && s.DraftVersion < 2019) {
			return
		}
		var counter *stepCounter
		for _, e := range s.Extensions {
			if c, ok := e.(*stepCounter); ok {
				counter = c
			}
		}
		if counter == nil {
			return
		}
		if s.Enum != nil {
			counter.enum, counter.enumKeys = s.Enum, make(map[string]bool, len(s.Enum.Values))
			for _, v := range s.Enum.Values {
				key, _ := jsonKey(v, -1)
				counter.enumKeys[key] = true
			}
			s.Enum = nil
		}
		if s.Const != nil {
			counter.constant = s.Const
			counter.constKey, _ = jsonKey(*s.Const, -1)
			s.Const = nil
		}
	}
	walk(root)
}

// jsonKey writes a decoded JSON value in a canonical form: two values have the same key
// exactly when the library's equality holds (numbers by value, 1 = 1.0 = 1e0; objects
// whatever their key order). It also returns the number of values in v, and stops once past
// limit (-1: no limit) with an incomplete key.
func jsonKey(v any, limit int64) (string, int64) {
	var sb strings.Builder
	var nodes int64
	var write func(v any)
	write = func(v any) {
		if nodes++; limit >= 0 && nodes > limit {
			return
		}
		switch v := v.(type) {
		case nil:
			sb.WriteString("null")
		case bool:
			sb.WriteString(strconv.FormatBool(v))
		case string:
			sb.WriteString(strconv.Quote(v))
		case json.Number:
			sb.WriteString(numberKey(string(v)))
		case []any:
			sb.WriteByte('[')
			for _, e := range v {
				write(e)
				sb.WriteByte(',')
			}
			sb.WriteByte(']')
		case map[string]any:
			sb.WriteByte('{')
			for _, k := range slices.Sorted(maps.Keys(v)) {
				sb.WriteString(strconv.Quote(k))
				sb.WriteByte(':')
				write(v[k])
				sb.WriteByte(',')
			}
			sb.WriteByte('}')
		default:
			// Another Go number type: the library compares it by value too.
			sb.WriteString(numberKey(fmt.Sprint(v)))
		}
	}
	write(v)
	return sb.String(), nodes
}

// plainInt matches the integers whose text is already canonical.
var plainInt = regexp.MustCompile(`^-?[1-9][0-9]*$|^0$`)

// numberKey is a number's value as an exact fraction ("1/2", "100"); text that is not a
// number keys as itself.
func numberKey(s string) string {
	if plainInt.MatchString(s) {
		return s
	}
	if r, ok := new(big.Rat).SetString(s); ok {
		return r.RatString()
	}
	return "?" + s
}

// countedRegexpEngine compiles with Go's regexp, like the library's default, and counts every
// match against b.
func countedRegexpEngine(b *budget) jsonschema.RegexpEngine {
	return func(s string) (jsonschema.Regexp, error) {
		re, err := regexp.Compile(s)
		if err != nil {
			return nil, err
		}
		return countedRegexp{re: re, b: b}, nil
	}
}

type countedRegexp struct {
	re *regexp.Regexp
	b  *budget
}

func (r countedRegexp) MatchString(s string) bool {
	r.b.charge(1 + int64(len(s))/64)
	return r.re.MatchString(s)
}

func (r countedRegexp) String() string { return r.re.String() }

// jsonNodes counts the values in a decoded JSON tree, stopping once past limit.
func jsonNodes(v any, limit int64) int64 {
	var n int64
	var walk func(v any)
	walk = func(v any) {
		n++
		if n > limit {
			return
		}
		switch v := v.(type) {
		case map[string]any:
			for _, e := range v {
				if walk(e); n > limit {
					return
				}
			}
		case []any:
			for _, e := range v {
				if walk(e); n > limit {
					return
				}
			}
		}
	}
	walk(v)
	return n
}

// checkSchemaSize returns a message when the schema expands past MaxSchemaNodes. It follows
// every subschema and reference once per path that reaches it, as validation does, but
// remembers each subschema's total, so counting is linear in the compiled schema; the count
// stops at the limit. A reference to a subschema that is being expanded (recursion) counts
// one: validation recurses only as deep as the submission nests, which MaxSchemaSteps bounds.
// Children are visited in a fixed order, so the result is deterministic.
func checkSchemaSize(root *jsonschema.Schema) string {
	const limit = MaxSchemaNodes
	done := map[*jsonschema.Schema]int64{}
	onPath := map[*jsonschema.Schema]bool{}
	var size func(s *jsonschema.Schema) int64
	size = func(s *jsonschema.Schema) int64 {
		if s == nil {
			return 0
		}
		if n, ok := done[s]; ok {
			return n
		}
		if onPath[s] {
			return 1
		}
		onPath[s] = true
		n := 1 + enumLen(s)
		for _, c := range children(s) {
			if n += size(c); n > limit {
				n = limit + 1
				break
			}
		}
		delete(onPath, s)
		done[s] = n
		return n
	}
	if n := size(root); n > limit {
		return fmt.Sprintf("expands to more than %d subschemas and enum values when every $ref is followed "+
			"(MaxSchemaNodes): validating a value would visit each of them; a definition applied twice at each of "+
			"n nested levels (allOf, anyOf, oneOf, properties) is 2^n subschemas, so apply shared definitions "+
			"once, or flatten the nesting", limit)
	}
	return ""
}

// enumLen is the number of values in s's enum, whether the library or the step counter
// checks it.
func enumLen(s *jsonschema.Schema) int64 {
	if s.Enum != nil {
		return int64(len(s.Enum.Values))
	}
	for _, e := range s.Extensions {
		if c, ok := e.(*stepCounter); ok && c.enum != nil {
			return int64(len(c.enum.Values))
		}
	}
	return 0
}

// children lists the subschemas s applies or references, in a fixed order.
func children(s *jsonschema.Schema) []*jsonschema.Schema {
	var out []*jsonschema.Schema
	add := func(cs ...*jsonschema.Schema) {
		for _, c := range cs {
			if c != nil {
				out = append(out, c)
			}
		}
	}
	addAny := func(v any) {
		switch v := v.(type) {
		case *jsonschema.Schema:
			add(v)
		case []*jsonschema.Schema:
			add(v...)
		}
	}
	add(s.Ref, s.RecursiveRef, s.Not, s.If, s.Then, s.Else, s.PropertyNames, s.UnevaluatedProperties,
		s.Contains, s.Items2020, s.UnevaluatedItems, s.ContentSchema)
	if s.DynamicRef != nil {
		add(s.DynamicRef.Ref)
	}
	add(s.AllOf...)
	add(s.AnyOf...)
	add(s.OneOf...)
	add(s.PrefixItems...)
	addAny(s.Items)
	addAny(s.AdditionalItems)
	addAny(s.AdditionalProperties)
	for _, k := range slices.Sorted(maps.Keys(s.Properties)) {
		add(s.Properties[k])
	}
	for _, k := range slices.Sorted(maps.Keys(s.DependentSchemas)) {
		add(s.DependentSchemas[k])
	}
	for _, k := range slices.Sorted(maps.Keys(s.Dependencies)) {
		addAny(s.Dependencies[k])
	}
	patterns := slices.SortedFunc(maps.Keys(s.PatternProperties), func(a, b jsonschema.Regexp) int {
		return cmp.Compare(a.String(), b.String())
	})
	for _, re := range patterns {
		add(s.PatternProperties[re])
	}
	return out
}
