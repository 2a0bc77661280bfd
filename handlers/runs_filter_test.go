package handlers_test

import (
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/handlers"
	"github.com/valruns/valruns/internal/apitest"
	"github.com/valruns/valruns/models"
)

// supportRun inserts a run of the workflow straight in the database, in
// status, created at, listed as unfinished when it is not final (as a
// start and an end leave it), and returns its id.
func supportRun(t *testing.T, e *apitest.Env, org apitest.Org, wf, status string, at time.Time) string {
	t.Helper()
	var id string
	require.NoError(t, e.DB.Raw(`INSERT INTO validation_runs (id, org_id, workflow_id, status, submission, metadata, created_at, finished_at, findings, error)
		VALUES (?, ?, ?, ?, '{}', '{}', ?, CASE WHEN ? IN ('passed', 'failed', 'error') THEN now() END,
			CASE WHEN ? IN ('passed', 'failed', 'error') THEN '[]'::json END, CASE WHEN ? = 'error' THEN 'boom' END)
		RETURNING id`, models.NewRunID(), org.ID, wf, status, at, status, status, status).Scan(&id).Error)
	if status == models.RunQueued || status == models.RunRunning {
		require.NoError(t, e.DB.Exec(`INSERT INTO unfinished_runs (id) VALUES (?)`, id).Error)
	}
	return id
}

// listRunIDs follows next_cursor from query and returns every run id
// listed, in order, and how many pages it took.
func listRunIDs(t *testing.T, e *apitest.Env, org apitest.Org, query string) (ids []string, pages int) {
	t.Helper()
	cursor := ""
	for {
		q := query
		if cursor != "" {
			q += "&cursor=" + url.QueryEscape(cursor)
		}
		r := e.Do(http.MethodGet, "/api/runs/?"+q, org.Token, nil)
		require.Equal(t, http.StatusOK, r.Status, "%s: %s", q, r.Body)
		var page handlers.RunList
		r.JSON(t, &page)
		pages++
		for _, run := range page.Data {
			ids = append(ids, run.ID)
		}
		if page.NextCursor == "" {
			return ids, pages
		}
		cursor = page.NextCursor
	}
}

