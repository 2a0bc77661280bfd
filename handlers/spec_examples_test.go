package handlers_test

import (
	"encoding/json"
	"net/http"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/go-openapi/spec"
	"github.com/go-openapi/strfmt"
	"github.com/go-openapi/validate"
	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/internal/apispec"
)

// specOperation is the operation of the spec named "METHOD /path" as the
// spec writes the path.
func specOperation(t *testing.T, sw *spec.Swagger, name string) *spec.Operation {
	t.Helper()
	method, path, _ := strings.Cut(name, " ")
	item, ok := sw.Paths.Paths[path]
	require.True(t, ok, "%s is not in the spec", name)
	op := map[string]*spec.Operation{http.MethodGet: item.Get, http.MethodPost: item.Post, http.MethodDelete: item.Delete}[method]
	require.NotNil(t, op, "%s is not in the spec", name)
	return op
}

func loadExamples(t *testing.T) *apispec.File {
	t.Helper()
	f, err := apispec.Load(examplesFile)
	require.NoError(t, err, "run make docs")
	return f
}

// backticked are the codes a description names: `snake_case` words.
var backticked = regexp.MustCompile("`([a-z]+(?:_[a-z]+)*)`")

// Every documented response of every operation has an example, and each is
// an answer TestAPIExamples recorded (which fails when the API answers
// otherwise): the spec lists it under its media type, it fits the
// response's schema, its code is one the operation answered with that
// status, the description names exactly the codes recorded with the status,
// and every header the answers carried is documented.
func TestSpecExamples(t *testing.T) {
	t.Parallel()
	doc := loadSpecFile(t)
	expanded, err := doc.Expanded()
	require.NoError(t, err)
	sw := expanded.Spec()
	f := loadExamples(t)

	documented := 0
	for name, op := range specRoutes(sw) {
		for status := range op.Responses.StatusCodeResponses {
			documented++
			o := f.Operations[specName(sw, name)]
			require.NotNil(t, o, "%s has no recorded examples", name)
			require.Contains(t, o.Responses, strconv.Itoa(status), "%s %d has no recorded example", name, status)
		}
	}
	recorded := 0
	for name, o := range f.Operations {
		op := specOperation(t, sw, name)
		for s, r := range o.Responses {
			recorded++
			status, err := strconv.Atoi(s)
			require.NoError(t, err)
			t.Run(name+" "+s, func(t *testing.T) {
				resp, ok := op.Responses.StatusCodeResponses[status]
				require.True(t, ok, "%s %d was recorded but is not documented", name, status)

				// Listed under its media types, as recorded, fitting the schema.
				produces := map[string]bool{}
				for _, mt := range op.Produces {
					produces[mt] = true
				}
				types, err := r.MediaTypes(produces)
				require.NoError(t, err)
				require.Len(t, resp.Examples, len(types))
				var want any
				if len(types) > 0 {
					require.NoError(t, json.Unmarshal(r.Body, &want))
				}
				for _, mt := range types {
					require.Contains(t, op.Produces, mt)
					require.Equal(t, want, resp.Examples[mt], "%s %d: the spec's %s example is the recorded answer", name, status, mt)
					require.NoError(t, validate.AgainstSchema(resp.Schema, resp.Examples[mt], strfmt.Default),
						"%s %d: the example fits the response's schema", name, status)
				}
				if r.Situation != "" {
					require.True(t, strings.HasSuffix(resp.Description, apispec.ExampleSeparator+r.Situation+"."),
						"the description ends with what the example answered: %q", resp.Description)
				}

				// The codes: the example's is one the operation answered
				// with this status, and the description names exactly those.
				codes := r.Codes()
				if status >= 400 {
					require.NotEmpty(t, r.Code(), "%s %d: the example is a problem document", name, status)
					require.Equal(t, "application/problem+json", r.ContentType)
				}
				desc, _, _ := strings.Cut(resp.Description, apispec.ExampleSeparator)
				var named []string
				for _, m := range backticked.FindAllStringSubmatch(desc, -1) {
					named = append(named, m[1])
				}
				require.ElementsMatch(t, codes, dedupe(named),
					"%s %d: the description names the codes the API answered with this status (recorded: %v)", name, status, codes)

				// Every header an answer with this status carried is documented.
				for _, h := range r.HeaderNames() {
					require.True(t, hasHeader(resp.Headers, h), "%s %d: the answer's header %s is not documented", name, status, h)
				}
				if status >= 500 {
					require.Equal(t, "1", r.Headers["Retry-After"], "%s %d: a 5xx says when to retry", name, status)
				}
			})
		}
	}
	require.Equal(t, documented, recorded, "every documented status has one recorded example, and no other is recorded")
}

