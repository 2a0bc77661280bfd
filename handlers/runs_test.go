package handlers_test

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/handlers"
	"github.com/valruns/valruns/internal/apitest"
	"github.com/valruns/valruns/models"
)

// startRun starts a run of wf with body and returns the decoded run.
func startRun(t *testing.T, e *apitest.Env, org apitest.Org, wf string, body any) handlers.Run {
	t.Helper()
	r := e.Do(http.MethodPost, "/api/workflows/"+wf+"/start/", org.Token, body)
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	var run handlers.Run
	r.JSON(t, &run)
	require.Equal(t, "/api/runs/"+run.ID+"/", r.Header.Get("Location"))
	return run
}

func TestStartAndReadRun(t *testing.T) {
	t.Parallel()
	e := apitest.New(t)
	acme := e.NewOrg("Acme")
	globex := e.NewOrg("Globex")
	wf := e.NewWorkflow(acme, map[string]any{"name": "invoice"})

	submission := `{"customer":"ACME","total":42.50,"lines":[{"sku":"a","qty":2}],"note":null}`
	r := e.Do(http.MethodPost, "/api/workflows/"+wf+"/start/", acme.Token,
		`{"submission":`+submission+`,"metadata":{"source":"test"}}`)
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	var started handlers.Run
	r.JSON(t, &started)
	require.NoError(t, uuid.Validate(started.ID))
	require.Equal(t, "/api/runs/"+started.ID+"/", r.Header.Get("Location"))
	require.Equal(t, wf, started.WorkflowID)
	require.Equal(t, "queued", started.Status)
	require.JSONEq(t, submission, string(started.Submission))
	require.JSONEq(t, `{"source":"test"}`, string(started.Metadata))
	require.Nil(t, started.Findings, "a queued run has no findings yet")
	require.NotContains(t, r.Map(t), "findings", "absent, not [] (which would read as: found nothing)")

	for _, path := range []string{"/api/runs/" + started.ID + "/", "/api/runs/" + started.ID} {
		g := e.Do(http.MethodGet, path, acme.Token, nil)
		require.Equal(t, http.StatusOK, g.Status, "%s", g.Body)
		var read handlers.Run
		g.JSON(t, &read)
		require.Equal(t, "queued", read.Status)
		require.JSONEq(t, submission, string(read.Submission), "submission echoed")
		require.JSONEq(t, `{"source":"test"}`, string(read.Metadata))
		require.Zero(t, read.Attempts)
		require.Nil(t, read.StartedAt)
		require.Nil(t, read.FinishedAt)
		require.Nil(t, read.Error)
		m := g.Map(t)
		require.NotContains(t, m, "findings", "not finished: no findings yet")
		require.NotContains(t, m, "error")
		if d := cmp.Diff(started, read, cmp.Comparer(func(a, b []byte) bool { return jsonEqual(a, b) })); d != "" {
			t.Fatalf("read differs from the start answer (-start +read):\n%s", d)
		}
	}

	// The start did its bookkeeping in the database.
	require.EqualValues(t, 1, e.Count("validation_runs", "id = ? AND org_id = ? AND status = 'queued'", started.ID, acme.ID))
	require.EqualValues(t, 1, e.Count("usage_slots", "org_id = ? AND runs = 1", acme.ID))
	require.EqualValues(t, 1, e.Count("audit_records", "org_id = ? AND subject_id = ? AND token_id IS NOT NULL AND request_id IS NOT NULL",
		acme.ID, started.ID), "the audit trail shows who started the run")

	t.Run("another organisation's run is 404", func(t *testing.T) {
		t.Parallel()
		requireProblem(t, e.Do(http.MethodGet, "/api/runs/"+started.ID+"/", globex.Token, nil), http.StatusNotFound, "not_found")
	})
	t.Run("unknown run is 404", func(t *testing.T) {
		t.Parallel()
		requireProblem(t, e.Do(http.MethodGet, "/api/runs/"+uuid.NewString()+"/", acme.Token, nil), http.StatusNotFound, "not_found")
	})
	t.Run("malformed run id is 404", func(t *testing.T) {
		t.Parallel()
		requireProblem(t, e.Do(http.MethodGet, "/api/runs/not-a-uuid/", acme.Token, nil), http.StatusNotFound, "not_found")
	})
	t.Run("no metadata is {}", func(t *testing.T) {
		t.Parallel()
		run := startRun(t, e, acme, wf, map[string]any{"submission": []any{1, "two"}})
		require.JSONEq(t, `[1,"two"]`, string(run.Submission))
		require.JSONEq(t, `{}`, string(run.Metadata))
	})
	t.Run("null metadata is {}", func(t *testing.T) {
		t.Parallel()
		run := startRun(t, e, acme, wf, `{"submission":"just a string","metadata":null}`)
		require.JSONEq(t, `"just a string"`, string(run.Submission))
		require.JSONEq(t, `{}`, string(run.Metadata))
	})
	t.Run("start without trailing slash", func(t *testing.T) {
		t.Parallel()
		r := e.Do(http.MethodPost, "/api/workflows/"+wf+"/start", acme.Token, map[string]any{"submission": 1})
		require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	})
}