// GET /api/runs/ filters by status and creation time, with workflow_id and
// with the cursor: every page holds only what the filters let through, and
// following the cursor lists each such run once, newest first. Another
// organisation sees none of it, even with the workflow's id; a bad value is
// a 400 naming its parameter.
func TestRunListFilters(t *testing.T) {
	t.Parallel()
	e := apitest.New(t)
	acme, other := e.NewOrg("Acme"), e.NewOrg("Other")
	wfA, wfB := e.NewWorkflow(acme, exWorkflowBody), e.NewWorkflow(acme, exWorkflowBody)
	otherWF := e.NewWorkflow(other, exWorkflowBody)
	t0 := time.Date(2026, 11, 1, 10, 0, 0, 0, time.UTC)
	statuses := []string{models.RunPassed, models.RunFailed, models.RunQueued, models.RunError, models.RunRunning, models.RunFailed}
	type made struct{ id, wf, status string }
	var runs []made // oldest first
	for i := range 30 {
		wf := wfA
		if i%3 == 0 {
			wf = wfB
		}
		st := statuses[i%len(statuses)]
		runs = append(runs, made{supportRun(t, e, acme, wf, st, t0.Add(time.Duration(i)*time.Minute)), wf, st})
	}
	supportRun(t, e, other, otherWF, models.RunFailed, t0.Add(90*time.Second))
	want := func(keep func(i int, r made) bool) []string {
		var out []string
		for i := len(runs) - 1; i >= 0; i-- {
			if keep(i, runs[i]) {
				out = append(out, runs[i].id)
			}
		}
		return out
	}
	at := func(i int) string { return t0.Add(time.Duration(i) * time.Minute).Format(time.RFC3339) }

	for _, tt := range []struct {
		name, query string
		keep        func(i int, r made) bool
	}{
		{"all", "limit=7", func(int, made) bool { return true }},
		{"failed", "status=failed&limit=2", func(_ int, r made) bool { return r.status == models.RunFailed }},
		{"passed", "status=passed", func(_ int, r made) bool { return r.status == models.RunPassed }},
		{"error", "status=error&limit=1", func(_ int, r made) bool { return r.status == models.RunError }},
		{"queued", "status=queued&limit=2", func(_ int, r made) bool { return r.status == models.RunQueued }},
		{"running", "status=running&limit=3", func(_ int, r made) bool { return r.status == models.RunRunning }},
		{"failed of one workflow", "status=failed&limit=1&workflow_id=" + wfB, func(_ int, r made) bool {
			return r.status == models.RunFailed && r.wf == wfB
		}},
		{"queued of one workflow", "status=queued&workflow_id=" + wfA, func(_ int, r made) bool {
			return r.status == models.RunQueued && r.wf == wfA
		}},
		{"created after (exclusive)", "limit=4&created_after=" + at(20), func(i int, _ made) bool { return i > 20 }},
		{"created before (exclusive)", "limit=4&created_before=" + at(5), func(i int, _ made) bool { return i < 5 }},
		{"a window, failed, other offset", "status=failed&limit=1&created_after=" + url.QueryEscape(t0.Add(5*time.Minute).In(time.FixedZone("", 2*3600)).Format(time.RFC3339)) +
			"&created_before=" + at(25), func(i int, r made) bool { return i > 5 && i < 25 && r.status == models.RunFailed }},
		{"a window, running, one workflow", "status=running&workflow_id=" + wfA + "&created_after=" + at(3) + "&created_before=" + at(29),
			func(i int, r made) bool { return i > 3 && i < 29 && r.status == models.RunRunning && r.wf == wfA }},
		{"nothing in the window", "status=passed&created_after=" + at(40), func(int, made) bool { return false }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, _ := listRunIDs(t, e, acme, tt.query)
			w := want(tt.keep)
			if w == nil {
				w = []string{}
			}
			if got == nil {
				got = []string{}
			}
			require.Equal(t, w, got)
		})
	}

	// Every run on a filtered page is in the status asked for.
	r := e.Do(http.MethodGet, "/api/runs/?status=failed", acme.Token, nil)
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	var page handlers.RunList
	r.JSON(t, &page)
	require.NotEmpty(t, page.Data)
	for _, run := range page.Data {
		require.Equal(t, models.RunFailed, run.Status)
	}

	// Another organisation: its own failed run only; acme's workflow is no one's.
	got, _ := listRunIDs(t, e, other, "status=failed")
	require.Len(t, got, 1)
	got, _ = listRunIDs(t, e, other, "status=failed&workflow_id="+wfA)
	require.Empty(t, got)
	got, _ = listRunIDs(t, e, acme, "workflow_id="+otherWF)
	require.Empty(t, got)

	for _, tt := range []struct{ query, field string }{
		{"status=done", "status"},
		{"status=", "status"},
		{"status=FAILED", "status"},
		{"created_after=yesterday", "created_after"},
		{"created_after=2026-11-01", "created_after"},
		{"created_after=" + at(5) + "%2B24:00", "created_after"},
		{"created_after=", "created_after"},
		{"created_before=2026-13-01T00:00:00Z", "created_before"},
		{"created_before=1700000000", "created_before"},
		{"created_after=" + at(5) + "&created_before=" + at(5), "created_before"},
		{"created_after=" + at(6) + "&created_before=" + at(5), "created_before"},
		{"workflow_id=nope&status=failed", "workflow_id"},
		{"status=failed&limit=0", "limit"},
	} {
		t.Run("bad "+tt.query, func(t *testing.T) {
			r := e.Do(http.MethodGet, "/api/runs/?"+tt.query, acme.Token, nil)
			require.Equal(t, http.StatusBadRequest, r.Status, "%s", r.Body)
			require.Equal(t, "validation_error", r.Map(t)["code"])
			require.Contains(t, string(r.Body), `"field":"`+tt.field+`"`)
			require.Contains(t, r.Map(t)["detail"], tt.field)
		})
	}
	bad := e.Do(http.MethodGet, "/api/runs/?status=failed&cursor=nope", acme.Token, nil)
	require.Equal(t, http.StatusBadRequest, bad.Status, "%s", bad.Body)
	require.Equal(t, "invalid_cursor", bad.Map(t)["code"])
}

