package handlers_test

import (
	"encoding/base64"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/idempotency"
	"github.com/valruns/valruns/internal/apitest"
	"github.com/valruns/valruns/models"
)

// idForms spells a UUID in every form uuid.Parse accepts, the canonical one
// first.
func idForms(id string) map[string]string {
	plain := strings.ReplaceAll(id, "-", "")
	return map[string]string{
		"canonical":       id,
		"upper":           strings.ToUpper(id),
		"braces":          "{" + id + "}",
		"braces upper":    "{" + strings.ToUpper(id) + "}",
		"no dashes":       plain,
		"no dashes upper": strings.ToUpper(plain),
		"urn":             "urn:uuid:" + id,
		"urn upper":       "URN:UUID:" + strings.ToUpper(id),
		"urn mixed":       "Urn:Uuid:" + id,
	}
}

// Every id-taking route and query parameter parses the id once, at the
// edge, into its canonical form: each form uuid.Parse accepts answers as
// the canonical one does (the urn:uuid: form was a 500, SQLSTATE 25P02, on
// every retry), and no form is a 5xx.
func TestIDFormsAnswerAsTheCanonicalForm(t *testing.T) {
	t.Parallel()
	e := apitest.New(t)
	org := e.NewOrg("acme")
	wf := e.NewWorkflow(org, map[string]any{"name": "wf"})
	first := e.Do(http.MethodPost, "/api/workflows/"+wf+"/start/", org.Token, `{"submission":1}`, idempotency.HeaderKey, "ids-canonical")
	require.Equal(t, http.StatusCreated, first.Status, "%s", first.Body)
	run := first.Map(t)["id"].(string)
	missing := "0b7d3c1e-8a2f-4c55-9a51-0d6f3f1c2b7a"

	// what a read answers, without what differs per request
	norm := func(r apitest.Response) string { return r.Header.Get("Content-Type") + " " + string(r.Body) }
	get := func(path string) apitest.Response {
		t.Helper()
		r := e.Do(http.MethodGet, path, org.Token, nil)
		require.Less(t, r.Status, 500, "GET %s: %s", path, r.Body)
		return r
	}
	want := map[string]apitest.Response{}
	for _, id := range []string{wf, run, missing} {
		want["wf "+id] = get("/api/workflows/" + id + "/")
		want["run "+id] = get("/api/runs/" + id + "/")
		want["list "+id] = get("/api/runs/?workflow_id=" + id)
	}
	require.Equal(t, http.StatusOK, want["wf "+wf].Status)
	require.Equal(t, http.StatusOK, want["run "+run].Status)
	require.Contains(t, string(want["list "+wf].Body), run)

	for _, id := range []string{wf, run, missing} {
		for name, form := range idForms(id) {
			t.Run(name+" "+id, func(t *testing.T) {
				esc := url.PathEscape(form)
				for _, tt := range []struct{ want, path string }{
					{"wf " + id, "/api/workflows/" + esc + "/"},
					{"wf " + id, "/api/workflows/" + esc},
					{"run " + id, "/api/runs/" + esc + "/"},
					{"list " + id, "/api/runs/?workflow_id=" + url.QueryEscape(form)},
				} {
					r := get(tt.path)
					w := want[tt.want]
					require.Equal(t, w.Status, r.Status, "GET %s: %s", tt.path, r.Body)
					if r.Status == http.StatusOK {
						require.Equal(t, norm(w), norm(r), "GET %s", tt.path)
					}
				}
			})
		}
	}

	// Starts: the same key on any form of the workflow id is the same
	// request (a replay of the first answer); a new key on any form starts
	// a run of that workflow; any form of an unknown workflow is a 404,
	// stored and replayed like the canonical form's.
	var runs int64 = 1
	for name, form := range idForms(wf) {
		path := "/api/workflows/" + url.PathEscape(form) + "/start/"
		r := e.Do(http.MethodPost, path, org.Token, `{"submission":1}`, idempotency.HeaderKey, "ids-canonical")
		require.Equal(t, http.StatusCreated, r.Status, "%s: %s", name, r.Body)
		require.Equal(t, "true", r.Header.Get(idempotency.HeaderReplayed), name)
		require.Equal(t, first.Body, r.Body, name)

		for range 2 { // a retry gets the same run
			r = e.Do(http.MethodPost, path, org.Token, `{"submission":2}`, idempotency.HeaderKey, "ids-form-"+name)
			require.Equal(t, http.StatusCreated, r.Status, "%s: %s", name, r.Body)
			require.Equal(t, wf, r.Map(t)["workflow_id"], name)
		}
		runs++
		r = e.Do(http.MethodPost, path, org.Token, `{"submission":3}`)
		require.Equal(t, http.StatusCreated, r.Status, "%s without a key: %s", name, r.Body)
		runs++
	}
	require.EqualValues(t, runs, e.Count("validation_runs", "workflow_id = ?", wf))
	gone := e.Do(http.MethodPost, "/api/workflows/"+missing+"/start/", org.Token, `{"submission":1}`, idempotency.HeaderKey, "ids-missing")
	require.Equal(t, http.StatusNotFound, gone.Status, "%s", gone.Body)
	for name, form := range idForms(missing) {
		r := e.Do(http.MethodPost, "/api/workflows/"+url.PathEscape(form)+"/start/", org.Token, `{"submission":1}`, idempotency.HeaderKey, "ids-missing")
		require.Equal(t, http.StatusNotFound, r.Status, "%s: %s", name, r.Body)
		require.Equal(t, "true", r.Header.Get(idempotency.HeaderReplayed), name)
	}
}

