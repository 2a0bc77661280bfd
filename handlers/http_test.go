package handlers_test

import (
	"bytes"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/config"
	"github.com/valruns/valruns/internal/apitest"
)

// leaks are substrings no problem document may contain: SQL errors, driver
// names, stack traces, source positions.
var leaks = []string{"SQLSTATE", "pq:", "pgx", "goroutine", ".go:", "gorm", "panic"}

// requireProblem checks that r is an RFC 9457 problem document for status
// with the given code, and returns it decoded.
func requireProblem(t *testing.T, r apitest.Response, status int, code string) map[string]any {
	t.Helper()
	require.Equal(t, status, r.Status, "body %s", r.Body)
	require.Equal(t, "application/problem+json", r.Header.Get("Content-Type"))
	var p map[string]any
	require.NoError(t, json.Unmarshal(r.Body, &p), "body %q", r.Body)
	require.Equal(t, "/problems/"+code, p["type"], "the type is the path of the code's page")
	require.Equal(t, http.StatusText(status), p["title"])
	require.EqualValues(t, status, p["status"], "status member equals the HTTP status")
	detail, _ := p["detail"].(string)
	require.NotEmpty(t, detail)
	require.Equal(t, code, p["code"], "detail: %s", detail)
	if id := r.Header.Get("X-Request-Id"); id != "" {
		require.Equal(t, id, p["request_id"], "request_id echoes X-Request-Id")
	}
	for _, s := range leaks {
		require.NotContains(t, string(r.Body), s, "the problem leaks internals")
	}
	return p
}

// hiddenSize is a reader whose length the HTTP machinery cannot see, so the
// request goes without Content-Length (chunked).
type hiddenSize struct{ r io.Reader }

func (h hiddenSize) Read(p []byte) (int, error) { return h.r.Read(p) }