// The time filters read RFC 3339 as it is written (lower-case t and z, a
// leap second, any offset of hours 00-23), refuse what it is not (+24:00),
// and take a bound sent as a bound: the zero time too, which was taken for
// no bound (created_before=0001-01-01T00:00:00Z listed every run). Both
// bounds are exclusive, to the nanosecond, and a pair with no time between
// them is a 400 however it is spelled.
func TestRunListTimeFilters(t *testing.T) {
	t.Parallel()
	e := apitest.New(t)
	org := e.NewOrg("acme")
	wf := e.NewWorkflow(org, exWorkflowBody)
	leap := time.Date(2017, 1, 1, 0, 0, 0, 0, time.UTC) // 2016-12-31T23:59:60Z is the instant before it, in UTC's count
	before := supportRun(t, e, org, wf, models.RunPassed, leap.Add(-time.Second))
	at := supportRun(t, e, org, wf, models.RunPassed, leap)
	after := supportRun(t, e, org, wf, models.RunPassed, leap.Add(time.Second))
	all := []string{after, at, before}

	for _, tt := range []struct {
		query string
		want  []string
	}{
		{"created_before=0001-01-01T00:00:00Z", nil},
		{"created_before=0000-01-01T00:00:00Z", nil},
		{"created_after=0001-01-01T00:00:00Z", all},
		{"created_after=0000-01-01T00:00:00Z", all},
		{"created_after=0001-01-01T00:00:00Z&created_before=9999-12-31T23:59:60Z", all},
		{"created_before=2016-12-31T23:59:60Z", []string{before}},
		{"created_after=2016-12-31T23:59:60Z", []string{after}},
		{"created_after=2016-12-31T23:59:59z", []string{after, at}},
		{"created_after=2016-12-31t23:59:59Z", []string{after, at}},
		{"created_before=2017-01-01t00:00:01z", []string{at, before}},
		{"created_after=2017-01-01T23:58:59%2B23:59", []string{after, at}},
		{"created_after=2016-12-31T00:01:00-23:59", []string{after}},
		{"created_after=2016-12-31T23:59:59-00:00", []string{after, at}},
		// Within a microsecond of a run: its time is whole microseconds,
		// the bounds are not rounded to them.
		{"created_before=2017-01-01T00:00:00.0000005Z", []string{at, before}},
		{"created_before=2017-01-01T00:00:00.000000001Z", []string{at, before}},
		{"created_before=2017-01-01T00:00:00.000000000Z", []string{before}},
		{"created_after=2016-12-31T23:59:59.9999995Z", []string{after, at}},
		{"created_after=2016-12-31T23:59:59.999999999Z", []string{after, at}},
		{"created_after=2017-01-01T00:00:00.0000001Z", []string{after}},
		{"created_after=2016-12-31T23:59:59.9999995Z&created_before=2017-01-01T00:00:00.0000005Z", []string{at}},
		{"created_after=2017-01-01T00:00:00Z&created_before=2017-01-01T00:00:00.000000001Z", nil},
	} {
		got, _ := listRunIDs(t, e, org, tt.query)
		require.Equal(t, tt.want, got, tt.query)
	}

	for _, tt := range []struct{ query, field string }{
		{"created_after=0001-01-01T00:00:00Z&created_before=0001-01-01T00:00:00Z", "created_before"},
		{"created_after=2017-01-01T00:00:00Z&created_before=2016-12-31T23:59:60Z", "created_before"},
		{"created_after=2017-01-01T01:00:00%2B01:00&created_before=2017-01-01T00:00:00z", "created_before"},
		{"created_after=2017-01-01T00:00:00.000000001Z&created_before=2017-01-01T00:00:00Z", "created_before"},
		{"created_after=2017-01-01T00:00:00%2B24:00", "created_after"},
		{"created_before=2017-01-01T00:00:00-24:00", "created_before"},
		{"created_before=2017-01-01T00:00:00%2B01:60", "created_before"},
		{"created_before=2017-01-01T24:00:00Z", "created_before"},
		{"created_before=2017-01-01T00:00:61Z", "created_before"},
		{"created_before=2017-02-29T00:00:00Z", "created_before"},
		{"created_before=2017-01-01%2000:00:00Z", "created_before"},
		{"created_before=2017-01-01T00:00:00", "created_before"},
		{"created_before=", "created_before"},
		{"created_after=2017-01-01T00:00:00+01:00", "created_after"}, // + is a space in a query
		{"workflow_id=", "workflow_id"},
	} {
		r := e.Do(http.MethodGet, "/api/runs/?"+tt.query, org.Token, nil)
		p := requireProblem(t, r, http.StatusBadRequest, "validation_error")
		require.Contains(t, string(r.Body), `"field":"`+tt.field+`"`, tt.query)
		require.Contains(t, p["detail"], tt.field, tt.query)
	}
	plus := e.Do(http.MethodGet, "/api/runs/?created_after=2017-01-01T00:00:00+01:00", org.Token, nil)
	require.Contains(t, plus.Map(t)["detail"], "%2B", "the detail says how to send a +")
}

// A page filtered on a final status reads at most models.FinalScanBudget
// runs: an organisation whose one failed run is older than that many
// passed ones gets a page with none and a cursor, then the failed run.
// Following the cursor finds every run, each once.
func TestRunListFinalStatusIsBounded(t *testing.T) {
	t.Parallel()
	e := apitest.New(t)
	org := e.NewOrg("Acme")
	wf := e.NewWorkflow(org, exWorkflowBody)
	t0 := time.Date(2026, 11, 1, 10, 0, 0, 0, time.UTC)
	failed := supportRun(t, e, org, wf, models.RunFailed, t0)
	n := models.FinalScanBudget + 50
	require.NoError(t, e.DB.Exec(`INSERT INTO validation_runs (id, org_id, workflow_id, status, submission, metadata, created_at, finished_at, findings)
		SELECT gen_random_uuid(), ?, ?, 'passed', '{}', '{}', ?::timestamptz + i * interval '1 second', now(), '[]'
		FROM generate_series(1, ?) i`, org.ID, wf, t0, n).Error)

	r := e.Do(http.MethodGet, "/api/runs/?status=failed", org.Token, nil)
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	var first handlers.RunList
	r.JSON(t, &first)
	require.Empty(t, first.Data, "the page's scan ended at its budget")
	require.NotEmpty(t, first.NextCursor)
	ids, pages := listRunIDs(t, e, org, "status=failed")
	require.Equal(t, []string{failed}, ids)
	require.Equal(t, 2, pages)

	passed, _ := listRunIDs(t, e, org, "status=passed&limit=100")
	require.Len(t, passed, n)
	seen := map[string]bool{}
	for _, id := range passed {
		require.False(t, seen[id], "listed twice: %s", id)
		seen[id] = true
	}
}
