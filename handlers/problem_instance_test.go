package handlers_test

import (
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/internal/apitest"
)

// A problem's instance is the path the client sent: with its trailing
// slash or without, escapes as sent, without the query. The router serves
// /a/b/ as /a/b (StripTrailingSlash), so the path it routes on is not it.
// Each kind of problem is here: a handler's (problem.Write), an idempotent
// handler's (idempotency.Problem), and the router's own 404.
func TestProblemInstanceIsThePathSent(t *testing.T) {
	t.Parallel()
	e := apitest.New(t)
	org := e.NewOrg("Instance")
	wf := e.NewWorkflow(org, map[string]any{"name": "instance"})
	missing := uuid.NewString()

	for _, tc := range []struct {
		name, method, path, body string
		headers                  []string
		status                   int
		instance                 string
	}{
		{"a read, with the slash", http.MethodGet, "/api/runs/" + missing + "/", "", nil, http.StatusNotFound, "/api/runs/" + missing + "/"},
		{"a read, without it", http.MethodGet, "/api/runs/" + missing, "", nil, http.StatusNotFound, "/api/runs/" + missing},
		{"a list with a query", http.MethodGet, "/api/runs/?limit=0", "", nil, http.StatusBadRequest, "/api/runs/"},
		{"an escaped key", http.MethodGet, "/api/idempotency-keys/workflow_start/a%2Fb%20c/", "", nil, http.StatusNotFound, "/api/idempotency-keys/workflow_start/a%2Fb%20c/"},
		{"a start with a key, with the slash", http.MethodPost, "/api/workflows/" + wf + "/start/", `{}`, []string{"Idempotency-Key", "instance-1"}, http.StatusBadRequest, "/api/workflows/" + wf + "/start/"},
		{"a start with a key, without it", http.MethodPost, "/api/workflows/" + wf + "/start", `{}`, []string{"Idempotency-Key", "instance-2"}, http.StatusBadRequest, "/api/workflows/" + wf + "/start"},
		{"a webhook endpoint with a key", http.MethodPost, "/api/webhook-endpoints/", `{"url":"https://example.com/h","events":[]}`, []string{"Idempotency-Key", "instance-3"}, http.StatusBadRequest, "/api/webhook-endpoints/"},
		{"an unknown route", http.MethodGet, "/api/nothing-here/", "", nil, http.StatusNotFound, "/api/nothing-here/"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var body any
			if tc.body != "" {
				body = tc.body
			}
			r := e.Do(tc.method, tc.path, org.Token, body, tc.headers...)
			require.Equal(t, tc.status, r.Status, "%s", r.Body)
			require.Equal(t, tc.instance, r.Map(t)["instance"])
		})
	}

	// The same through a real listener and Go's client.
	srv := e.Server()
	req, err := http.NewRequest(http.MethodGet, srv.URL+"/api/workflows/"+missing+"/", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+org.Token)
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusNotFound, resp.StatusCode, "%s", b)
	var p struct{ Instance string }
	require.NoError(t, json.Unmarshal(b, &p))
	require.Equal(t, "/api/workflows/"+missing+"/", p.Instance)
}