func TestProblemDocuments(t *testing.T) {
	t.Parallel()
	e := apitest.New(t, apitest.Options{Config: func(c *config.Config) { c.MaxBodyBytes = 1024 }})
	org := e.NewOrg("Acme")
	wf := e.NewWorkflow(org, map[string]any{"name": "wf"})
	big := `{"name":"` + strings.Repeat("x", 2048) + `"}`
	const unknown = "7d1f2c3b-4a5e-4f60-8b91-a2b3c4d5e6f7"

	tests := []struct {
		name, method, path string
		token              bool
		body               any
		headers            []string
		status             int
		code               string
	}{
		{name: "unknown route", method: http.MethodGet, path: "/nope", status: 404, code: "not_found"},
		{name: "unknown api route", method: http.MethodGet, path: "/api/nope/", token: true, status: 404, code: "not_found"},
		{name: "wrong method on collection", method: http.MethodDelete, path: "/api/workflows/", token: true, status: 405, code: "method_not_allowed"},
		{name: "wrong method on item", method: http.MethodPut, path: "/api/workflows/" + wf + "/", token: true, status: 405, code: "method_not_allowed"},
		{name: "wrong method on healthz", method: http.MethodPost, path: "/healthz", status: 405, code: "method_not_allowed"},
		{name: "no token", method: http.MethodGet, path: "/api/workflows/", status: 401, code: "unauthenticated"},
		{name: "unknown token", method: http.MethodGet, path: "/api/workflows/", headers: []string{"Authorization", "Bearer vr_nope"}, status: 401, code: "invalid_token"},
		{name: "invalid JSON", method: http.MethodPost, path: "/api/workflows/", token: true, body: `{"name":`, status: 400, code: "invalid_json"},
		{name: "empty body", method: http.MethodPost, path: "/api/workflows/", token: true, body: "", status: 400, code: "invalid_json"},
		{name: "body not an object", method: http.MethodPost, path: "/api/workflows/", token: true, body: `[1,2]`, status: 400, code: "invalid_json"},
		{name: "unknown field", method: http.MethodPost, path: "/api/workflows/", token: true, body: `{"name":"a","nmae":"b"}`, status: 400, code: "validation_error"},
		{name: "invalid schema", method: http.MethodPost, path: "/api/workflows/", token: true, body: `{"name":"a","schema":{"type":5}}`, status: 400, code: "invalid_workflow"},
		{name: "invalid CEL", method: http.MethodPost, path: "/api/workflows/", token: true, body: `{"name":"a","assertions":[{"name":"x","expr":"1 +"}]}`, status: 400, code: "invalid_workflow"},
		{name: "idempotency key too long", method: http.MethodPost, path: "/api/workflows/", token: true, body: `{"name":"a"}`, headers: []string{"Idempotency-Key", strings.Repeat("k", 256)}, status: 400, code: "idempotency_key_too_long"},
		{name: "idempotency key not ASCII", method: http.MethodPost, path: "/api/workflows/", token: true, body: `{"name":"a"}`, headers: []string{"Idempotency-Key", "clé"}, status: 400, code: "idempotency_key_invalid"},
		{name: "bad limit", method: http.MethodGet, path: "/api/workflows/?limit=0", token: true, status: 400, code: "validation_error"},
		{name: "bad cursor", method: http.MethodGet, path: "/api/workflows/?cursor=zzz", token: true, status: 400, code: "invalid_cursor"},
		{name: "bad runs cursor", method: http.MethodGet, path: "/api/runs/?cursor=!!", token: true, status: 400, code: "invalid_cursor"},
		{name: "bad workflow_id filter", method: http.MethodGet, path: "/api/runs/?workflow_id=x", token: true, status: 400, code: "validation_error"},
		{name: "body too large", method: http.MethodPost, path: "/api/workflows/", token: true, body: big, status: 413, code: "request_body_too_large"},
		{name: "start body too large", method: http.MethodPost, path: "/api/workflows/" + wf + "/start/", token: true, body: `{"submission":"` + strings.Repeat("x", 2048) + `"}`, status: 413, code: "request_body_too_large"},
		{name: "unknown workflow", method: http.MethodGet, path: "/api/workflows/" + unknown + "/", token: true, status: 404, code: "not_found"},
		{name: "malformed workflow id", method: http.MethodGet, path: "/api/workflows/not-a-uuid/", token: true, status: 404, code: "not_found"},
		{name: "SQL in workflow id", method: http.MethodGet, path: "/api/workflows/'%3B%20select%201--/", token: true, status: 404, code: "not_found"},
		{name: "unknown run", method: http.MethodGet, path: "/api/runs/" + unknown + "/", token: true, status: 404, code: "not_found"},
		{name: "malformed run id", method: http.MethodGet, path: "/api/runs/123/", token: true, status: 404, code: "not_found"},
		{name: "start unknown workflow", method: http.MethodPost, path: "/api/workflows/" + unknown + "/start/", token: true, body: `{"submission":{}}`, status: 404, code: "not_found"},
		{name: "start without submission", method: http.MethodPost, path: "/api/workflows/" + wf + "/start/", token: true, body: `{}`, status: 400, code: "validation_error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			token := ""
			if tt.token {
				token = org.Token
			}
			r := e.Do(tt.method, tt.path, token, tt.body, tt.headers...)
			p := requireProblem(t, r, tt.status, tt.code)
			require.NotEmpty(t, p["request_id"])
			require.NotEmpty(t, r.Header.Get("X-Request-Id"))
		})
	}
}

