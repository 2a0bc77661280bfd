package handlers_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/handlers"
	"github.com/valruns/valruns/internal/apitest"
	"github.com/valruns/valruns/validate"
)

func TestCreateWorkflow(t *testing.T) {
	t.Parallel()
	e := apitest.New(t)
	org := e.NewOrg("Acme")

	schema := `{"type":"object","required":["total"],"properties":{"total":{"type":"number"}}}`
	r := e.Do(http.MethodPost, "/api/workflows/", org.Token, `{
		"name": "  invoice  ",
		"schema": `+schema+`,
		"assertions": [
			{"name": "positive", "expr": "submission.total > 0"},
			{"name": "small", "expr": "submission.total < 10000", "severity": "warning", "message": "too large"},
			{"name": "tagged", "expr": "'source' in metadata", "severity": "info"}
		]
	}`)
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	require.True(t, strings.HasPrefix(r.Header.Get("Content-Type"), "application/json"))

	var got handlers.Workflow
	r.JSON(t, &got)
	require.NoError(t, uuid.Validate(got.ID))
	require.Equal(t, "/api/workflows/"+got.ID+"/", r.Header.Get("Location"))
	require.JSONEq(t, schema, string(got.Schema))
	require.False(t, got.CreatedAt.IsZero())
	require.WithinDuration(t, time.Now(), got.CreatedAt, time.Hour, "created_at is the creation time, not a placeholder")
	want := handlers.Workflow{
		ID:   got.ID,
		Name: "invoice",
		Assertions: []validate.Assertion{
			{Name: "positive", Expr: "submission.total > 0", Severity: "error", Message: "assertion positive failed"},
			{Name: "small", Expr: "submission.total < 10000", Severity: "warning", Message: "too large"},
			{Name: "tagged", Expr: "'source' in metadata", Severity: "info", Message: "assertion tagged failed"},
		},
		CreatedAt: got.CreatedAt,
	}
	if d := cmp.Diff(want, got, cmpopts.IgnoreFields(handlers.Workflow{}, "Schema")); d != "" {
		t.Fatalf("created workflow (-want +got):\n%s", d)
	}

	// What was stored is what was answered.
	g := e.Do(http.MethodGet, r.Header.Get("Location"), org.Token, nil)
	require.Equal(t, http.StatusOK, g.Status, "%s", g.Body)
	var read handlers.Workflow
	g.JSON(t, &read)
	if d := cmp.Diff(got, read, cmp.Comparer(func(a, b json.RawMessage) bool { return jsonEqual(a, b) })); d != "" {
		t.Fatalf("read back (-created +read):\n%s", d)
	}
	require.EqualValues(t, 1, e.Count("workflows", "org_id = ? AND name = 'invoice'", org.ID))

	t.Run("minimal", func(t *testing.T) {
		t.Parallel()
		r := e.Do(http.MethodPost, "/api/workflows", org.Token, map[string]any{"name": "bare"})
		require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
		m := r.Map(t)
		require.Equal(t, []any{}, m["assertions"], "assertions are [] rather than null")
		require.NotContains(t, m, "schema", "no schema, no schema member")
	})

	t.Run("null schema is no schema", func(t *testing.T) {
		t.Parallel()
		r := e.Do(http.MethodPost, "/api/workflows/", org.Token, `{"name":"nullschema","schema":null,"assertions":[]}`)
		require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
		require.NotContains(t, r.Map(t), "schema")
	})

	t.Run("200 characters", func(t *testing.T) {
		t.Parallel()
		name := strings.Repeat("é", 200) // 400 bytes: the limit is in characters
		r := e.Do(http.MethodPost, "/api/workflows/", org.Token, map[string]any{"name": name})
		require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
		require.Equal(t, name, r.Map(t)["name"])
	})
}

func jsonEqual(a, b []byte) bool {
	if len(a) == 0 || len(b) == 0 {
		return len(a) == len(b)
	}
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return cmp.Equal(x, y)
}

