package handlers_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

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

// A request with more than one credential is refused whichever tokens they
// carry and in whichever order: the server never picks one (it used to
// serve the first header's organisation). Nothing is executed or stored,
// and the same start with one token then executes.
func TestMoreThanOneCredential(t *testing.T) {
	t.Parallel()
	e := apitest.New(t)
	a := e.NewOrg("Acme")
	b := e.NewOrg("Globex")
	wf := e.NewWorkflow(a, map[string]any{"name": "acme's"})
	start := "/api/workflows/" + wf + "/start/"
	body := map[string]any{"submission": map[string]any{"n": 1}}

	tests := []struct {
		name string
		// auth holds the Authorization headers, one field each.
		auth []string
	}{
		{"A then B", []string{"Bearer " + a.Token, "Bearer " + b.Token}},
		{"B then A", []string{"Bearer " + b.Token, "Bearer " + a.Token}},
		{"the same token twice", []string{"Bearer " + a.Token, "Bearer " + a.Token}},
		{"valid then empty", []string{"Bearer " + a.Token, ""}},
		{"empty then valid", []string{"", "Bearer " + a.Token}},
		{"valid then Bearer without token", []string{"Bearer " + a.Token, "Bearer "}},
		{"valid then unknown", []string{"Bearer " + a.Token, "Bearer vr_nope"}},
		{"one field, two credentials", []string{"Bearer " + a.Token + ", Bearer " + b.Token}},
		{"one field, two tokens", []string{"Bearer " + a.Token + "," + b.Token}},
		{"one field, a token and a trailing comma", []string{"Bearer " + a.Token + ","}},
		{"one field, the same credential twice", []string{"Bearer " + a.Token + ", Bearer " + a.Token}},
		{"one field, another scheme first", []string{"Basic eDp5, Bearer " + a.Token}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var headers []string
			for _, v := range tt.auth {
				headers = append(headers, "Authorization", v)
			}
			for _, rq := range []struct {
				method, path string
				body         any
				headers      []string
			}{
				{http.MethodGet, "/api/workflows/", nil, nil},
				{http.MethodGet, "/api/usage", nil, nil},
				{http.MethodPost, start, body, []string{"Idempotency-Key", "two-creds " + tt.name}},
				{http.MethodPost, start, body, nil},
			} {
				r := e.Do(rq.method, rq.path, "", rq.body, append(rq.headers, headers...)...)
				requireProblem(t, r, http.StatusUnauthorized, "unauthenticated")
				require.Equal(t, `Bearer realm="valruns", error="invalid_request"`, r.Header.Get("WWW-Authenticate"),
					"%s %s", rq.method, rq.path)
				require.Contains(t, string(r.Body), "more than one credential")
			}
		})
	}

	t.Run("on the wire", func(t *testing.T) {
		t.Parallel()
		// A real HTTP/1.1 server keeps every field, an empty one too.
		addr := wireServer(t, e, time.Minute)
		for _, auth := range [][]string{
			{"Bearer " + a.Token, "Bearer " + b.Token},
			{"Bearer " + a.Token, ""},
		} {
			head := "GET /api/workflows/ HTTP/1.1\nHost: x"
			for _, v := range auth {
				head += "\nAuthorization: " + v
			}
			_, br := rawRequest(t, addr, head, nil)
			r := readAnswer(t, br)
			requireProblem(t, r, http.StatusUnauthorized, "unauthenticated")
			require.Contains(t, r.Header.Get("WWW-Authenticate"), `error="invalid_request"`)
		}
	})

	t.Cleanup(func() {
		require.Zero(t, e.Count("validation_runs", ""), "nothing executed")
		require.Zero(t, e.Count("idempotency_keys", ""), "nothing stored")
		require.Zero(t, e.Count("usage_slots", "runs > 0"), "nothing billed")
		// One credential: the same key executes.
		r := e.Do(http.MethodPost, start, a.Token, body, "Idempotency-Key", "two-creds A then B")
		require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	})
}

// deleteOrgAsDocumented deletes the organisation id with the SQL that
// docs/operations.md gives operators (its psql variable :'org' bound).
func deleteOrgAsDocumented(t *testing.T, e *apitest.Env, id string) {
	t.Helper()
	b, err := os.ReadFile("../docs/operations.md")
	require.NoError(t, err)
	doc := string(b)
	at := strings.Index(doc, "To remove an organisation by hand")
	require.NotEqual(t, -1, at, "docs/operations.md tells how to delete an organisation")
	begin := strings.Index(doc[at:], "BEGIN;\n")
	end := strings.Index(doc[at:], "COMMIT;")
	require.True(t, begin != -1 && end > begin, "the deletion is one transaction, BEGIN; ... COMMIT;")
	sql := doc[at+begin+len("BEGIN;\n") : at+end]
	require.NoError(t, e.DB.Transaction(func(tx *gorm.DB) error {
		for stmt := range strings.SplitSeq(sql, ";") {
			if stmt = strings.TrimSpace(stmt); stmt != "" {
				if err := tx.Exec(strings.ReplaceAll(stmt, ":'org'", "'"+id+"'")).Error; err != nil {
					return err
				}
			}
		}
		return nil
	}))
	require.Zero(t, e.Count("organizations", "id = ?", id))
}