func TestBodyTooLarge(t *testing.T) {
	t.Parallel()
	e := apitest.New(t, apitest.Options{Config: func(c *config.Config) { c.MaxBodyBytes = 1024 }})
	org := e.NewOrg("Acme")
	wf := e.NewWorkflow(org, map[string]any{"name": "wf"})
	before := e.Count("workflows", "")

	// body is a workflow whose JSON is exactly n bytes.
	body := func(n int) string {
		const head, tail = `{"name":"big","schema":{"description":"`, `"}}`
		return head + strings.Repeat("d", n-len(head)-len(tail)) + tail
	}
	require.Len(t, body(2048), 2048)

	tests := []struct {
		name    string
		path    string
		body    string
		chunked bool
		key     string
	}{
		{name: "create, Content-Length", path: "/api/workflows/", body: body(2048)},
		{name: "create, Content-Length, with key", path: "/api/workflows/", body: body(2048), key: "big-1"},
		{name: "create, chunked", path: "/api/workflows/", body: body(2048), chunked: true},
		{name: "create, chunked, with key", path: "/api/workflows/", body: body(2048), chunked: true, key: "big-2"},
		{name: "create, one byte over, chunked, with key", path: "/api/workflows/", body: body(1025), chunked: true, key: "big-3"},
		{name: "start, chunked, with key", path: "/api/workflows/" + wf + "/start/", body: `{"submission":"` + strings.Repeat("s", 2048) + `"}`, chunked: true, key: "big-4"},
		{name: "start, Content-Length, with key", path: "/api/workflows/" + wf + "/start/", body: `{"submission":"` + strings.Repeat("s", 2048) + `"}`, key: "big-5"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var rd io.Reader = strings.NewReader(tt.body)
			if tt.chunked {
				rd = hiddenSize{strings.NewReader(tt.body)}
			}
			req := httptest.NewRequest(http.MethodPost, tt.path, rd)
			if tt.chunked {
				req.ContentLength = -1
				req.TransferEncoding = []string{"chunked"}
			} else {
				require.EqualValues(t, len(tt.body), req.ContentLength)
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+org.Token)
			if tt.key != "" {
				req.Header.Set("Idempotency-Key", tt.key)
			}
			rec := httptest.NewRecorder()
			e.Handler.ServeHTTP(rec, req)
			r := apitest.Response{Status: rec.Code, Header: rec.Header(), Body: rec.Body.Bytes()}
			p := requireProblem(t, r, http.StatusRequestEntityTooLarge, "request_body_too_large")
			require.Contains(t, p["detail"], "1024")
		})
	}
	t.Cleanup(func() {
		require.Equal(t, before, e.Count("workflows", ""), "no workflow stored")
		require.Zero(t, e.Count("validation_runs", ""), "no run stored")
		require.Zero(t, e.Count("idempotency_keys", ""), "no idempotency key stored")
		require.Zero(t, e.Count("usage_slots", "runs > 0"), "nothing billed")
	})

	t.Run("exactly the limit is accepted", func(t *testing.T) {
		t.Parallel()
		// Its own organisation, so the counts above stay about the refused requests.
		other := e.NewOrg("Other")
		r := e.Do(http.MethodPost, "/api/workflows/", other.Token, body(1024))
		require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
		require.NoError(t, e.DB.Exec(`DELETE FROM workflows WHERE org_id = ?`, other.ID).Error)
	})
}

func TestRequestID(t *testing.T) {
	t.Parallel()
	e := apitest.New(t)

	t.Run("generated when absent", func(t *testing.T) {
		t.Parallel()
		r := e.Do(http.MethodGet, "/nope", "", nil)
		id := r.Header.Get("X-Request-Id")
		require.NotEmpty(t, id)
		p := requireProblem(t, r, http.StatusNotFound, "not_found")
		require.Equal(t, id, p["request_id"])

		r2 := e.Do(http.MethodGet, "/nope", "", nil)
		require.NotEqual(t, id, r2.Header.Get("X-Request-Id"), "each request gets its own id")
	})

	tests := []struct {
		name, sent string
		echoed     bool
	}{
		{name: "sent", sent: "req-abc-123", echoed: true},
		{name: "128 characters", sent: strings.Repeat("r", 128), echoed: true},
		{name: "too long", sent: strings.Repeat("r", 129)},
		{name: "with a space", sent: "a b"},
		{name: "not ASCII", sent: "réq"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			for _, path := range []string{"/nope", "/api/workflows/"} {
				r := e.Do(http.MethodGet, path, "", nil, "X-Request-Id", tt.sent)
				id := r.Header.Get("X-Request-Id")
				require.NotEmpty(t, id)
				if tt.echoed {
					require.Equal(t, tt.sent, id)
				} else {
					require.NotEqual(t, tt.sent, id, "an unusable id is replaced")
				}
				var p map[string]any
				r.JSON(t, &p)
				require.Equal(t, id, p["request_id"])
			}
		})
	}

	t.Run("on success too", func(t *testing.T) {
		t.Parallel()
		r := e.Do(http.MethodGet, "/healthz", "", nil, "X-Request-Id", "health-1")
		require.Equal(t, http.StatusOK, r.Status)
		require.Equal(t, "health-1", r.Header.Get("X-Request-Id"))
	})
}

