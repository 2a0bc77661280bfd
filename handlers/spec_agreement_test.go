package handlers_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/internal/apispec/conform"
	"github.com/valruns/valruns/internal/apitest"
)

// The spec says what the server takes: each request below is one a
// schema-driven fuzzer would send (the disagreements issue 18 measured
// among them), and the server accepts it (201) exactly when the spec
// allows it, and refuses it (400) exactly when the spec does not. Every
// answer is also checked against the spec (apitest). What JSON Schema
// cannot state of a value is in the spec's descriptions instead, and not
// here: the NUL character (\u0000) in any string of a body, a 400
// (TestClientInputNeverCauses500 has those), and numbers of more than 256 digits.
func TestSpecAgreesWithTheServerOnRequests(t *testing.T) {
	t.Parallel()
	c, err := conform.Spec()
	require.NoError(t, err)
	e := apitest.New(t)
	org := e.NewOrg("Agreement")
	wf := e.NewWorkflow(org, map[string]any{"name": "invoice"})
	start := "/api/workflows/" + wf + "/start/"
	long := strings.Repeat("k", 256)

	for _, tc := range []struct {
		name, path, body string
		key              string // "" sends none
		ok               bool
	}{
		{"a string submission", start, `{"submission":"x"}`, "", true},
		{"a null submission", start, `{"submission":null}`, "", true},
		{"an array submission", start, `{"submission":[1,2]}`, "", true},
		{"a number submission with null metadata", start, `{"submission":42,"metadata":null}`, "", true},
		{"an object submission with metadata", start, `{"submission":{"customer":"ACME","total":42},"metadata":{"source":"upload"}}`, "", true},
		{"no submission", start, `{}`, "", false},
		{"a misspelt member", start, `{"Submission":{"total":42}}`, "", false},
		{"an unknown member", start, `{"submission":1,"extra":1}`, "", false},
		{"metadata not an object", start, `{"submission":1,"metadata":[1]}`, "", false},
		{"a bare key", start, `{"submission":1}`, "order-1", true},
		{"a quoted key", start, `{"submission":1}`, `"order-2"`, true},
		{"a key of 256 characters", start, `{"submission":1}`, long, false},
		{"an unterminated quoted key", start, `{"submission":1}`, `"order-3`, false},
		{"a lone quote", start, `{"submission":1}`, `"`, false},
		{"a key with a non-ASCII character", start, `{"submission":1}`, "ordér-4", false},
		{"a workflow with a name", "/api/workflows/", `{"name":"a"}`, "", true},
		{"a workflow with a boolean schema", "/api/workflows/", `{"name":"b","schema":true}`, "", true},
		{"a workflow with a null schema", "/api/workflows/", `{"name":"c","schema":null}`, "", true},
		{"a workflow with an object schema", "/api/workflows/", `{"name":"c2","schema":{"type":"object"}}`, "", true},
		{"a workflow with a number schema", "/api/workflows/", `{"name":"c3","schema":5}`, "", false},
		{"a workflow with a string schema", "/api/workflows/", `{"name":"c4","schema":"object"}`, "", false},
		{"a workflow with an array schema", "/api/workflows/", `{"name":"c5","schema":[{"type":"object"}]}`, "", false},
		{"a workflow with an assertion", "/api/workflows/", `{"name":"d","assertions":[{"name":"n","expr":"true"}]}`, "", true},
		{"a workflow without a name", "/api/workflows/", `{}`, "", false},
		{"an empty name", "/api/workflows/", `{"name":""}`, "", false},
		{"a name of spaces", "/api/workflows/", `{"name":"   "}`, "", false},
		{"a name of 201 characters", "/api/workflows/", `{"name":"` + strings.Repeat("n", 201) + `"}`, "", false},
		{"an assertion without expr", "/api/workflows/", `{"name":"e","assertions":[{"name":"n"}]}`, "", false},
		{"an assertion with an unknown member", "/api/workflows/", `{"name":"f","assertions":[{"name":"n","expr":"true","when":1}]}`, "", false},
		{"an unknown severity", "/api/workflows/", `{"name":"g","assertions":[{"name":"n","expr":"true","severity":"fatal"}]}`, "", false},
		{"a webhook endpoint for all events", "/api/webhook-endpoints/", `{"url":"https://example.com/h"}`, "", true},
		{"a webhook endpoint for one event", "/api/webhook-endpoints/", `{"url":"https://example.com/h","events":["validation_run.finished"]}`, "", true},
		{"a webhook endpoint for no event", "/api/webhook-endpoints/", `{"url":"https://example.com/h","events":[]}`, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodPost, tc.path, strings.NewReader(tc.body))
			req.Header.Set("Content-Type", "application/json")
			headers := []string{}
			if tc.key != "" {
				req.Header.Set("Idempotency-Key", tc.key)
				headers = append(headers, "Idempotency-Key", tc.key)
			}
			specErr := c.CheckRequest(req, []byte(tc.body))
			require.NotErrorIs(t, specErr, conform.ErrNotDocumented)
			r := e.Do(http.MethodPost, tc.path, org.Token, tc.body, headers...)
			if tc.ok {
				require.NoError(t, specErr, "the spec allows it")
				require.Equal(t, http.StatusCreated, r.Status, "the server takes it: %s", r.Body)
				return
			}
			require.Error(t, specErr, "the spec refuses it")
			require.Equal(t, http.StatusBadRequest, r.Status, "the server refuses it: %s", r.Body)
		})
	}

	// A run started with any JSON value reads back as one the spec allows.
	r := e.Do(http.MethodPost, start, org.Token, `{"submission":"x"}`)
	require.Equal(t, http.StatusCreated, r.Status)
	got := e.Do(http.MethodGet, r.Header.Get("Location"), org.Token, nil)
	require.Equal(t, http.StatusOK, got.Status)
	require.Equal(t, "x", got.Map(t)["submission"])
}
