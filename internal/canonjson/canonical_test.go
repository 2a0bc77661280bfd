package canonjson

import (
	"encoding/json"
	"fmt"
	"math"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCanonicalize(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name string
		in   string
		want string
	}{
		{name: "scalar true", in: "true", want: "true"},
		{name: "scalar false", in: " false ", want: "false"},
		{name: "scalar null", in: "\n\tnull\r\n", want: "null"},
		{name: "empty object", in: "{ }", want: "{}"},
		{name: "empty array", in: "[ ]", want: "[]"},
		{name: "keys sorted", in: `{"b":1,"a":2,"c":3}`, want: `{"a":2,"b":1,"c":3}`},
		{name: "whitespace removed", in: " {\n  \"a\" : [ 1 , 2 ] ,\t\"b\":{ } }\n", want: `{"a":[1,2],"b":{}}`},
		{name: "nested objects sorted", in: `{"z":{"y":1,"x":[{"d":1,"c":2}]},"a":null}`, want: `{"a":null,"z":{"x":[{"c":2,"d":1}],"y":1}}`},
		{name: "array order kept", in: `[3,1,2]`, want: `[3,1,2]`},
		{name: "scalars around containers", in: ` [ 1.0 , "a\u0041\n", [ ], {"b":[2e0,true],"a":null}, false,[[3]], 1E2, "x" ,{} ] `,
			want: `[1,"aA\n",[],{"a":null,"b":[2,true]},false,[[3]],100,"x",{}]`},
		{name: "key order by byte for ASCII", in: `{"b":1,"B":2,"a":3,"_":4,"1":5}`, want: `{"1":5,"B":2,"_":4,"a":3,"b":1}`},
		{name: "prefix key first", in: `{"ab":1,"a":2}`, want: `{"a":2,"ab":1}`},
		// RFC 8785 section 3.2.3: UTF-16 order puts U+1F600 (surrogates
		// D83D DE00) before U+FB33, though UTF-8 byte order would not.
		{name: "keys by UTF-16 code units", in: `{"\ufb33":1,"😀":2,"é":3,"z":4}`, want: "{\"z\":4,\"\u00e9\":3,\"\U0001F600\":2,\"\uFB33\":1}"},
		{name: "RFC 8785 sort example", in: `{"\u20ac":"Euro Sign","\r":"Carriage Return","\ufb33":"Hebrew Letter Dalet With Dagesh","1":"One","\ud83d\ude00":"Emoji: Grinning Face","\u0080":"Control","\u00f6":"Latin Small Letter O With Diaeresis"}`,
			want: "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u0080\":\"Control\",\"\u00f6\":\"Latin Small Letter O With Diaeresis\",\"\u20ac\":\"Euro Sign\",\"\U0001F600\":\"Emoji: Grinning Face\",\"\uFB33\":\"Hebrew Letter Dalet With Dagesh\"}"},
		{name: "supplementary keys among themselves", in: `{"\ud83d\ude01":1,"\ud83d\ude00":2,"\ud800\udc00":3}`, want: "{\"\U00010000\":3,\"\U0001F600\":2,\"\U0001F601\":1}"},

		// Strings: one encoding per string.
		{name: "unicode escape decoded", in: `"\u00e9"`, want: `"é"`},
		{name: "raw non-ASCII kept", in: `"é"`, want: `"é"`},
		{name: "surrogate pair decoded", in: `"\ud83d\ude00"`, want: `"😀"`},
		{name: "upper-case hex escape", in: `"\u00E9\u004A"`, want: `"éJ"`},
		{name: "slash unescaped", in: `"a\/b"`, want: `"a/b"`},
		{name: "quote and backslash kept escaped", in: `"a\"b\\c"`, want: `"a\"b\\c"`},
		{name: "short escapes", in: `"\b\f\n\r\t"`, want: `"\b\f\n\r\t"`},
		{name: "short escapes from \\u", in: `"\u0008\u000c\u000a\u000d\u0009"`, want: `"\b\f\n\r\t"`},
		{name: "other controls as lower-case \\u00xx", in: `"\u0000\u001F\u0001"`, want: `"\u0000\u001f\u0001"`},
		{name: "HTML characters kept", in: `"\u003c/script\u003e \u0026"`, want: `"</script> &"`},
		{name: "DEL kept raw", in: `"\u007f"`, want: "\"\x7f\""},
		{name: "line separators kept raw", in: `"\u2028\u2029"`, want: "\"\u2028\u2029\""},
		{name: "replacement character is valid", in: "\"\uFFFD\"", want: "\"\uFFFD\""},
		{name: "escaped key equals raw key", in: `{"\u0061":1}`, want: `{"a":1}`},

		// Numbers by value, never rounded.
		{name: "one", in: "1", want: "1"},
		{name: "one point zero", in: "1.0", want: "1"},
		{name: "one point zero zero", in: "1.00", want: "1"},
		{name: "ten e minus one", in: "10e-1", want: "1"},
		{name: "point one e one", in: "0.1e1", want: "1"},
		{name: "hundred", in: "100", want: "100"},
		{name: "one e two", in: "1e2", want: "100"},
		{name: "one E plus two", in: "1E+2", want: "100"},
		{name: "half", in: "0.5", want: "0.5"},
		{name: "five e minus one", in: "5e-1", want: "0.5"},
		{name: "zero", in: "0", want: "0"},
		{name: "minus zero", in: "-0", want: "0"},
		{name: "minus zero point zero", in: "-0.0", want: "0"},
		{name: "zero with exponent", in: "0e10", want: "0"},
		{name: "minus zero with exponent", in: "-0.000E-5", want: "0"},
		{name: "negative", in: "-1.50", want: "-1.5"},
		{name: "negative integer", in: "-120e-1", want: "-12"},
		{name: "decimal inside", in: "123.4560", want: "123.456"},
		{name: "big integer exact", in: "12345678901234567890", want: "12345678901234567890"},
		{name: "big integer neighbour", in: "12345678901234567891", want: "12345678901234567891"},
		{name: "long decimal exact", in: "0.10000000000000000000000000001", want: "0.10000000000000000000000000001"},
		{name: "float64 would round", in: "9007199254740993", want: "9007199254740993"},
		{name: "largest plain", in: "1e20", want: "100000000000000000000"},
		{name: "largest plain with digits", in: "1.23e20", want: "123000000000000000000"},
		{name: "smallest exponent form", in: "1e21", want: "1e+21"},
		{name: "exponent form with digits", in: "12.5e20", want: "1.25e+21"},
		{name: "many digits exponent form", in: "1234567890123456789012345", want: "1.234567890123456789012345e+24"},
		{name: "smallest plain fraction", in: "0.000001", want: "0.000001"},
		{name: "small fraction with digits", in: "0.0000012345", want: "0.0000012345"},
		{name: "negative exponent form", in: "0.0000001", want: "1e-7"},
		{name: "negative exponent form with digits", in: "-0.00000015", want: "-1.5e-7"},
		{name: "largest accepted integer", in: "1e255", want: "1e+255"},
		{name: "smallest accepted fraction", in: "-25e-254", want: "-2.5e-253"},
		{name: "leading zeros in exponent", in: "1e0000000000000000000000002", want: "100"},
		{name: "zero with out-of-range value exponent", in: "0.0e9223372036854775807", want: "0"},
		{name: "numbers in containers", in: `{"a":[1.0,2e0,-0],"b":1E3}`, want: `{"a":[1,2,0],"b":1000}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := Canonicalize([]byte(tt.in))
			require.NoError(t, err)
			require.Equal(t, tt.want, string(got))
			require.True(t, json.Valid(got), "output is not valid JSON: %s", got)
			again, err := Canonicalize(got)
			require.NoError(t, err)
			require.Equal(t, string(got), string(again), "not idempotent")
		})
	}
}

func TestCanonicalizeEqualBodies(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name string
		a, b string
	}{
		{name: "key order", a: `{"a":1,"b":2}`, b: `{"b":2,"a":1}`},
		{name: "whitespace", a: `{"a":[1,2]}`, b: "{\n  \"a\": [\n    1,\n    2\n  ]\n}\n"},
		{name: "nested key order", a: `{"s":{"x":1,"y":{"p":true,"q":null}},"m":{}}`, b: `{"m":{},"s":{"y":{"q":null,"p":true},"x":1}}`},
		{name: "string escapes", a: `{"name":"caf\u00e9 \"x\""}`, b: `{"name":"café \"x\""}`},
		{name: "escaped keys", a: `{"\u0062":1,"a":2}`, b: `{"a":2,"b":1}`},
		{name: "numbers by value", a: `{"n":[1,100,0.5,0]}`, b: `{"n":[1.0,1e2,5e-1,-0]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			a, err := Canonicalize([]byte(tt.a))
			require.NoError(t, err)
			b, err := Canonicalize([]byte(tt.b))
			require.NoError(t, err)
			require.Equal(t, string(a), string(b))
		})
	}
}