func TestHealthReadyMetrics(t *testing.T) {
	t.Parallel()
	e := apitest.New(t)
	org := e.NewOrg("Acme")

	for _, path := range []string{"/healthz", "/healthz/", "/readyz", "/readyz/"} {
		r := e.Do(http.MethodGet, path, "", nil)
		require.Equal(t, http.StatusOK, r.Status, path)
		require.Equal(t, map[string]any{"status": "ok"}, r.Map(t), path)
	}
	wf := e.NewWorkflow(org, map[string]any{"name": "wf"})
	require.Equal(t, http.StatusOK, e.Do(http.MethodGet, "/api/workflows/"+wf+"/", org.Token, nil).Status)
	require.Equal(t, http.StatusNotFound, e.Do(http.MethodGet, "/nope", "", nil).Status)

	r := e.Do(http.MethodGet, "/metrics", "", nil)
	require.Equal(t, http.StatusOK, r.Status)
	body := string(r.Body)
	require.Contains(t, body, "valruns_http_requests_total")
	require.Contains(t, body, `valruns_http_requests_total{method="GET",route="/healthz",status="200"} 2`)
	require.Contains(t, body, `valruns_http_requests_total{method="POST",route="/api/workflows",status="201"} 1`)
	// Routes are labelled by pattern, never by id.
	require.Contains(t, body, `route="/api/workflows/:id"`)
	require.NotContains(t, body, wf)
	require.Contains(t, body, `route="unmatched"`)
	require.Contains(t, body, "valruns_http_request_duration_seconds")
	require.True(t, bytes.Contains(r.Body, []byte("valruns_idempotency_requests_total")))
}

// TestClientInputNeverCauses500: whatever a client sends is answered 2xx or
// 4xx; a 5xx means "retry", and a retry of these would fail again.
func TestClientInputNeverCauses500(t *testing.T) {
	t.Parallel()
	e := apitest.New(t)
	org := e.NewOrg("Acme")
	wf := e.NewWorkflow(org, map[string]any{"name": "wf"})
	start := "/api/workflows/" + wf + "/start/"

	tests := []struct {
		name, path, body string
		headers          []string
		status           int
		code             string // for a 4xx
	}{
		// PostgreSQL text and jsonb cannot hold U+0000.
		{name: "NUL in workflow name", path: "/api/workflows/", body: `{"name":"a\u0000b"}`, status: 400, code: "validation_error"},
		{name: "NUL in schema", path: "/api/workflows/", body: `{"name":"n","schema":{"description":"\u0000"}}`, status: 400, code: "validation_error"},
		{name: "NUL in submission", path: start, body: `{"submission":{"a":"x\u0000"}}`, status: 400, code: "validation_error"},
		{name: "NUL in submission key", path: start, body: `{"submission":{"\u0000":1}}`, status: 400, code: "validation_error"},
		{name: "NUL in metadata", path: start, body: `{"submission":1,"metadata":{"a":"\u0000"}}`, status: 400, code: "validation_error"},
		{name: "NUL in submission, with key", path: start, body: `{"submission":"\u0000"}`, headers: []string{"Idempotency-Key", "nul"}, status: 400, code: "validation_error"},
		{name: "escaped backslash-u is not NUL", path: start, body: `{"submission":"\\u0000"}`, status: 201},
		// The key row stores the User-Agent and path: headers and paths may carry any byte.
		{name: "User-Agent not UTF-8, with key", path: "/api/workflows/", body: `{"name":"ua"}`, headers: []string{"Idempotency-Key", "ua-latin1", "User-Agent", "caf\xe9"}, status: 201},
		{name: "long User-Agent cut inside a character, with key", path: "/api/workflows/", body: `{"name":"ua"}`, headers: []string{"Idempotency-Key", "ua-long", "User-Agent", strings.Repeat("a", 999) + "é"}, status: 201},
		{name: "very long User-Agent, with key", path: "/api/workflows/", body: `{"name":"ua"}`, headers: []string{"Idempotency-Key", "ua-5000", "User-Agent", strings.Repeat("u", 5000)}, status: 201},
		{name: "path not UTF-8, with key", path: "/api/workflows/%ff/start/", body: `{"submission":1}`, headers: []string{"Idempotency-Key", "path-ff"}, status: 404, code: "not_found"},
		{name: "path over 2000 characters, with key", path: "/api/workflows/" + strings.Repeat("x", 2100) + "/start/", body: `{"submission":1}`, headers: []string{"Idempotency-Key", "path-long"}, status: 404, code: "not_found"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := e.Do(http.MethodPost, tt.path, org.Token, tt.body, tt.headers...)
			require.Less(t, r.Status, 500, "%s", r.Body)
			if tt.code != "" {
				requireProblem(t, r, tt.status, tt.code)
				return
			}
			require.Equal(t, tt.status, r.Status, "%s", r.Body)
		})
	}
}

