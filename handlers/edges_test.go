package handlers_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/config"
	"github.com/valruns/valruns/idempotency"
	"github.com/valruns/valruns/internal/apitest"
)

// A number PostgreSQL cannot store (22003 on insert, repeated on every
// retry, so a client that retries 5xx looped forever) is a 400 naming where
// it is, in a submission, in metadata and in a schema keyword; nothing is
// stored, so the corrected retry with the same key executes.
func TestNumbersPostgreSQLCannotStoreAre400(t *testing.T) {
	t.Parallel()
	e := apitest.New(t)
	org := e.NewOrg("acme")
	wf := e.NewWorkflow(org, map[string]any{"name": "wf"})
	tests := []struct {
		name, path, body, field string
	}{
		{"huge in a submission", "/api/workflows/" + wf + "/start", `{"submission":{"total":1e1000000}}`, "submission.total"},
		{"tiny in a submission", "/api/workflows/" + wf + "/start", `{"submission":{"items":[1,1e-1000000]}}`, "submission.items[1]"},
		{"in metadata", "/api/workflows/" + wf + "/start", `{"submission":1,"metadata":{"x":-1e1000000}}`, "metadata.x"},
		{"in a schema keyword", "/api/workflows/", `{"name":"n","schema":{"type":"number","minimum":1e-1000000}}`, "schema.minimum"},
		{"amplifying", "/api/workflows/" + wf + "/start", `{"submission":[1e131071,1e131071]}`, "submission[0]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for range 2 { // the same answer again: nothing was stored
				r := e.Do(http.MethodPost, tt.path, org.Token, tt.body, idempotency.HeaderKey, "num-"+tt.name)
				p := requireProblem(t, r, http.StatusBadRequest, idempotency.CodeInvalidNumber)
				require.Contains(t, p["detail"], tt.field)
				errs := p["errors"].([]any)
				require.Equal(t, tt.field, errs[0].(map[string]any)["field"])
			}
			require.Zero(t, e.Count("idempotency_keys", "key = ?", "num-"+tt.name))
		})
	}
	require.Zero(t, e.Count("validation_runs", ""))
	r := e.Do(http.MethodPost, "/api/workflows/"+wf+"/start", org.Token, `{"submission":{"total":1e10}}`,
		idempotency.HeaderKey, "num-huge in a submission")
	require.Equal(t, http.StatusCreated, r.Status, "the corrected request with the same key executes: %s", r.Body)
}

// A small request cannot become a huge stored answer: 9 KB of 1e200
// literals, within MAX_BODY_BYTES, would be stored (and answered) as
// 300 KB of digits. It is refused before any work, and nothing is stored.
func TestSizeAmplificationRefused(t *testing.T) {
	t.Parallel()
	e := apitest.New(t, apitest.Options{Config: func(c *config.Config) { c.MaxBodyBytes = 16 << 10 }})
	org := e.NewOrg("acme")
	wf := e.NewWorkflow(org, map[string]any{"name": "wf"})
	body := `{"submission":[` + strings.TrimSuffix(strings.Repeat("1e200,", 1500), ",") + `]}`
	require.Less(t, len(body), 10<<10)
	r := e.Do(http.MethodPost, "/api/workflows/"+wf+"/start", org.Token, body, idempotency.HeaderKey, "amp-1")
	p := requireProblem(t, r, http.StatusRequestEntityTooLarge, idempotency.CodeBodyTooLarge)
	require.Contains(t, p["detail"], "written out in decimal")
	require.Less(t, len(r.Body), 1024)
	require.Zero(t, e.Count("validation_runs", ""))
	require.Zero(t, e.Count("idempotency_keys", ""))
}

// An empty body is refused before the handler and not stored against its
// key: the corrected retry with the same key executes (it used to be 422).
func TestEmptyBodyIsNotStored(t *testing.T) {
	t.Parallel()
	e := apitest.New(t)
	org := e.NewOrg("acme")
	wf := e.NewWorkflow(org, map[string]any{"name": "wf"})
	for _, body := range []string{"", "  \n", "null", "[]", `"x"`} {
		r := e.Do(http.MethodPost, "/api/workflows/"+wf+"/start", org.Token, body, idempotency.HeaderKey, "empty-1")
		requireProblem(t, r, http.StatusBadRequest, idempotency.CodeInvalidJSON)
	}
	require.Zero(t, e.Count("idempotency_keys", ""))
	r := e.Do(http.MethodPost, "/api/workflows/"+wf+"/start", org.Token, `{"submission":1}`, idempotency.HeaderKey, "empty-1")
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
}