func TestCreateWorkflowInvalid(t *testing.T) {
	t.Parallel()
	e := apitest.New(t)
	org := e.NewOrg("Acme")

	tests := []struct {
		name string
		body string
		code string
		// wantField is errors[0].field; wantDetail must appear in detail.
		wantField  string
		wantDetail []string
	}{
		{name: "schema of the wrong type", body: `{"name":"w","schema":{"type":5}}`, code: "invalid_workflow", wantField: "schema", wantDetail: []string{"schema"}},
		{name: "schema not an object", body: `{"name":"w","schema":[1]}`, code: "invalid_workflow", wantField: "schema", wantDetail: []string{"schema"}},
		{name: "schema with a bad regex", body: `{"name":"w","schema":{"pattern":"("}}`, code: "invalid_workflow", wantField: "schema", wantDetail: []string{"schema"}},
		{name: "schema with a remote ref", body: `{"name":"w","schema":{"$ref":"https://example.com/s.json"}}`, code: "invalid_workflow", wantField: "schema", wantDetail: []string{"schema", "remote"}},
		{name: "CEL syntax error", body: `{"name":"w","assertions":[{"name":"broken","expr":"submission.total >"}]}`, code: "invalid_workflow", wantField: "assertions[0]", wantDetail: []string{"assertions[0]", "broken"}},
		{name: "CEL unknown variable", body: `{"name":"w","assertions":[{"name":"unknown_var","expr":"payload.total > 0"}]}`, code: "invalid_workflow", wantField: "assertions[0]", wantDetail: []string{"unknown_var", "payload"}},
		{name: "CEL not a bool", body: `{"name":"w","assertions":[{"name":"sum","expr":"1 + 2"}]}`, code: "invalid_workflow", wantField: "assertions[0]", wantDetail: []string{"sum", "bool"}},
		{name: "second assertion broken", body: `{"name":"w","assertions":[{"name":"ok","expr":"true"},{"name":"second","expr":"("}]}`, code: "invalid_workflow", wantField: "assertions[1]", wantDetail: []string{"assertions[1]", "second"}},
		{name: "unknown severity", body: `{"name":"w","assertions":[{"name":"sev","expr":"true","severity":"fatal"}]}`, code: "invalid_workflow", wantField: "assertions[0]", wantDetail: []string{"sev", "fatal"}},
		{name: "duplicate assertion names", body: `{"name":"w","assertions":[{"name":"d","expr":"true"},{"name":"d","expr":"false"}]}`, code: "invalid_workflow", wantField: "assertions[1]", wantDetail: []string{"duplicate"}},
		{name: "assertion without expr", body: `{"name":"w","assertions":[{"name":"empty","expr":""}]}`, code: "invalid_workflow", wantField: "assertions[0]", wantDetail: []string{"empty"}},
		{name: "missing name", body: `{"schema":{"type":"object"}}`, code: "validation_error", wantField: "name", wantDetail: []string{"name"}},
		{name: "blank name", body: `{"name":"   "}`, code: "validation_error", wantField: "name", wantDetail: []string{"name"}},
		{name: "name too long", body: `{"name":"` + strings.Repeat("n", 201) + `"}`, code: "validation_error", wantField: "name", wantDetail: []string{"200"}},
		{name: "name not a string", body: `{"name":5}`, code: "validation_error", wantDetail: []string{"name"}},
		{name: "assertions not a list", body: `{"name":"w","assertions":{"name":"a"}}`, code: "validation_error", wantDetail: []string{"assertions"}},
		{name: "unknown field", body: `{"name":"w","nmae":"typo"}`, code: "validation_error", wantDetail: []string{"nmae"}},
		{name: "unknown assertion field", body: `{"name":"w","assertions":[{"name":"a","expr":"true","level":"error"}]}`, code: "validation_error", wantDetail: []string{"level"}},
		{name: "not an object", body: `"w"`, code: "invalid_json", wantDetail: []string{"object"}},
		{name: "two objects", body: `{"name":"a"} {"name":"b"}`, code: "invalid_json"},
		{name: "malformed JSON", body: `{"name":"a",}`, code: "invalid_json"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := e.Do(http.MethodPost, "/api/workflows/", org.Token, tt.body)
			p := requireProblem(t, r, http.StatusBadRequest, tt.code)
			require.Empty(t, r.Header.Get("Location"))
			for _, s := range tt.wantDetail {
				require.Contains(t, p["detail"], s)
			}
			if tt.wantField != "" {
				errs, ok := p["errors"].([]any)
				require.True(t, ok, "errors member: %s", r.Body)
				require.NotEmpty(t, errs)
				first := errs[0].(map[string]any)
				require.Equal(t, tt.wantField, first["field"])
				require.NotEmpty(t, first["message"])
			}
		})
	}
	t.Cleanup(func() { require.Zero(t, e.Count("workflows", ""), "no invalid workflow was stored") })
}