// listIDs pages through a newest-first listing at path (with query q) and
// returns the ids in the order served and the size of each page.
func listIDs(t *testing.T, e *apitest.Env, org apitest.Org, path string, q url.Values) (ids []string, pages []int) {
	t.Helper()
	q = maps.Clone(q)
	for range 100 {
		r := e.Do(http.MethodGet, path+"?"+q.Encode(), org.Token, nil)
		require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
		var page struct {
			Data []struct {
				ID string `json:"id"`
			} `json:"data"`
			NextCursor string `json:"next_cursor"`
		}
		r.JSON(t, &page)
		require.NotNil(t, page.Data, "data is a list, never null")
		pages = append(pages, len(page.Data))
		for _, item := range page.Data {
			ids = append(ids, item.ID)
		}
		if page.NextCursor == "" {
			require.NotContains(t, string(r.Body), "next_cursor", "no next_cursor member on the last page")
			return ids, pages
		}
		q.Set("cursor", page.NextCursor)
	}
	t.Fatal("pagination does not end")
	return nil, nil
}

// Findings show on a run once it has finished, [] when it found nothing; a
// run still queued has none yet, and list items never carry them (a failed
// run in a list must not read as "no findings").
func TestFindingsShownOnceFinished(t *testing.T) {
	t.Parallel()
	e := apitest.New(t)
	org := e.NewOrg("acme")
	wf := e.NewWorkflow(org, map[string]any{"name": "wf"})
	runs := models.NewRunStore(e.DB)
	ctx := context.Background()
	finish := func(status string, findings ...models.Finding) string {
		id := startRun(t, e, org, wf, map[string]any{"submission": 1}).ID
		claimed, err := runs.Claim(ctx, id, time.Minute, 1)
		require.NoError(t, err)
		owned, err := runs.Finish(ctx, id, claimed.Attempts, status, findings)
		require.NoError(t, err)
		require.True(t, owned)
		return id
	}
	failed := finish("failed", models.Finding{Step: "schema", Severity: "error", Path: "/x", Message: "bad"})
	passed := finish("passed")
	queued := startRun(t, e, org, wf, map[string]any{"submission": 1}).ID

	read := func(id string) map[string]any {
		r := e.Do(http.MethodGet, "/api/runs/"+id, org.Token, nil)
		require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
		return r.Map(t)
	}
	require.Equal(t, []any{map[string]any{"step": "schema", "severity": "error", "path": "/x", "message": "bad"}}, read(failed)["findings"])
	require.Equal(t, []any{}, read(passed)["findings"], "finished, found nothing")
	require.NotContains(t, read(queued), "findings", "not finished yet")

	r := e.Do(http.MethodGet, "/api/runs/", org.Token, nil)
	require.Equal(t, http.StatusOK, r.Status)
	var page struct{ Data []map[string]any }
	r.JSON(t, &page)
	require.Len(t, page.Data, 3)
	for _, item := range page.Data {
		require.NotContains(t, item, "findings", "list items leave findings out: %v", item)
	}
}

