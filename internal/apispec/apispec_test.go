package apispec

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/stretchr/testify/require"
)

// copyDocs copies the generated docs/ into a temporary directory.
func copyDocs(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, name := range []string{"docs.go", "swagger.json", "swagger.yaml"} {
		b, err := os.ReadFile(filepath.Join("..", "..", "docs", name))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), b, 0o644))
	}
	return dir
}

// Writing the three files again without adding anything reproduces them
// byte for byte: the files ApplyDir writes differ from swag's output only
// by what it adds, and what it adds is written as swag writes JSON.
func TestApplyDirWritesAsSwag(t *testing.T) {
	t.Parallel()
	dir := copyDocs(t)
	require.NoError(t, ApplyDir(dir, &File{Operations: map[string]*Operation{}}))
	for _, name := range []string{"docs.go", "swagger.json", "swagger.yaml"} {
		want, err := os.ReadFile(filepath.Join("..", "..", "docs", name))
		require.NoError(t, err)
		got, err := os.ReadFile(filepath.Join(dir, name))
		require.NoError(t, err)
		require.Equal(t, string(want), string(got), name)
	}
}

func TestDecodeKeepsOrderAndText(t *testing.T) {
	t.Parallel()
	in := `{"z":1,"a":{"y":[1.50,"a > b",null,true],"b":{}},"m":[]}`
	v, err := Decode([]byte(in), false)
	require.NoError(t, err)
	require.Equal(t, in, string(v.Compact()))
	v, err = Decode([]byte(in), true)
	require.NoError(t, err)
	require.Equal(t, strings.Replace(in, ">", `\u003e`, 1), string(v.Compact()), "as encoding/json writes strings")
}

func spec(t *testing.T) *Value {
	t.Helper()
	v, err := Decode([]byte(`{"paths":{"/x/":{"post":{"produces":["application/json","application/problem+json"],
		"parameters":[{"name":"K","in":"header","type":"string"},{"name":"body","in":"body","schema":{"$ref":"#/definitions/Req"}}],
		"responses":{"201":{"description":"Created."},"422":{"description":"Reused."}}}}},
		"definitions":{"Req":{"type":"object"}}}`), true)
	require.NoError(t, err)
	return v
}

func TestApply(t *testing.T) {
	t.Parallel()
	s := spec(t)
	f := &File{Operations: map[string]*Operation{"POST /x/": {
		Request: &Request{Headers: map[string]string{"K": "k-1"}, Body: json.RawMessage(`{"a": 1}`)},
		Responses: map[string]*Response{
			"201": {Situation: "a new key", ContentType: "application/json; charset=utf-8", Body: json.RawMessage(`{"id":"1","b":2}`)},
			"422": {ContentType: "application/problem+json", Body: json.RawMessage(`{"code":"reused"}`)},
		},
	}}}
	require.NoError(t, Apply(s, f))
	op := s.Get("paths").Get("/x/").Get("post")
	created := op.Get("responses").Get("201")
	require.Equal(t, "Created."+ExampleSeparator+"a new key.", created.Get("description").Str())
	require.Equal(t, `{"application/json":{"id":"1","b":2}}`, string(created.Get("examples").Compact()), "the recorded order")
	require.Equal(t, `{"application/json":{"code":"reused"},"application/problem+json":{"code":"reused"}}`,
		string(op.Get("responses").Get("422").Get("examples").Compact()),
		"a problem document is listed under application/json too, which Swagger UI shows unless told otherwise")
	require.Equal(t, "Reused.", op.Get("responses").Get("422").Get("description").Str())
	require.Equal(t, "k-1", op.Get("parameters").Array[0].Get("x-example").Str())
	require.Equal(t, `{"a":1}`, string(s.Get("definitions").Get("Req").Get("example").Compact()))

	require.ErrorContains(t, Apply(s, f), "has examples already", "Apply runs once")
}

func TestApplyRefuses(t *testing.T) {
	t.Parallel()
	ok := func() *Response {
		return &Response{ContentType: "application/json", Body: json.RawMessage(`{}`)}
	}
	for name, tc := range map[string]struct {
		op   string
		o    *Operation
		want string
	}{
		"operation not in the spec": {"GET /x/", &Operation{Responses: map[string]*Response{"200": ok()}}, "not in the spec"},
		"status not documented":     {"POST /x/", &Operation{Responses: map[string]*Response{"500": ok()}}, "status 500 is not documented"},
		"media type not produced": {"POST /x/", &Operation{Responses: map[string]*Response{
			"201": {ContentType: "text/plain", Body: json.RawMessage(`"hi"`)}}}, "not one of the operation's produces"},
		"header not a parameter": {"POST /x/", &Operation{Request: &Request{Headers: map[string]string{"Prefer": "wait=5"}},
			Responses: map[string]*Response{}}, "Prefer is not a parameter"},
	} {
		t.Run(name, func(t *testing.T) {
			require.ErrorContains(t, Apply(spec(t), &File{Operations: map[string]*Operation{tc.op: tc.o}}), tc.want)
		})
	}
}