// A list's cursor carries an id too, and is parsed at the edge as a path's
// id is: its id in any form uuid.Parse accepts answers as the canonical
// one does (the urn:uuid: form reached PostgreSQL and came back as a 500
// with Retry-After, so clients retried it forever), and a cursor that is
// not one this API could have returned, in any of its parts, is a 400
// invalid_cursor on every list, never a 5xx.
func TestCursorIDForms(t *testing.T) {
	t.Parallel()
	e := apitest.New(t)
	org := e.NewOrg("acme")
	wf := e.NewWorkflow(org, exWorkflowBody)
	e.NewWorkflow(org, map[string]any{"name": "wf-2"})
	for i := range 4 {
		r := e.Do(http.MethodPost, "/api/workflows/"+wf+"/start/", org.Token, `{"submission":{"customer":"","total":-5}}`)
		require.Equal(t, http.StatusCreated, r.Status, "start %d: %s", i, r.Body)
		if i < 2 { // two failed runs, for a list filtered on a final status
			require.Equal(t, models.RunFailed, exExecute(t, e, r.Map(t)["id"].(string)))
		}
	}
	var hook string
	for i := range 2 {
		r := e.Do(http.MethodPost, "/api/webhook-endpoints/", org.Token, `{"url":"https://example.com/hooks"}`)
		require.Equal(t, http.StatusCreated, r.Status, "endpoint %d: %s", i, r.Body)
		hook = r.Map(t)["id"].(string)
	}
	for i := range 2 {
		r := e.Do(http.MethodPost, "/api/webhook-endpoints/"+hook+"/test/", org.Token, nil)
		require.Equal(t, http.StatusAccepted, r.Status, "test event %d: %s", i, r.Body)
	}

	lists := map[string]string{
		"runs":       "/api/runs/?limit=1",
		"runs of wf": "/api/runs/?limit=1&workflow_id=" + wf,
		"failed":     "/api/runs/?limit=1&status=failed",
		"queued":     "/api/runs/?limit=1&status=queued",
		"workflows":  "/api/workflows/?limit=1",
		"endpoints":  "/api/webhook-endpoints/?limit=1",
		"deliveries": "/api/webhook-endpoints/" + hook + "/deliveries/?limit=1",
	}
	enc := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	for name, list := range lists {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			first := e.Do(http.MethodGet, list, org.Token, nil)
			require.Equal(t, http.StatusOK, first.Status, "%s", first.Body)
			next, _ := first.Map(t)["next_cursor"].(string)
			require.NotEmpty(t, next, "%s: no next page to follow", list)
			want := e.Do(http.MethodGet, list+"&cursor="+url.QueryEscape(next), org.Token, nil)
			require.Equal(t, http.StatusOK, want.Status, "%s", want.Body)

			raw, err := base64.RawURLEncoding.DecodeString(next)
			require.NoError(t, err)
			at, id, ok := strings.Cut(string(raw), "|")
			require.True(t, ok, "cursor %q", raw)
			for form, spelled := range idForms(id) {
				r := e.Do(http.MethodGet, list+"&cursor="+url.QueryEscape(enc(at+"|"+spelled)), org.Token, nil)
				require.Equal(t, http.StatusOK, r.Status, "%s: %s", form, r.Body)
				require.Equal(t, string(want.Body), string(r.Body), form)
			}

			for _, bad := range []string{
				"garbage",
				enc(at),                                // no id
				enc(at + "|"),                          // an empty id
				enc("|" + id),                          // no time
				enc(at + "|" + id + "|" + id),          // a third part
				enc(at + "|" + id + "x"),               // not a UUID
				enc(at + "|urn:uuid:" + id + "\x00"),   // a NUL
				enc(at + "|" + id + " "),               // a space
				enc(at + "|" + id + "'"),               // a quote
				enc("2026-13-01T00:00:00Z|" + id),      // no such month
				enc("2026-01-01T00:00:00+24:00|" + id), // no such offset
				enc("2026-01-01 00:00:00Z|" + id),      // not RFC 3339
				enc("20260101T000000Z|" + id),          // ISO 8601 basic, not RFC 3339
				enc("now|" + id),
				enc(strings.Repeat("9", 40) + "|" + id),
			} {
				r := e.Do(http.MethodGet, list+"&cursor="+url.QueryEscape(bad), org.Token, nil)
				requireProblem(t, r, http.StatusBadRequest, "invalid_cursor")
			}
		})
	}
}