func TestListRuns(t *testing.T) {
	t.Parallel()
	e := apitest.New(t)
	acme := e.NewOrg("Acme")
	globex := e.NewOrg("Globex")
	wf1 := e.NewWorkflow(acme, map[string]any{"name": "one"})
	wf2 := e.NewWorkflow(acme, map[string]any{"name": "two"})
	globexWF := e.NewWorkflow(globex, map[string]any{"name": "g"})

	var all, of1, of2 []string
	for i := range 7 {
		wf := wf1
		if i%3 == 2 {
			wf = wf2
		}
		run := startRun(t, e, acme, wf, map[string]any{"submission": map[string]any{"i": i}})
		all = append(all, run.ID)
		if wf == wf1 {
			of1 = append(of1, run.ID)
		} else {
			of2 = append(of2, run.ID)
		}
	}
	globexRun := startRun(t, e, globex, globexWF, map[string]any{"submission": 0}).ID
	for _, s := range [][]string{all, of1, of2} {
		slices.Reverse(s) // newest first
	}

	tests := []struct {
		name      string
		org       apitest.Org
		query     url.Values
		want      []string
		wantPages []int
	}{
		{"all, pages of 3", acme, url.Values{"limit": {"3"}}, all, []int{3, 3, 1}},
		{"all, default page", acme, url.Values{}, all, []int{7}},
		{"workflow one, pages of 2", acme, url.Values{"workflow_id": {wf1}, "limit": {"2"}}, of1, []int{2, 2, 1}},
		{"workflow two, pages of 2", acme, url.Values{"workflow_id": {wf2}, "limit": {"2"}}, of2, []int{2}},
		{"workflow two, pages of 1", acme, url.Values{"workflow_id": {wf2}, "limit": {"1"}}, of2, []int{1, 1}},
		{"other organisation", globex, url.Values{}, []string{globexRun}, []int{1}},
		{"other organisation, filtered on acme's workflow", globex, url.Values{"workflow_id": {wf1}}, nil, []int{0}},
		{"unknown workflow", acme, url.Values{"workflow_id": {uuid.NewString()}}, nil, []int{0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ids, pages := listIDs(t, e, tt.org, "/api/runs/", tt.query)
			if d := cmp.Diff(tt.want, ids); d != "" {
				t.Fatalf("run ids, newest first (-want +got):\n%s", d)
			}
			require.Equal(t, tt.wantPages, pages)
		})
	}

	t.Run("listed runs carry their fields but the large ones", func(t *testing.T) {
		t.Parallel()
		r := e.Do(http.MethodGet, "/api/runs/?limit=1&workflow_id="+wf1, acme.Token, nil)
		require.Equal(t, http.StatusOK, r.Status)
		var page handlers.RunList
		r.JSON(t, &page)
		require.Len(t, page.Data, 1)
		run := page.Data[0]
		require.Equal(t, all[0], run.ID)
		require.Equal(t, wf1, run.WorkflowID)
		require.Equal(t, "queued", run.Status)
		require.False(t, run.CreatedAt.IsZero())
		item := r.Map(t)["data"].([]any)[0].(map[string]any)
		require.NotContains(t, item, "submission", "read the run for it")
		require.NotContains(t, item, "metadata", "read the run for it")
	})

	bad := []struct{ query, code string }{
		{"workflow_id=not-a-uuid", "validation_error"},
		{"workflow_id=" + wf1 + "x", "validation_error"},
		{"limit=0", "validation_error"},
		{"limit=101", "validation_error"},
		{"cursor=garbage", "invalid_cursor"},
		// Not valid percent-encoding: a 400, not every workflow's runs or the first page.
		{"limit=5&workflow_id=%zz", "validation_error"},
		{"cursor=%%%not-a-cursor", "validation_error"},
	}
	for _, tt := range bad {
		t.Run(tt.query, func(t *testing.T) {
			t.Parallel()
			p := requireProblem(t, e.Do(http.MethodGet, "/api/runs/?"+tt.query, acme.Token, nil), http.StatusBadRequest, tt.code)
			if strings.HasPrefix(tt.query, "workflow_id") {
				require.Contains(t, p["detail"], "workflow_id")
			}
		})
	}
}

