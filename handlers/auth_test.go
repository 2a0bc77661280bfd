package handlers_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/config"
	"github.com/valruns/valruns/internal/apitest"
	"github.com/valruns/valruns/models"
)

func TestAuthHeader(t *testing.T) {
	t.Parallel()
	e := apitest.New(t)
	org := e.NewOrg("Acme")

	tests := []struct {
		name string
		// auth is the Authorization header; "-" sends none.
		auth     string
		want     int
		wantCode string
	}{
		{name: "good token", auth: "Bearer " + org.Token, want: http.StatusOK},
		{name: "scheme is case-insensitive", auth: "bearer " + org.Token, want: http.StatusOK},
		{name: "missing header", auth: "-", want: http.StatusUnauthorized, wantCode: "unauthenticated"},
		{name: "empty header", auth: "", want: http.StatusUnauthorized, wantCode: "unauthenticated"},
		{name: "Bearer without token", auth: "Bearer", want: http.StatusUnauthorized, wantCode: "unauthenticated"},
		{name: "Bearer with empty token", auth: "Bearer ", want: http.StatusUnauthorized, wantCode: "unauthenticated"},
		{name: "Bearer with blank token", auth: "Bearer    ", want: http.StatusUnauthorized, wantCode: "unauthenticated"},
		{name: "wrong scheme", auth: "Basic x", want: http.StatusUnauthorized, wantCode: "unauthenticated"},
		{name: "token without scheme", auth: org.Token, want: http.StatusUnauthorized, wantCode: "unauthenticated"},
		{name: "unknown token", auth: "Bearer vr_" + strings.Repeat("Z", 43), want: http.StatusUnauthorized, wantCode: "invalid_token"},
		{name: "garbage token", auth: "Bearer vr_!@#$%", want: http.StatusUnauthorized, wantCode: "invalid_token"},
		{name: "token without prefix", auth: "Bearer " + strings.TrimPrefix(org.Token, "vr_"), want: http.StatusUnauthorized, wantCode: "invalid_token"},
		{name: "truncated token", auth: "Bearer " + org.Token[:len(org.Token)-1], want: http.StatusUnauthorized, wantCode: "invalid_token"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var headers []string
			if tt.auth != "-" {
				headers = []string{"Authorization", tt.auth}
			}
			r := e.Do(http.MethodGet, "/api/workflows/", "", nil, headers...)
			require.Equal(t, tt.want, r.Status, "body %s", r.Body)
			if tt.want == http.StatusOK {
				require.Empty(t, r.Header.Get("WWW-Authenticate"))
				return
			}
			requireProblem(t, r, http.StatusUnauthorized, tt.wantCode)
			require.True(t, strings.HasPrefix(r.Header.Get("WWW-Authenticate"), "Bearer "),
				"WWW-Authenticate %q", r.Header.Get("WWW-Authenticate"))
		})
	}
}

func TestEveryAPIRouteNeedsAToken(t *testing.T) {
	t.Parallel()
	e := apitest.New(t)
	org := e.NewOrg("Acme")
	wf := e.NewWorkflow(org, map[string]any{"name": "wf"})
	before := e.Count("workflows", "")

	routes := []struct{ method, path string }{
		{http.MethodGet, "/api/workflows/"},
		{http.MethodGet, "/api/workflows"},
		{http.MethodPost, "/api/workflows/"},
		{http.MethodGet, "/api/workflows/" + wf + "/"},
		{http.MethodPost, "/api/workflows/" + wf + "/start/"},
		{http.MethodGet, "/api/runs/"},
		{http.MethodGet, "/api/runs/?workflow_id=" + wf},
		{http.MethodGet, "/api/runs/00000000-0000-0000-0000-000000000000/"},
	}
	for _, rt := range routes {
		t.Run(rt.method+" "+rt.path, func(t *testing.T) {
			t.Parallel()
			var body any
			if rt.method == http.MethodPost {
				body = map[string]any{"name": "x", "submission": map[string]any{}}
			}
			r := e.Do(rt.method, rt.path, "", body, "Idempotency-Key", "k-"+rt.path)
			requireProblem(t, r, http.StatusUnauthorized, "unauthenticated")
			require.NotEmpty(t, r.Header.Get("WWW-Authenticate"))
		})
	}
	t.Cleanup(func() {
		// Nothing was created or stored by the refused requests.
		require.Equal(t, before, e.Count("workflows", ""))
		require.Zero(t, e.Count("validation_runs", ""))
		require.Zero(t, e.Count("idempotency_keys", ""))
	})
}

func TestRevokedToken(t *testing.T) {
	t.Parallel()
	e := apitest.New(t, apitest.Options{Config: func(c *config.Config) { c.AuthCacheTTL = 0 }})
	org := e.NewOrg("Acme")
	ctx := context.Background()
	tokens := models.NewTokenStore(e.DB)
	token, row, err := tokens.Create(ctx, org.ID)
	require.NoError(t, err)

	r := e.Do(http.MethodGet, "/api/workflows/", token, nil)
	require.Equal(t, http.StatusOK, r.Status, "before revocation: %s", r.Body)

	require.NoError(t, tokens.Revoke(ctx, row.ID))

	r = e.Do(http.MethodGet, "/api/workflows/", token, nil)
	requireProblem(t, r, http.StatusUnauthorized, "invalid_token")
	require.Contains(t, r.Header.Get("WWW-Authenticate"), `error="invalid_token"`)

	r = e.Do(http.MethodPost, "/api/workflows/", token, map[string]any{"name": "after revocation"})
	requireProblem(t, r, http.StatusUnauthorized, "invalid_token")
	require.Zero(t, e.Count("workflows", ""))

	// The organisation's other token is unaffected.
	r = e.Do(http.MethodGet, "/api/workflows/", org.Token, nil)
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
}

func TestCrossOrgIsNotFound(t *testing.T) {
	t.Parallel()
	e := apitest.New(t)
	acme := e.NewOrg("Acme")
	globex := e.NewOrg("Globex")
	wf := e.NewWorkflow(acme, map[string]any{"name": "acme only"})
	r := e.Do(http.MethodPost, "/api/workflows/"+wf+"/start/", acme.Token, map[string]any{"submission": map[string]any{"a": 1}})
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	run := r.Map(t)["id"].(string)

	tests := []struct {
		name, method, path string
		body               any
	}{
		{"read workflow", http.MethodGet, "/api/workflows/" + wf + "/", nil},
		{"read workflow without slash", http.MethodGet, "/api/workflows/" + wf, nil},
		{"start run", http.MethodPost, "/api/workflows/" + wf + "/start/", map[string]any{"submission": map[string]any{"a": 1}}},
		{"read run", http.MethodGet, "/api/runs/" + run + "/", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := e.Do(tt.method, tt.path, globex.Token, tt.body)
			requireProblem(t, r, http.StatusNotFound, "not_found")
			require.NotEqual(t, http.StatusForbidden, r.Status)
		})
	}

	t.Run("lists are empty", func(t *testing.T) {
		t.Parallel()
		for _, path := range []string{"/api/workflows/", "/api/runs/", "/api/runs/?workflow_id=" + wf} {
			r := e.Do(http.MethodGet, path, globex.Token, nil)
			require.Equal(t, http.StatusOK, r.Status, path)
			require.Empty(t, r.Map(t)["data"], path)
		}
	})

	t.Cleanup(func() {
		require.EqualValues(t, 1, e.Count("validation_runs", ""), "globex started nothing on acme's workflow")
		require.Zero(t, e.Count("usage_slots", "org_id = ? AND runs > 0", globex.ID))
	})
}