// specName is the name of an operation of specRoutes (no trailing slash)
// as examples.json writes it (the path as the spec does).
func specName(sw *spec.Swagger, route string) string {
	method, path, _ := strings.Cut(route, " ")
	for p := range sw.Paths.Paths {
		if p == path || p == path+"/" {
			return method + " " + p
		}
	}
	return route
}

func dedupe(in []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range in {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	sort.Strings(out)
	return out
}

func hasHeader(headers map[string]spec.Header, name string) bool {
	for h := range headers {
		if strings.EqualFold(h, name) {
			return true
		}
	}
	return false
}

// The examples of the start and of the workflow create are the requests of
// the README and of `make run`'s demo, and what they were answered: a
// queued run (no findings, no times but created_at, no error) at its
// Location, and the workflow as sent.
func TestSpecExamplesOfTheIdempotentPosts(t *testing.T) {
	t.Parallel()
	f := loadExamples(t)
	sw := loadSpecFile(t).Spec()

	start := f.Operations["POST /api/workflows/{id}/start/"]
	require.NotNil(t, start)
	require.JSONEq(t, `{"submission":{"customer":"ACME","total":42}}`, string(start.Request.Body))
	op := specOperation(t, sw, "POST /api/workflows/{id}/start/")
	for _, p := range op.Parameters {
		if p.In != "header" {
			continue
		}
		if p.Name == "Idempotency-Key" {
			require.NotContains(t, start.Request.Headers, p.Name, "no fixed key: Swagger UI would give it to every visitor")
			require.NotContains(t, p.Extensions, "x-example")
			continue
		}
		require.Equal(t, start.Request.Headers[p.Name], p.Extensions["x-example"], "the %s parameter's example is the one sent", p.Name)
	}
	require.JSONEq(t, string(start.Request.Body), string(mustJSON(t, sw.Definitions["handlers.StartRunRequest"].Example)),
		"the body Swagger UI fills in is the request of the 201 example")

	created := start.Responses["201"]
	var run map[string]any
	require.NoError(t, json.Unmarshal(created.Body, &run))
	require.Equal(t, "queued", run["status"])
	for _, absent := range []string{"findings", "started_at", "finished_at", "error"} {
		require.NotContains(t, run, absent, "a queued run has no %s yet", absent)
	}
	require.Equal(t, map[string]any{"customer": "ACME", "total": float64(42)}, run["submission"])
	require.Equal(t, "/api/runs/"+run["id"].(string)+"/", created.Headers["Location"])
	require.NotEmpty(t, created.Headers["Idempotency-Key-Expires"])
	require.Empty(t, created.Headers["Idempotent-Replayed"], "the example is the first answer, not a replay")

	reused := start.Responses["422"]
	require.Equal(t, "idempotency_key_reused", reused.Code())
	require.Contains(t, string(reused.Body), "Idempotency key has already been used with a different request body.")
	bad := start.Responses["400"]
	require.Equal(t, "validation_error", bad.Code())
	var p struct {
		Detail string
		Errors []struct{ Field, Message string }
	}
	require.NoError(t, json.Unmarshal(bad.Body, &p))
	require.NotContains(t, p.Detail, "limit", "the start's 400 is about its own body")
	require.Len(t, p.Errors, 1)
	require.Equal(t, "Submission", p.Errors[0].Field, "errors[] names the bad field of the request")

	create := f.Operations["POST /api/workflows/"]
	require.NotNil(t, create)
	var sent, got map[string]any
	require.NoError(t, json.Unmarshal(create.Request.Body, &sent))
	require.NoError(t, json.Unmarshal(create.Responses["201"].Body, &got))
	for _, k := range []string{"name", "schema", "assertions"} {
		require.Equal(t, sent[k], got[k], "the created workflow's %s is the one sent", k)
	}
	require.JSONEq(t, string(create.Request.Body), string(mustJSON(t, sw.Definitions["handlers.CreateWorkflowRequest"].Example)))
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return b
}