func TestStartRunInvalid(t *testing.T) {
	t.Parallel()
	e := apitest.New(t)
	acme := e.NewOrg("Acme")
	globex := e.NewOrg("Globex")
	wf := e.NewWorkflow(acme, map[string]any{"name": "wf"})
	globexWF := e.NewWorkflow(globex, map[string]any{"name": "theirs"})

	tests := []struct {
		name, path, body string
		status           int
		code             string
		// wantField is errors[0].field when set; wantDetail must appear in detail.
		wantField, wantDetail string
	}{
		{name: "missing submission", body: `{}`, status: 400, code: "validation_error", wantField: "submission", wantDetail: "submission"},
		{name: "only metadata", body: `{"metadata":{"a":1}}`, status: 400, code: "validation_error", wantField: "submission", wantDetail: "submission"},
		{name: "metadata an array", body: `{"submission":{},"metadata":[1]}`, status: 400, code: "validation_error", wantField: "metadata", wantDetail: "metadata"},
		{name: "metadata a string", body: `{"submission":{},"metadata":"x"}`, status: 400, code: "validation_error", wantField: "metadata", wantDetail: "metadata"},
		{name: "metadata a number", body: `{"submission":{},"metadata":5}`, status: 400, code: "validation_error", wantField: "metadata", wantDetail: "metadata"},
		{name: "metadata true", body: `{"submission":{},"metadata":true}`, status: 400, code: "validation_error", wantField: "metadata", wantDetail: "metadata"},
		{name: "unknown field", body: `{"submission":{},"submision":{}}`, status: 400, code: "validation_error", wantDetail: "submision"},
		{name: "body not an object", body: `[{"submission":{}}]`, status: 400, code: "invalid_json", wantDetail: "object"},
		{name: "malformed JSON", body: `{"submission":`, status: 400, code: "invalid_json"},
		{name: "empty body", body: ``, status: 400, code: "invalid_json", wantDetail: "empty"},
		{name: "another organisation's workflow", path: "/api/workflows/" + globexWF + "/start/", body: `{"submission":{}}`, status: 404, code: "not_found"},
		{name: "unknown workflow", path: "/api/workflows/" + uuid.NewString() + "/start/", body: `{"submission":{}}`, status: 404, code: "not_found"},
		{name: "malformed workflow id", path: "/api/workflows/not-a-uuid/start/", body: `{"submission":{}}`, status: 404, code: "not_found"},
		{name: "workflow id with SQL", path: "/api/workflows/1%27%20OR%20%271%27%3D%271/start/", body: `{"submission":{}}`, status: 404, code: "not_found"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			path := tt.path
			if path == "" {
				path = "/api/workflows/" + wf + "/start/"
			}
			r := e.Do(http.MethodPost, path, acme.Token, tt.body)
			p := requireProblem(t, r, tt.status, tt.code)
			require.Empty(t, r.Header.Get("Location"))
			if tt.wantDetail != "" {
				require.Contains(t, p["detail"], tt.wantDetail)
			}
			if tt.wantField != "" {
				errs, ok := p["errors"].([]any)
				require.True(t, ok, "errors member: %s", r.Body)
				require.Equal(t, tt.wantField, errs[0].(map[string]any)["field"])
			}
		})
	}
	t.Cleanup(func() {
		for _, table := range []string{"validation_runs", "usage_slots", "idempotency_keys"} {
			require.Zero(t, e.Count(table, ""), fmt.Sprintf("a refused start wrote to %s", table))
		}
	})
}
