package handlers_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/handlers"
	"github.com/valruns/valruns/problem"
)

// fetch GETs ref resolved against base, as a client follows a problem's type.
func fetch(t *testing.T, base *url.URL, ref, accept string) (*http.Response, string) {
	t.Helper()
	u, err := base.Parse(ref)
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodGet, u.String(), nil)
	require.NoError(t, err)
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(b)
}

// Every code the server can answer (problem.Pages: a handler cannot answer
// a code without a page, problem.Code has no other values) has a page at
// its problem's type, resolved against the service that answered it, with
// no credentials: HTML by default, its Markdown on request.
func TestProblemPages(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(handlers.New(handlers.Deps{}))
	t.Cleanup(srv.Close)
	base, err := url.Parse(srv.URL + "/api/runs/1/") // where a problem is answered
	require.NoError(t, err)

	pages := problem.Pages()
	require.NotEmpty(t, pages)
	_, index := fetch(t, base, "/problems/", "")
	for _, p := range pages {
		for _, status := range p.Statuses {
			typ := problem.New(status, p.Code, "detail").Type
			resp, body := fetch(t, base, typ, "")
			require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", typ, body)
			require.Equal(t, "text/html; charset=utf-8", resp.Header.Get("Content-Type"), typ)
			require.Contains(t, body, "<h1>"+p.Code.String()+": ", typ)
			require.Contains(t, body, "<title>"+p.Code.String()+": ", typ)

			resp, body = fetch(t, base, typ, "text/markdown")
			require.Equal(t, http.StatusOK, resp.StatusCode, typ)
			require.Equal(t, "text/markdown; charset=utf-8", resp.Header.Get("Content-Type"), typ)
			require.Equal(t, p.Document(), body, typ)
		}
		require.Contains(t, index, `<a href="/problems/`+p.Code.String()+`"><code>`+p.Code.String()+"</code></a>")
	}

	for _, unknown := range []string{"/problems/no_such_code", "/problems/NOT_FOUND"} {
		resp, body := fetch(t, base, unknown, "")
		require.Equal(t, http.StatusNotFound, resp.StatusCode, unknown)
		require.Equal(t, problem.ContentType, resp.Header.Get("Content-Type"), unknown)
		require.Contains(t, body, `"code":"not_found"`, unknown)
	}
}

// A page's Markdown renders as plain HTML: text is escaped, code spans and
// links are elements, nothing of the Markdown syntax is left.
func TestProblemPageHTML(t *testing.T) {
	t.Parallel()
	got := problem.RenderHTML("a <b>", "# T `x`\n\nSee [the `list`](/problems/) & <this>.\n\n- one\n- `two`")
	require.Contains(t, got, "<title>a &lt;b&gt;</title>")
	require.Contains(t, got, "<h1>T <code>x</code></h1>")
	require.Contains(t, got, `<p>See <a href="/problems/">the <code>list</code></a> &amp; &lt;this&gt;.</p>`)
	require.Contains(t, got, "<ul>\n<li>one</li>\n<li><code>two</code></li>\n</ul>")
	for _, p := range problem.Pages() {
		html := problem.RenderHTML(p.Title, p.Document())
		for _, left := range []string{"`", "](", "# "} {
			require.NotContains(t, html, left, "%s: Markdown left in the HTML", p.Code)
		}
	}
}

// The docs' table of errors is the one the pages make (make docs).
func TestProblemTableCurrent(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../docs/api.md")
	require.NoError(t, err)
	doc := string(b)
	want, err := problem.ReplaceTable([]byte(doc))
	require.NoError(t, err)
	require.Equal(t, string(want), doc, "docs/api.md's table of errors is stale: run make docs")
	require.True(t, strings.Contains(doc, "| [`not_found`](#not_found) | 404 |"))
}

// Every problem the API answered in the recorded situations (TestAPIExamples:
// every one the spec documents) has its status among its page's.
func TestProblemStatusesRecorded(t *testing.T) {
	t.Parallel()
	seen := 0
	for name, o := range loadExamples(t).Operations {
		for s, r := range o.Responses {
			status, err := strconv.Atoi(s)
			require.NoError(t, err)
			for _, code := range r.Codes() {
				seen++
				p, ok := problem.Lookup(code)
				require.True(t, ok, "%s %d answered %s, which has no page", name, status, code)
				require.Contains(t, p.Statuses, status, "%s answered %s with %d: its page says %v", name, code, status, p.Statuses)
			}
		}
	}
	require.NotZero(t, seen)
}