// Body keys match exactly: {"submission":1,"SUBMISSION":2} no longer starts
// a run with submission 2 (encoding/json matches names case-insensitively),
// and an unknown field is named in errors[] like any other bad field.
func TestBodyKeysMatchExactly(t *testing.T) {
	t.Parallel()
	e := apitest.New(t)
	org := e.NewOrg("acme")
	wf := e.NewWorkflow(org, map[string]any{"name": "wf"})
	tests := []struct {
		name, path, body string
		fields           []string
		hint             string
	}{
		{"another case", "/api/workflows/" + wf + "/start", `{"submission":1,"SUBMISSION":2}`, []string{"SUBMISSION"}, `did you mean "submission"`},
		{"only another case", "/api/workflows/" + wf + "/start", `{"Submission":1}`, []string{"Submission"}, `did you mean "submission"`},
		{"unknown", "/api/workflows/" + wf + "/start", `{"submission":1,"x":2,"b":3}`, []string{"b", "x"}, "unknown field"},
		{"nested", "/api/workflows/", `{"name":"n","assertions":[{"name":"a","expr":"true"},{"Name":"b","expr":"true"}]}`, []string{"assertions[1].Name"}, `did you mean "name"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := e.Do(http.MethodPost, tt.path, org.Token, tt.body)
			p := requireProblem(t, r, http.StatusBadRequest, "validation_error")
			var fields []string
			for _, fe := range p["errors"].([]any) {
				fields = append(fields, fe.(map[string]any)["field"].(string))
				require.Contains(t, fe.(map[string]any)["message"], tt.hint)
			}
			require.Equal(t, tt.fields, fields)
		})
	}
	require.Zero(t, e.Count("validation_runs", ""))

	// A field of the wrong type is named the same way.
	r := e.Do(http.MethodPost, "/api/workflows/", org.Token, `{"name":"n","assertions":[{"name":"a","expr":7}]}`)
	p := requireProblem(t, r, http.StatusBadRequest, "validation_error")
	require.Equal(t, "assertions[0].expr", p["errors"].([]any)[0].(map[string]any)["field"])
}

// A workflow id is the same workflow in any case: the same request with the
// same key is a replay, not a 422 for "another path".
func TestWorkflowIDCaseIsOneFingerprint(t *testing.T) {
	t.Parallel()
	e := apitest.New(t)
	org := e.NewOrg("acme")
	wf := e.NewWorkflow(org, map[string]any{"name": "wf"})
	first := e.Do(http.MethodPost, "/api/workflows/"+wf+"/start", org.Token, `{"submission":1}`, idempotency.HeaderKey, "case-1")
	require.Equal(t, http.StatusCreated, first.Status, "%s", first.Body)
	for _, path := range []string{
		"/api/workflows/" + strings.ToUpper(wf) + "/start",
		"/api/workflows/" + strings.ToUpper(wf) + "/start/",
	} {
		r := e.Do(http.MethodPost, path, org.Token, `{"submission":1}`, idempotency.HeaderKey, "case-1")
		require.Equal(t, http.StatusCreated, r.Status, "%s: %s", path, r.Body)
		require.Equal(t, "true", r.Header.Get(idempotency.HeaderReplayed), path)
		require.Equal(t, first.Body, r.Body)
	}
	// Started with an upper-case id, replayed with the lower-case one.
	up := e.Do(http.MethodPost, "/api/workflows/"+strings.ToUpper(wf)+"/start", org.Token, `{"submission":2}`, idempotency.HeaderKey, "case-2")
	require.Equal(t, http.StatusCreated, up.Status, "%s", up.Body)
	r := e.Do(http.MethodPost, "/api/workflows/"+wf+"/start", org.Token, `{"submission":2}`, idempotency.HeaderKey, "case-2")
	require.Equal(t, "true", r.Header.Get(idempotency.HeaderReplayed))
	require.EqualValues(t, 2, e.Count("validation_runs", ""))
}

// Metric labels take a closed set of values: 200 requests with invented
// methods on invented paths add one "other" series, not 200.
func TestMetricLabelsAreBounded(t *testing.T) {
	t.Parallel()
	e := apitest.New(t)
	e.Do(http.MethodGet, "/healthz", "", nil)
	before := len(e.Do(http.MethodGet, "/metrics", "", nil).Body)
	for i := range 200 {
		e.Do(fmt.Sprintf("M%dETHOD", i), fmt.Sprintf("/x/%d", i), "", nil)
		e.Do(fmt.Sprintf("Q%d", i), "/healthz", "", nil)
	}
	r := e.Do(http.MethodGet, "/metrics", "", nil)
	require.Less(t, len(r.Body)-before, 8<<10, "200 invented methods grew /metrics by %d bytes", len(r.Body)-before)
	require.Contains(t, string(r.Body), `method="other"`)
	require.NotContains(t, string(r.Body), "M17ETHOD")
	require.NotContains(t, string(r.Body), "/x/17")
}

// GET routes answer HEAD like GET, without the body.
func TestHEADOnGETRoutes(t *testing.T) {
	t.Parallel()
	e := apitest.New(t)
	org := e.NewOrg("acme")
	wf := e.NewWorkflow(org, map[string]any{"name": "wf"})
	srv := e.Server() // a real net/http server: it is what drops a HEAD's body
	send := func(method, path, token string) (*http.Response, []byte) {
		req, err := http.NewRequest(method, srv.URL+path, nil)
		require.NoError(t, err)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp, b
	}
	for _, tc := range []struct{ path, token string }{
		{"/healthz", ""}, {"/readyz", ""}, {"/metrics", ""}, {"/", ""},
		{"/api/workflows/", org.Token}, {"/api/workflows/" + wf, org.Token}, {"/api/runs", org.Token},
		{"/api/usage", org.Token},
	} {
		get, getBody := send(http.MethodGet, tc.path, tc.token)
		head, headBody := send(http.MethodHead, tc.path, tc.token)
		require.Equal(t, http.StatusOK, get.StatusCode, tc.path)
		require.Equal(t, get.StatusCode, head.StatusCode, tc.path)
		require.Equal(t, get.Header.Get("Content-Type"), head.Header.Get("Content-Type"), tc.path)
		require.NotEmpty(t, getBody, tc.path)
		require.Empty(t, headBody, tc.path)
	}
	// An unknown run is a 404 for HEAD too, and POST-only routes stay 405.
	resp, _ := send(http.MethodHead, "/api/runs/00000000-0000-0000-0000-000000000000", org.Token)
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
	resp, _ = send(http.MethodHead, "/api/workflows/"+wf+"/start", org.Token)
	require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
}

// Every answer the wrapper gives is counted under exactly one outcome of
// valruns_idempotency_requests_total, including a 413 sent with a key.
func TestEveryIdempotentAnswerCountedOnce(t *testing.T) {
	t.Parallel()
	e := apitest.New(t, apitest.Options{Config: func(c *config.Config) { c.MaxBodyBytes = 1024 }})
	org := e.NewOrg("acme")
	wf := e.NewWorkflow(org, map[string]any{"name": "wf"})
	start := "/api/workflows/" + wf + "/start"
	big := `{"submission":"` + strings.Repeat("x", 2048) + `"}`
	sends := []struct {
		body    string
		headers []string
		outcome string
	}{
		{`{"submission":1}`, nil, idempotency.OutcomeNoKey},
		{`{"submission":1}`, []string{idempotency.HeaderKey, "k1"}, idempotency.OutcomeNew},
		{`{"submission":1}`, []string{idempotency.HeaderKey, "k1"}, idempotency.OutcomeReplayed},
		{`{"submission":2}`, []string{idempotency.HeaderKey, "k1"}, idempotency.OutcomeMismatch},
		{big, []string{idempotency.HeaderKey, "k2"}, idempotency.OutcomeRejected},
		{big, nil, idempotency.OutcomeRejected},
		{`{"submission":1}`, []string{idempotency.HeaderKey, ""}, idempotency.OutcomeRejected},
		{``, []string{idempotency.HeaderKey, "k3"}, idempotency.OutcomeRejected},
		{`{"submission":1e999}`, []string{idempotency.HeaderKey, "k4"}, idempotency.OutcomeRejected},
	}
	want := map[string]float64{}
	for _, s := range sends {
		e.Do(http.MethodPost, start, org.Token, s.body, s.headers...)
		want[s.outcome]++
	}
	got := idempotencyOutcomes(t, e.Registry, "workflow_start")
	require.Equal(t, want, got)
}

// idempotencyOutcomes reads valruns_idempotency_requests_total of scope by outcome.
func idempotencyOutcomes(t *testing.T, reg *prometheus.Registry, scope string) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, mf := range families {
		if mf.GetName() != "valruns_idempotency_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["scope"] == scope && m.GetCounter().GetValue() > 0 {
				out[labels["outcome"]] += m.GetCounter().GetValue()
			}
		}
	}
	return out
}