// A response offers the one media type the server sends with its status:
// problem+json for an error, JSON for a success, and the example goes with it.
func TestOpenAPI3OneMediaTypePerStatus(t *testing.T) {
	t.Parallel()
	v, err := Decode([]byte(`{"swagger":"2.0","info":{"title":"t","version":"1"},"paths":{"/x/":{"post":{
		"produces":["application/json","application/problem+json"],
		"responses":{"201":{"description":"Created.","schema":{"type":"object"},"examples":{"application/json":{"id":"1"}}},
		"422":{"description":"Reused.","schema":{"type":"object"},"examples":{"application/json":{"code":"reused"}}}}}}}}`), true)
	require.NoError(t, err)
	v3, err := ToOpenAPI3(v)
	require.NoError(t, err)
	rs := v3.Paths.Value("/x/").Post.Responses
	created, reused := rs.Value("201").Value.Content, rs.Value("422").Value.Content
	require.Len(t, created, 1)
	require.NotNil(t, created["application/json"])
	require.Equal(t, map[string]any{"id": "1"}, created["application/json"].Example)
	require.Len(t, reused, 1)
	require.NotNil(t, reused["application/problem+json"])
	require.Equal(t, map[string]any{"code": "reused"}, reused["application/problem+json"].Example)
}

// openAPI3Of converts a Swagger 2.0 document with one definition, Req, the
// body of POST /x/, after Tighten.
func openAPI3Of(t *testing.T, req string) (*openapi3.Schema, error) {
	t.Helper()
	v, err := Decode([]byte(`{"swagger":"2.0","info":{"title":"t","version":"1"},"paths":{"/x/":{"post":{
		"parameters":[{"name":"body","in":"body","required":true,"schema":{"$ref":"#/definitions/Req"}}],
		"responses":{"204":{"description":"Done."}}}}},"definitions":{"Req":`+req+`}}`), true)
	require.NoError(t, err)
	if err := Tighten(v); err != nil {
		return nil, err
	}
	v3, err := ToOpenAPI3(v)
	if err != nil {
		return nil, err
	}
	return v3.Components.Schemas["Req"].Value, nil
}

// x-json-types becomes anyOf with a branch per type, null as the nullable
// of the first branch (OpenAPI 3.0 has no null type, and nullable needs a
// type beside it): what takes an object, true, false or null, and no other.
func TestOpenAPI3JSONTypes(t *testing.T) {
	t.Parallel()
	req, err := openAPI3Of(t, `{"type":"object","properties":{"schema":{"description":"d","x-json-types":"object|boolean|null"}}}`)
	require.NoError(t, err)
	s := req.Properties["schema"].Value
	require.Len(t, s.AnyOf, 2)
	require.Equal(t, "d", s.Description)
	require.False(t, s.Nullable, "nullable without a type is not OpenAPI 3.0")
	for _, ok := range []any{map[string]any{"type": "object"}, true, false, nil} {
		require.NoError(t, s.VisitJSON(ok), "%v", ok)
	}
	for _, bad := range []any{5.0, "object", []any{}} {
		require.Error(t, s.VisitJSON(bad), "%v", bad)
	}

	for _, tc := range []struct{ schema, want string }{
		{`{"x-json-types":"object|date"}`, `"date" is not a JSON type`},
		{`{"x-json-types":"null"}`, "names no type but null"},
		{`{"type":"string","x-json-types":"object|boolean"}`, "the schema itself has none"},
	} {
		_, err := openAPI3Of(t, `{"type":"object","properties":{"schema":`+tc.schema+`}}`)
		require.ErrorContains(t, err, tc.want, tc.schema)
	}
}

// A schema that is nullable without a type (swag's x-nullable on a member
// of any JSON value) is refused: it is not OpenAPI 3.0, whatever
// kin-openapi's own validation says.
func TestOpenAPI3RefusesNullableWithoutType(t *testing.T) {
	t.Parallel()
	_, err := openAPI3Of(t, `{"type":"object","properties":{"submission":{"x-nullable":true}}}`)
	require.ErrorContains(t, err, "nullable without a type")
	req, err := openAPI3Of(t, `{"type":"object","properties":{"metadata":{"type":"object","x-nullable":true},"submission":{}}}`)
	require.NoError(t, err)
	require.True(t, req.Properties["metadata"].Value.Nullable)
}

// x-min-items becomes minItems, a number (swag drops a minItems tag).
func TestTightenMinItems(t *testing.T) {
	t.Parallel()
	req, err := openAPI3Of(t, `{"type":"object","properties":{"events":{"type":"array","items":{"type":"string"},"x-min-items":"1"}}}`)
	require.NoError(t, err)
	require.EqualValues(t, 1, req.Properties["events"].Value.MinItems)
	_, err = openAPI3Of(t, `{"type":"object","properties":{"events":{"type":"array","items":{"type":"string"},"x-min-items":"one"}}}`)
	require.ErrorContains(t, err, "x-min-items")
}
