package canonjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// fuzzSeeds start both fuzz tests: the edges of each rule.
var fuzzSeeds = []string{
	"",
	" \n",
	`{"b":1,"a":[true,false,null],"c":{"y":"z","x":{}}}`,
	`[1,1.0,10e-1,0.1e1,-0,1E+2,5e-1,1e400,-25e-401,12345678901234567890]`,
	`{"\u00e9":"caf\u00e9","é":1}`,
	`{"\ufb33":1,"\ud83d\ude00":2,"\u20ac":3,"\r":4}`,
	`"\u0000\b\f\n\r\t\"\\\/\u003c\u2028"`,
	`{"a":1,"a":2}`,
	`{"a":1} x`,
	`"\ud83d"`,
	"\"\xff\"",
	`1e9223372036854775807`,
	`0.000001`,
	`1e21`,
	strings.Repeat("[", 20) + strings.Repeat("]", 20),
}

// More seeds live in testdata/fuzz/FuzzCanonicalize, including every crasher
// the fuzzer has found.
func FuzzCanonicalize(f *testing.F) {
	for _, seed := range fuzzSeeds {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		out, err := Canonicalize(in)
		var ne *NumberError
		if errors.As(err, &ne) {
			require.Nil(t, out)
			// The first problem is reported: the body may be invalid later on.
			require.Greater(t, ne.Length, int64(MaxNumberLength))
			return
		}
		if err != nil {
			require.ErrorIs(t, err, ErrInvalidJSON)
			require.Nil(t, out)
			// encoding/json accepts a superset of what Canonicalize does;
			// the difference must be one of the documented rejections.
			if json.Valid(in) && utf8.Valid(in) {
				msg := err.Error()
				require.True(t,
					strings.Contains(msg, "duplicate object key") ||
						strings.Contains(msg, "lone surrogate") ||
						strings.Contains(msg, "nesting deeper") ||
						strings.Contains(msg, "exponent out of range"),
					"valid JSON rejected: %v", err)
			}
			return
		}
		if out == nil {
			require.Empty(t, bytes.Trim(in, " \t\r\n"), "nil output for a body that is not empty")
			return
		}
		require.True(t, json.Valid(in), "invalid JSON accepted")
		require.True(t, json.Valid(out), "output is not valid JSON: %q", out)

		again, err := Canonicalize(out)
		require.NoError(t, err)
		require.Equal(t, string(out), string(again), "not idempotent")

		inValue := decodeUseNumber(t, in)
		outValue := decodeUseNumber(t, out)
		requireSameValue(t, inValue, outValue, "$")

		// The same value written with keys in reverse order, indentation,
		// encoding/json's HTML escaping and another number form
		// canonicalizes the same.
		var other bytes.Buffer
		writeShuffled(t, &other, inValue, "")
		reordered, err := Canonicalize(other.Bytes())
		require.NoError(t, err, "%s", other.Bytes())
		require.Equal(t, string(out), string(reordered), "rewritten as %s", other.Bytes())
	})
}

func decodeUseNumber(t *testing.T, data []byte) any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	require.NoError(t, dec.Decode(&v))
	_, err := dec.Token()
	require.ErrorIs(t, err, io.EOF, "data after the value")
	return v
}

// requireSameValue compares two decoded documents, numbers by value.
func requireSameValue(t *testing.T, a, b any, path string) {
	t.Helper()
	switch a := a.(type) {
	case map[string]any:
		bm, ok := b.(map[string]any)
		require.True(t, ok, "%s: object became %T", path, b)
		require.Len(t, bm, len(a), "%s: member count", path)
		for k, av := range a {
			bv, ok := bm[k]
			require.True(t, ok, "%s: key %q lost", path, k)
			requireSameValue(t, av, bv, path+"."+k)
		}
	case []any:
		bs, ok := b.([]any)
		require.True(t, ok, "%s: array became %T", path, b)
		require.Len(t, bs, len(a), "%s: element count", path)
		for i := range a {
			requireSameValue(t, a[i], bs[i], fmt.Sprintf("%s[%d]", path, i))
		}
	case json.Number:
		bn, ok := b.(json.Number)
		require.True(t, ok, "%s: number became %T", path, b)
		require.Equal(t, numberKey(t, string(a)), numberKey(t, string(bn)), "%s: %s != %s", path, a, bn)
		if ra, rb, ok := smallRats(string(a), string(bn)); ok {
			require.Zero(t, ra.Cmp(rb), "%s: %s != %s", path, a, bn)
		}
	default: // string, bool, nil
		require.Equal(t, a, b, "%s", path)
	}
}

// numberKey normalises a JSON number literal to sign, significant digits and
// exponent, with an arbitrary-precision exponent. It is written
// independently of parseNumber, so that the two check each other.
func numberKey(t *testing.T, lit string) string {
	t.Helper()
	sign := ""
	if strings.HasPrefix(lit, "-") {
		sign, lit = "-", lit[1:]
	}
	mant, expText, hasExp := strings.Cut(strings.ToLower(lit), "e")
	exp := new(big.Int)
	if hasExp {
		_, ok := exp.SetString(strings.TrimPrefix(expText, "+"), 10)
		require.True(t, ok, "exponent %q", expText)
	}
	intPart, frac, _ := strings.Cut(mant, ".")
	exp.Sub(exp, big.NewInt(int64(len(frac))))
	digits := strings.TrimLeft(intPart+frac, "0")
	if digits == "" {
		return "0"
	}
	trimmed := strings.TrimRight(digits, "0")
	exp.Add(exp, big.NewInt(int64(len(digits)-len(trimmed))))
	return sign + trimmed + "e" + exp.String()
}

// smallRats parses both literals as exact rationals when their exponents are
// small enough for that to be cheap.
func smallRats(a, b string) (*big.Rat, *big.Rat, bool) {
	for _, lit := range []string{a, b} {
		if i := strings.IndexAny(lit, "eE"); i >= 0 && len(lit)-i > 5 {
			return nil, nil, false
		}
	}
	ra, okA := new(big.Rat).SetString(a)
	rb, okB := new(big.Rat).SetString(b)
	return ra, rb, okA && okB
}

// writeShuffled writes a decoded document back as JSON, differently from
// the canonical form in every way that must not matter.
func writeShuffled(t *testing.T, w *bytes.Buffer, v any, indent string) {
	t.Helper()
	switch v := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		slices.Reverse(keys)
		w.WriteString("{")
		for i, k := range keys {
			if i > 0 {
				w.WriteString(",")
			}
			w.WriteString("\n" + indent + "  ")
			writeShuffled(t, w, k, indent+"  ")
			w.WriteString(" : ")
			writeShuffled(t, w, v[k], indent+"  ")
		}
		w.WriteString("\n" + indent + "}")
	case []any:
		w.WriteString("[ ")
		for i, e := range v {
			if i > 0 {
				w.WriteString(" ,\t")
			}
			writeShuffled(t, w, e, indent)
		}
		w.WriteString(" ]")
	case json.Number:
		s := string(v)
		w.WriteString(s)
		if !strings.ContainsAny(s, ".eE") {
			w.WriteString(".000E-0")
		}
	default:
		// encoding/json escapes <, >, &, U+2028 and U+2029, unlike the
		// canonical form.
		b, err := json.Marshal(v)
		require.NoError(t, err)
		w.Write(b)
	}
}