func TestGetWorkflow(t *testing.T) {
	t.Parallel()
	e := apitest.New(t)
	acme := e.NewOrg("Acme")
	globex := e.NewOrg("Globex")
	wf := e.NewWorkflow(acme, map[string]any{"name": "wf"})

	tests := []struct {
		name  string
		token string
		path  string
		want  int
	}{
		{"own", acme.Token, "/api/workflows/" + wf + "/", http.StatusOK},
		{"own, no trailing slash", acme.Token, "/api/workflows/" + wf, http.StatusOK},
		{"own, upper-case id", acme.Token, "/api/workflows/" + strings.ToUpper(wf) + "/", http.StatusOK},
		{"another organisation's", globex.Token, "/api/workflows/" + wf + "/", http.StatusNotFound},
		{"malformed id", acme.Token, "/api/workflows/not-a-uuid/", http.StatusNotFound},
		{"id with trailing garbage", acme.Token, "/api/workflows/" + wf + "x/", http.StatusNotFound},
		{"unknown id", acme.Token, "/api/workflows/" + uuid.NewString() + "/", http.StatusNotFound},
		{"nil uuid", acme.Token, "/api/workflows/00000000-0000-0000-0000-000000000000/", http.StatusNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := e.Do(http.MethodGet, tt.path, tt.token, nil)
			if tt.want == http.StatusOK {
				require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
				require.Equal(t, wf, r.Map(t)["id"])
				return
			}
			requireProblem(t, r, tt.want, "not_found")
		})
	}
}

