package conform_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/docs"
	"github.com/valruns/valruns/internal/apispec"
	"github.com/valruns/valruns/internal/apispec/conform"
)

func checker(t *testing.T) *conform.Checker {
	t.Helper()
	c, err := conform.Spec()
	require.NoError(t, err)
	return c
}

// Every recorded example (the answers TestAPIExamples recorded, with ids
// and times replaced by example values) is an answer the document allows.
func TestRecordedExamplesConform(t *testing.T) {
	t.Parallel()
	c := checker(t)
	f, err := apispec.Load("../../../" + apispec.DefaultFile)
	require.NoError(t, err)
	n := 0
	for name, o := range f.Operations {
		method, path, _ := strings.Cut(name, " ")
		path = strings.NewReplacer("{id}", "0b7d3c1e-8a2f-4c55-9a51-0d6f3f1c2b7a", "{scope}", "workflow_start", "{key}", "order-1042").Replace(path)
		for status, r := range o.Responses {
			code, err := strconv.Atoi(status)
			require.NoError(t, err)
			h := http.Header{"Content-Type": {r.ContentType}}
			for k, v := range r.Headers {
				h.Set(k, v)
			}
			body := []byte(r.Body)
			if !strings.Contains(r.ContentType, "json") {
				var s string
				require.NoError(t, json.Unmarshal(r.Body, &s))
				body = []byte(s)
			}
			require.NoError(t, c.Check(httptest.NewRequest(method, path, nil), code, h, body), "%s %s", name, status)
			n++
		}
	}
	require.Greater(t, n, 50)
}

// The checker refuses what the spec does not allow: each case is an answer
// the server once gave or could give if it drifted from the spec.
func TestCheckerRefusesDisagreements(t *testing.T) {
	t.Parallel()
	c := checker(t)
	const run = `{"id":"5b0f6b8e-3f7c-4d2a-9a57-3b2f4c1d0e9a","workflow_id":"0b7d3c1e-8a2f-4c55-9a51-0d6f3f1c2b7a","status":"queued",` +
		`"submission":%s,"metadata":{},"attempts":0,"created_at":"2026-11-22T10:00:00Z"}`
	problem := func(extra string) string {
		return `{"type":"/problems/not_found","title":"Not Found","status":404,"detail":"Run not found.","code":"not_found"` + extra + `}`
	}
	jsonH := http.Header{"Content-Type": {"application/json; charset=utf-8"}, "X-Request-Id": {"r1"}}
	probH := http.Header{"Content-Type": {"application/problem+json"}, "X-Request-Id": {"r1"}}
	get := httptest.NewRequest(http.MethodGet, "/api/runs/5b0f6b8e-3f7c-4d2a-9a57-3b2f4c1d0e9a/", nil)

	ok := []struct {
		name   string
		status int
		h      http.Header
		body   string
	}{
		{"a run whose submission is a string", 200, jsonH, strings.Replace(run, "%s", `"x"`, 1)},
		{"a run whose submission is null", 200, jsonH, strings.Replace(run, "%s", `null`, 1)},
		{"a run whose submission is an array", 200, jsonH, strings.Replace(run, "%s", `[1,2]`, 1)},
		{"a problem with instance and request_id", 404, probH, problem(`,"instance":"/api/runs/x","request_id":"r1"`)},
	}
	for _, tc := range ok {
		require.NoError(t, c.Check(get, tc.status, tc.h, []byte(tc.body)), tc.name)
	}

	bad := []struct {
		name   string
		status int
		h      http.Header
		body   string
	}{
		{"a run without its status", 200, jsonH, strings.Replace(strings.Replace(run, "%s", `1`, 1), `"status":"queued",`, "", 1)},
		{"a run with an unknown status", 200, jsonH, strings.Replace(strings.Replace(run, "%s", `1`, 1), `"queued"`, `"waiting"`, 1)},
		{"a problem without request_id", 404, probH, problem(`,"instance":"/api/runs/x"`)},
		{"a problem without instance", 404, probH, problem(`,"request_id":"r1"`)},
		{"a status the operation does not document", 418, probH, problem(`,"instance":"/api/runs/x","request_id":"r1"`)},
		{"a Content-Type the operation does not produce", 200, http.Header{"Content-Type": {"text/html"}, "X-Request-Id": {"r1"}}, "<p>run</p>"},
		{"a header the response does not document", 200, http.Header{"Content-Type": {"application/json"}, "X-Request-Id": {"r1"}, "X-Debug": {"1"}}, strings.Replace(run, "%s", `1`, 1)},
	}
	for _, tc := range bad {
		require.Error(t, c.Check(get, tc.status, tc.h, []byte(tc.body)), tc.name)
	}

	// Headers are checked against their schemas too: Retry-After is an integer.
	start := httptest.NewRequest(http.MethodPost, "/api/workflows/0b7d3c1e-8a2f-4c55-9a51-0d6f3f1c2b7a/start/", nil)
	busy := `{"type":"/problems/idempotency_key_in_progress","title":"Conflict","status":409,"detail":"A request with this idempotency key is currently being processed.","code":"idempotency_key_in_progress","instance":"/x","request_id":"r1"}`
	require.NoError(t, c.Check(start, 409, http.Header{"Content-Type": {"application/problem+json"}, "Retry-After": {"1"}, "X-Request-Id": {"r1"}}, []byte(busy)))
	require.Error(t, c.Check(start, 409, http.Header{"Content-Type": {"application/problem+json"}, "Retry-After": {"soon"}, "X-Request-Id": {"r1"}}, []byte(busy)))

	// Requests no operation takes are not checked, and say so.
	require.ErrorIs(t, c.Check(httptest.NewRequest(http.MethodGet, "/nothing-here", nil), 404, probH, nil), conform.ErrNotDocumented)
	require.ErrorIs(t, c.Check(httptest.NewRequest(http.MethodHead, "/healthz", nil), 200, jsonH, nil), conform.ErrNotDocumented)
	require.True(t, c.Documented(http.MethodGet, "/api/runs"), "with or without the trailing slash")
	require.True(t, c.Documented(http.MethodGet, "/api/idempotency-keys/workflow_start/a%2Fb"))
}

// The document it checks against is the one the service serves.
func TestCheckerReadsTheServedDocument(t *testing.T) {
	t.Parallel()
	_, err := conform.New(docs.OpenAPI3YAML)
	require.NoError(t, err, "openapi.yaml is the same document")
}