// An organisation deleted as docs/operations.md says, while its tokens are
// still trusted from the cache (AUTH_CACHE_TTL): no route answers 5xx. A
// write, and the usage, answer 401 invalid_token (the token no longer
// belongs to an organisation), storing nothing under the key; reads find
// nothing. After a 401 the token is no longer trusted from the cache.
func TestDeletedOrganisationsCachedToken(t *testing.T) {
	t.Parallel()
	e := apitest.New(t, apitest.Options{Config: func(c *config.Config) { c.AuthCacheTTL = time.Hour }})
	org := e.NewOrg("Acme")
	wf := e.NewWorkflow(org, map[string]any{"name": "wf"})
	r := e.Do(http.MethodPost, "/api/workflows/"+wf+"/start/", org.Token, map[string]any{"submission": 1}, "Idempotency-Key", "run-1")
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	run := r.Map(t)["id"].(string)
	r = e.Do(http.MethodPost, "/api/webhook-endpoints/", org.Token, map[string]any{"url": "https://example.com/hooks"})
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	hook := "/api/webhook-endpoints/" + r.Map(t)["id"].(string) + "/"
	other := e.NewOrg("Globex")

	key := []string{"Idempotency-Key", "after-deletion"}
	routes := []struct {
		method, path string
		body         any
		headers      []string
		want         int
	}{
		{http.MethodGet, "/api/usage", nil, nil, http.StatusUnauthorized},
		{http.MethodPost, "/api/workflows/", map[string]any{"name": "wf2"}, key, http.StatusUnauthorized},
		{http.MethodPost, "/api/workflows/", map[string]any{"name": "wf3"}, nil, http.StatusUnauthorized},
		{http.MethodPost, "/api/workflows/" + wf + "/start/", map[string]any{"submission": 1}, key, http.StatusUnauthorized},
		{http.MethodPost, "/api/workflows/" + wf + "/start/", map[string]any{"submission": 1}, nil, http.StatusUnauthorized},
		{http.MethodPost, "/api/webhook-endpoints/", map[string]any{"url": "https://example.com/x"}, key, http.StatusUnauthorized},
		{http.MethodPost, "/api/webhook-endpoints/", map[string]any{"url": "https://example.com/y"}, nil, http.StatusUnauthorized},
		{http.MethodGet, "/api/workflows/", nil, nil, http.StatusOK},
		{http.MethodGet, "/api/workflows/" + wf + "/", nil, nil, http.StatusNotFound},
		{http.MethodGet, "/api/runs/", nil, nil, http.StatusOK},
		{http.MethodGet, "/api/runs/?status=passed", nil, nil, http.StatusOK},
		{http.MethodGet, "/api/runs/" + run + "/", nil, []string{"Prefer", "wait=30"}, http.StatusNotFound},
		{http.MethodGet, "/api/idempotency-keys/workflow_start/run-1", nil, nil, http.StatusNotFound},
		{http.MethodGet, "/api/webhook-endpoints/", nil, nil, http.StatusOK},
		{http.MethodGet, hook, nil, nil, http.StatusNotFound},
		{http.MethodGet, hook + "deliveries/", nil, nil, http.StatusNotFound},
		{http.MethodPost, hook + "rotate-secret/", nil, nil, http.StatusNotFound},
		{http.MethodPost, hook + "test/", nil, nil, http.StatusNotFound},
		{http.MethodPost, hook + "deliveries/" + models.NewRunID() + "/redeliver/", nil, nil, http.StatusNotFound},
		{http.MethodDelete, hook, nil, nil, http.StatusNotFound},
	}
	// A token per route, trusted from the cache when the route is called.
	ctx := context.Background()
	tokens := make([]string, len(routes))
	for i := range routes {
		tok, _, err := models.NewTokenStore(e.DB).Create(ctx, org.ID)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, e.Do(http.MethodGet, "/api/workflows/", tok, nil).Status)
		tokens[i] = tok
	}
	deleteOrgAsDocumented(t, e, org.ID)

	for i, rt := range routes {
		r := e.Do(rt.method, rt.path, tokens[i], rt.body, rt.headers...)
		what := fmt.Sprintf("%s %s %v", rt.method, rt.path, rt.headers)
		// assert: every route's answer is told, not only the first wrong one.
		if !assert.Less(t, r.Status, 500, "%s: %s", what, r.Body) ||
			!assert.Equal(t, rt.want, r.Status, "%s: %s", what, r.Body) || rt.want != http.StatusUnauthorized {
			continue
		}
		requireProblem(t, r, http.StatusUnauthorized, "invalid_token")
		require.Contains(t, r.Header.Get("WWW-Authenticate"), `error="invalid_token"`, what)
		require.Empty(t, r.Header.Get("Retry-After"), what)
		// Told once, the process no longer trusts the token.
		r = e.Do(http.MethodGet, "/api/workflows/", tokens[i], nil)
		requireProblem(t, r, http.StatusUnauthorized, "invalid_token")
	}
	require.Zero(t, e.Count("idempotency_keys", "org_id = ? AND key = ?", org.ID, "after-deletion"),
		"a refused write stores nothing under its key")
	for _, table := range []string{"workflows", "validation_runs", "webhook_endpoints", "usage_slots"} {
		require.Zero(t, e.Count(table, "org_id = ?", org.ID), "%s: nothing written for the deleted organisation", table)
	}
	// Another organisation is unaffected.
	r = e.Do(http.MethodGet, "/api/usage", other.Token, nil)
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
}