func TestListWorkflows(t *testing.T) {
	t.Parallel()
	e := apitest.New(t)
	acme := e.NewOrg("Acme")
	globex := e.NewOrg("Globex")
	empty := e.NewOrg("Empty")

	var created []string
	for i := range 25 {
		created = append(created, e.NewWorkflow(acme, map[string]any{"name": fmt.Sprintf("wf-%02d", i)}))
	}
	globexWFs := []string{
		e.NewWorkflow(globex, map[string]any{"name": "g1"}),
		e.NewWorkflow(globex, map[string]any{"name": "g2"}),
	}
	newestFirst := slices.Clone(created)
	slices.Reverse(newestFirst)

	t.Run("pages of 10", func(t *testing.T) {
		t.Parallel()
		ids, pages := listWorkflowIDs(t, e, acme, 10)
		require.Equal(t, []int{10, 10, 5}, pages)
		if d := cmp.Diff(newestFirst, ids); d != "" {
			t.Fatalf("ids, newest first, each once (-want +got):\n%s", d)
		}
	})

	t.Run("exact multiple of the page size", func(t *testing.T) {
		t.Parallel()
		ids, pages := listWorkflowIDs(t, e, acme, 5)
		require.Equal(t, []int{5, 5, 5, 5, 5}, pages)
		require.Equal(t, newestFirst, ids)
	})

	t.Run("one page holds all", func(t *testing.T) {
		t.Parallel()
		ids, pages := listWorkflowIDs(t, e, acme, 100)
		require.Equal(t, []int{25}, pages)
		require.Equal(t, newestFirst, ids)
	})

	t.Run("default page size is 20", func(t *testing.T) {
		t.Parallel()
		r := e.Do(http.MethodGet, "/api/workflows", acme.Token, nil)
		require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
		var page handlers.WorkflowList
		r.JSON(t, &page)
		require.Len(t, page.Data, 20)
		require.NotEmpty(t, page.NextCursor)
		require.Equal(t, newestFirst[0], page.Data[0].ID)
		require.Equal(t, "wf-24", page.Data[0].Name)
	})

	t.Run("each organisation sees its own", func(t *testing.T) {
		t.Parallel()
		ids, _ := listWorkflowIDs(t, e, globex, 10)
		require.Equal(t, []string{globexWFs[1], globexWFs[0]}, ids)

		r := e.Do(http.MethodGet, "/api/workflows/", empty.Token, nil)
		require.Equal(t, http.StatusOK, r.Status)
		require.JSONEq(t, `{"data":[]}`, string(r.Body))
	})

	t.Run("another organisation's cursor shows nothing of the other", func(t *testing.T) {
		t.Parallel()
		r := e.Do(http.MethodGet, "/api/workflows/?limit=1", acme.Token, nil)
		var page handlers.WorkflowList
		r.JSON(t, &page)
		require.NotEmpty(t, page.NextCursor)
		r = e.Do(http.MethodGet, "/api/workflows/?cursor="+url.QueryEscape(page.NextCursor), empty.Token, nil)
		require.Equal(t, http.StatusOK, r.Status)
		require.JSONEq(t, `{"data":[]}`, string(r.Body))
	})

	bad := []struct {
		query, code string
	}{
		{"limit=0", "validation_error"},
		{"limit=101", "validation_error"},
		{"limit=-1", "validation_error"},
		{"limit=abc", "validation_error"},
		{"limit=1.5", "validation_error"},
		{"cursor=garbage", "invalid_cursor"},
		// Not valid percent-encoding: a 400, not the first page as if no cursor were sent.
		{"limit=1&cursor=%%%not-a-cursor", "validation_error"},
		{"cursor=%zz", "validation_error"},
		{"limit=1;cursor=x", "validation_error"},
		{"cursor=" + url.QueryEscape("not base64!"), "invalid_cursor"},
		{"cursor=bm90LWEtY3Vyc29y", "invalid_cursor"},                           // base64 of "not-a-cursor"
		{"cursor=MjAyNi0wMS0wMVQwMDowMDowMFp8bm90LWEtdXVpZA", "invalid_cursor"}, // a time and "not-a-uuid"
	}
	for _, tt := range bad {
		t.Run(tt.query, func(t *testing.T) {
			t.Parallel()
			r := e.Do(http.MethodGet, "/api/workflows/?"+tt.query, acme.Token, nil)
			requireProblem(t, r, http.StatusBadRequest, tt.code)
		})
	}
}

func TestWorkflowRoutesTrailingSlash(t *testing.T) {
	t.Parallel()
	e := apitest.New(t)
	org := e.NewOrg("Acme")
	wf := e.NewWorkflow(org, map[string]any{"name": "wf"})

	for _, path := range []string{
		"/api/workflows", "/api/workflows/",
		"/api/workflows/" + wf, "/api/workflows/" + wf + "/",
		"/api/runs", "/api/runs/",
	} {
		t.Run(path, func(t *testing.T) {
			t.Parallel()
			r := e.Do(http.MethodGet, path, org.Token, nil)
			require.Equal(t, http.StatusOK, r.Status, "no 301/307: %s", r.Body)
			require.Empty(t, r.Header.Get("Location"), "no redirect")
		})
	}
	for _, path := range []string{"/api/workflows", "/api/workflows/"} {
		t.Run("POST "+path, func(t *testing.T) {
			t.Parallel()
			r := e.Do(http.MethodPost, path, org.Token, map[string]any{"name": "via " + path})
			require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
			require.True(t, strings.HasSuffix(r.Header.Get("Location"), "/"))
		})
	}
}

// listWorkflowIDs pages through /api/workflows/ limit at a time.
func listWorkflowIDs(t *testing.T, e *apitest.Env, org apitest.Org, limit int) (ids []string, pages []int) {
	t.Helper()
	return listIDs(t, e, org, "/api/workflows/", url.Values{"limit": {fmt.Sprint(limit)}})
}