func TestDatabaseDown(t *testing.T) {
	t.Parallel()
	e := apitest.New(t) // the token cache on, as in production: requests get past authentication
	org := e.NewOrg("Acme")
	wf := e.NewWorkflow(org, map[string]any{"name": "wf"})
	require.Equal(t, http.StatusOK, e.Do(http.MethodGet, "/readyz", "", nil).Status)

	// Take the database away as a restart does: its connections end
	// (57P01) and new ones are refused, until it is back.
	admin, err := sql.Open("pgx", withDatabase(t, e.DBURL, "postgres"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = admin.Close() })
	var name string
	require.NoError(t, e.DB.Raw(`SELECT current_database()`).Scan(&name).Error)
	setAllowed := func(allowed bool) {
		_, err := admin.Exec(fmt.Sprintf(`ALTER DATABASE %s WITH ALLOW_CONNECTIONS %t`, pgx.Identifier{name}.Sanitize(), allowed))
		require.NoError(t, err)
	}
	setAllowed(false)
	t.Cleanup(func() { setAllowed(true) })
	_, err = admin.Exec(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1`, name)
	require.NoError(t, err)

	r := e.Do(http.MethodGet, "/healthz", "", nil)
	require.Equal(t, http.StatusOK, r.Status, "liveness does not depend on the database")
	for _, tc := range []struct {
		name   string
		method string
		path   string
		body   any
		key    string
	}{
		{"readiness", http.MethodGet, "/readyz", nil, ""},
		{"a read", http.MethodGet, "/api/workflows/", nil, ""},
		{"a start with a key", http.MethodPost, "/api/workflows/" + wf + "/start", `{"submission":1}`, "down-1"},
		{"a start without a key", http.MethodPost, "/api/workflows/" + wf + "/start", `{"submission":1}`, ""},
	} {
		var headers []string
		if tc.key != "" {
			headers = []string{"Idempotency-Key", tc.key}
		}
		token := org.Token
		if tc.path == "/readyz" {
			token = ""
		}
		r := e.Do(tc.method, tc.path, token, tc.body, headers...)
		requireProblem(t, r, http.StatusServiceUnavailable, "service_unavailable")
		require.Equal(t, "1", r.Header.Get("Retry-After"), "%s: a 503 says when to retry", tc.name)
	}

	// Back: the retry with the same key executes, once.
	setAllowed(true)
	r = e.Do(http.MethodPost, "/api/workflows/"+wf+"/start", org.Token, `{"submission":1}`, "Idempotency-Key", "down-1")
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	require.Empty(t, r.Header.Get("Idempotent-Replayed"), "nothing was stored while the database was down")
	require.EqualValues(t, 1, e.Count("validation_runs", ""))
	require.Equal(t, http.StatusOK, e.Do(http.MethodGet, "/readyz", "", nil).Status)
}

// withDatabase is url with another database name.
func withDatabase(t *testing.T, raw, name string) string {
	t.Helper()
	u, err := url.Parse(raw)
	require.NoError(t, err)
	u.Path = "/" + name
	return u.String()
}