func TestCanonicalizeDifferentBodies(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name string
		a, b string
	}{
		{name: "big integers", a: "12345678901234567890", b: "12345678901234567891"},
		{name: "decimals beyond float64", a: "0.1000000000000000000001", b: "0.1000000000000000000002"},
		{name: "large exponents", a: "1e200", b: "1e201"},
		{name: "sign", a: "1", b: "-1"},
		{name: "number and string", a: "1", b: `"1"`},
		{name: "array order", a: "[1,2]", b: "[2,1]"},
		{name: "key case", a: `{"a":1}`, b: `{"A":1}`},
		{name: "null and missing", a: `{"a":null}`, b: `{}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			a, err := Canonicalize([]byte(tt.a))
			require.NoError(t, err)
			b, err := Canonicalize([]byte(tt.b))
			require.NoError(t, err)
			require.NotEqual(t, string(a), string(b))
		})
	}
}

func TestCanonicalizeNoBody(t *testing.T) {
	t.Parallel()

	for _, in := range []string{"", " ", "\n", " \t\r\n "} {
		got, err := Canonicalize([]byte(in))
		require.NoError(t, err, "%q", in)
		require.Nil(t, got, "%q", in)
	}
	got, err := Canonicalize(nil)
	require.NoError(t, err)
	require.Nil(t, got)
}

func TestCanonicalizeInvalid(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name string
		in   string
	}{
		{name: "duplicate key", in: `{"a":1,"a":1}`},
		{name: "duplicate key after sorting", in: `{"b":1,"a":2,"b":3}`},
		{name: "duplicate key spelled differently", in: `{"a":1,"\u0061":2}`},
		{name: "duplicate key nested", in: `{"x":[{"k":1,"k":2}]}`},
		{name: "trailing garbage", in: `{"a":1}x`},
		{name: "two values", in: `{} {}`},
		{name: "trailing comma in object", in: `{"a":1,}`},
		{name: "trailing comma in array", in: `[1,]`},
		{name: "missing colon", in: `{"a" 1}`},
		{name: "non-string key", in: `{1:1}`},
		{name: "single quotes", in: `{'a':1}`},
		{name: "unterminated object", in: `{"a":1`},
		{name: "unterminated array", in: `[1,2`},
		{name: "unterminated string", in: `"abc`},
		{name: "unterminated escape", in: `"abc\`},
		{name: "bad escape", in: `"\x41"`},
		{name: "short unicode escape", in: `"\u12"`},
		{name: "bad hex", in: `"\u12g4"`},
		{name: "lone high surrogate", in: `"\ud83d"`},
		{name: "high surrogate then letter", in: `"\ud83dx"`},
		{name: "high surrogate then non-surrogate escape", in: `"\ud83d\u0041"`},
		{name: "lone low surrogate", in: `"\ude00"`},
		{name: "raw control character", in: "\"a\nb\""},
		{name: "raw NUL", in: "\"a\x00b\""},
		{name: "invalid UTF-8", in: "\"a\xffb\""},
		{name: "truncated UTF-8", in: "\"a\xc3\""},
		{name: "UTF-8 encoded surrogate", in: "\"\xed\xa0\x80\""},
		{name: "overlong UTF-8", in: "\"\xc0\xaf\""},
		{name: "invalid UTF-8 in key", in: "{\"\xff\":1}"},
		{name: "byte order mark", in: "\xef\xbb\xbf{}"},
		{name: "bare word", in: `nul`},
		{name: "capitalised literal", in: `True`},
		{name: "leading zero", in: `01`},
		{name: "leading plus", in: `+1`},
		{name: "lone minus", in: `-`},
		{name: "minus without digits", in: `-a`},
		{name: "missing fraction digits", in: `1.`},
		{name: "missing integer digits", in: `.5`},
		{name: "missing exponent digits", in: `1e`},
		{name: "missing exponent digits after sign", in: `1e+`},
		{name: "hex number", in: `0x10`},
		{name: "NaN", in: `NaN`},
		{name: "Infinity", in: `-Infinity`},
		{name: "exponent beyond int64", in: `1e9223372036854775808`},
		{name: "negative exponent beyond int64", in: `1e-9223372036854775809`},
		{name: "exponent with many digits", in: `1e123456789012345678901234567890`},
		{name: "value exponent beyond int64", in: `10e9223372036854775807`},
		{name: "value exponent below int64", in: `0.1e-9223372036854775808`},
		{name: "zero with exponent beyond int64", in: `0e99999999999999999999`},
		{name: "comment", in: `{"a":1 /* c */}`},
		{name: "too deep arrays", in: strings.Repeat("[", MaxDepth+1) + strings.Repeat("]", MaxDepth+1)},
		{name: "too deep objects", in: strings.Repeat(`{"a":`, MaxDepth+1) + "1" + strings.Repeat("}", MaxDepth+1)},
		{name: "deep unterminated", in: strings.Repeat("[", 1<<20)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := Canonicalize([]byte(tt.in))
			require.ErrorIs(t, err, ErrInvalidJSON)
			require.Nil(t, got)
		})
	}
}

func TestCanonicalizeMaxDepth(t *testing.T) {
	t.Parallel()

	arrays := strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth)
	got, err := Canonicalize([]byte(arrays))
	require.NoError(t, err)
	require.Equal(t, arrays, string(got))

	objects := strings.Repeat(`{"a":`, MaxDepth) + "1" + strings.Repeat("}", MaxDepth)
	got, err = Canonicalize([]byte(objects))
	require.NoError(t, err)
	require.Equal(t, objects, string(got))

	mixed := strings.Repeat(`[{"a":`, MaxDepth/2) + "[]" + strings.Repeat("}]", MaxDepth/2)
	_, err = Canonicalize([]byte(mixed))
	require.ErrorIs(t, err, ErrInvalidJSON, "%d levels", MaxDepth+1)
}

func TestCanonicalizeErrorMessage(t *testing.T) {
	t.Parallel()

	_, err := Canonicalize([]byte(`{"a":1,"a":2}`))
	require.ErrorIs(t, err, ErrInvalidJSON)
	require.Contains(t, err.Error(), "duplicate object key")
	require.Contains(t, err.Error(), `"a"`)
}

// benchBody is a ~2 KB request body shaped like a run submission.
var benchBody = func() []byte {
	var b strings.Builder
	b.WriteString(`{"submission": {"invoice": {"number": "INV-2024-00042", "currency": "EUR", "issued_at": "2024-05-01T10:00:00Z", "lines": [`)
	for i := range 12 {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, `{"sku": "SKU-%04d", "description": "Widget n\u00b0%d \"deluxe\"", "quantity": %d, "unit_price": %d.50, "tax_rate": 0.20}`, i, i, i+1, 10*i)
	}
	b.WriteString(`], "customer": {"name": "Müller GmbH", "vat": "DE123456789", "address": {"street": "Hauptstraße 1", "city": "Berlin", "zip": "10115"}}}}, "metadata": {"source": "ci", "commit": "9fceb02d0ae598e95dc970b74767f19372d61af8", "attempt": 1}}`)
	return []byte(b.String())
}()

func BenchmarkCanonicalize(b *testing.B) {
	b.ReportAllocs()
	b.SetBytes(int64(len(benchBody)))
	for b.Loop() {
		if _, err := Canonicalize(benchBody); err != nil {
			b.Fatal(err)
		}
	}
}

// Numbers PostgreSQL cannot store, or that would be stored (and answered)
// far longer than they were sent, are refused with their path: the
// limit is on the plain decimal text, the way numeric and jsonb print them.
func TestCanonicalizeNumberLimits(t *testing.T) {
	tests := []struct {
		name, in string
		path     string // "" : accepted
		length   int64
	}{
		{name: "at the limit, integer", in: "1e255"},
		{name: "at the limit, fraction", in: "1e-254"},
		{name: "over the limit, integer", in: "1e256", path: "the top level", length: 257},
		{name: "over the limit, fraction", in: "[1e-255]", path: "[0]", length: 257},
		{name: "beyond PostgreSQL", in: `{"submission":{"total":1e1000000}}`, path: "submission.total", length: 1000001},
		{name: "beyond PostgreSQL, tiny", in: `{"metadata":{"x":[0,1e-1000000]}}`, path: "metadata.x[1]", length: 1000002},
		{name: "amplifying", in: `[1,[2,1e131071]]`, path: "[1][1]", length: 131072},
		{name: "long literal", in: "1" + strings.Repeat("0", 300), path: "the top level", length: 301},
		{name: "odd key", in: `{"a b":{"c.d":1e999}}`, path: `["a b"]["c.d"]`, length: 1000},
		{name: "largest exponent", in: "1e9223372036854775807", path: "the top level", length: math.MaxInt64},
		{name: "smallest exponent", in: "1e-9223372036854775808", path: "the top level", length: math.MaxInt64},
		{name: "in a schema keyword", in: `{"schema":{"minimum":1e-1000000}}`, path: "schema.minimum", length: 1000002},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Canonicalize([]byte(tt.in))
			if tt.path == "" {
				require.NoError(t, err)
				return
			}
			var ne *NumberError
			require.ErrorAs(t, err, &ne)
			require.Equal(t, tt.path, ne.Path)
			require.Equal(t, tt.length, ne.Length)
			require.Contains(t, err.Error(), tt.path)
		})
	}
}

// CanonicalizeBounded measures a body as it would be stored: every number
// in plain decimal. 9 bytes of "1e250,..." per element stay far under the
// body limit but would grow 25-fold.
func TestCanonicalizeBounded(t *testing.T) {
	body := []byte("[" + strings.TrimSuffix(strings.Repeat("1e250,", 1000), ",") + "]")
	_, err := CanonicalizeBounded(body, 100_000)
	var se *SizeError
	require.ErrorAs(t, err, &se)
	require.EqualValues(t, len(body)+1000*(251-5), se.Size)
	require.EqualValues(t, 100_000, se.Limit)
	_, err = CanonicalizeBounded(body, se.Size)
	require.NoError(t, err, "exactly at the limit")
	_, err = CanonicalizeBounded([]byte(`{"a":"`+strings.Repeat("x", 500)+`"}`), 100)
	require.ErrorAs(t, err, &se, "the body itself counts")
}

// A large array of scalars costs about its text, not a parse-tree node per
// element: a 1 MB array of 500,000 numbers once took tens of megabytes, and
// hundreds of such starts at once took the API past its memory goal.
func TestCanonicalizeLargeArrayMemory(t *testing.T) {
	for _, tc := range []struct{ name, elem string }{
		{"numbers", "1"},
		{"strings", `"a\u0041"`},
		{"literals", "true"},
		{"mixed", `1.50,"x\n",null`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := []byte(`{"submission":[` + strings.Repeat(tc.elem+",", 1<<20/(len(tc.elem)+1)) + tc.elem + `]}`)
			want := canonicalOfDecoded(t, body)
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			got, err := Canonicalize(body)
			runtime.ReadMemStats(&after)
			require.NoError(t, err)
			require.Equal(t, want, string(got))
			allocated := after.TotalAlloc - before.TotalAlloc
			require.Less(t, allocated, uint64(6*len(body)), "allocated %d bytes for a body of %d", allocated, len(body))
		})
	}
}

// canonicalOfDecoded is body's canonical form the slow way, through
// encoding/json (keys sorted, numbers as written, which are canonical in
// TestCanonicalizeLargeArrayMemory but 1.50).
func canonicalOfDecoded(t *testing.T, body []byte) string {
	t.Helper()
	var v any
	d := json.NewDecoder(strings.NewReader(string(body)))
	d.UseNumber()
	require.NoError(t, d.Decode(&v))
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return strings.ReplaceAll(string(b), "1.50", "1.5")
}
