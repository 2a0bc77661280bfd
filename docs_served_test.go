package main

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/internal/cli"
	"github.com/valruns/valruns/internal/proctest"
)

// docMetricPages are the pages that name valruns' metrics.
var docMetricPages = []string{"docs/operations.md", "docs/api.md", "docs/design.md", "reliability/README.md", "README.md"}

// notMetrics are valruns_ names in the docs that are no metric: databases.
var notMetrics = map[string]bool{"valruns_test": true, "valruns_fuzz_": true}

var (
	docMetricName = regexp.MustCompile(`valruns_[a-z0-9_]+`)
	servedFamily  = regexp.MustCompile(`(?m)^# TYPE (valruns_[a-z0-9_]+) `)
)

// TestDocsNameWhatTheServiceServes: the service as `make run` starts it
// (`serve --worker`), after one run, serves every metric the docs name
// (a histogram's _bucket, _sum and _count are its family), and every
// valruns_ metric it serves is named in docs/operations.md, whatever its
// labels have seen so far; and GET /, the spec it serves and `valruns
// version` all say the release, CHANGELOG.md's newest
// (internal/cli.Release, checked against the CHANGELOG by
// TestReleaseIsChangelogs).
func TestDocsNameWhatTheServiceServes(t *testing.T) {
	t.Parallel()
	bin := proctest.Binary(t)
	_, addr, token, wf := proctest.MakeRun(t, bin, t.TempDir())
	api := "http://" + addr

	// One run, to its end.
	req, err := http.NewRequest(http.MethodPost, api+"/api/workflows/"+wf+"/start/", strings.NewReader(`{"submission":{"customer":"ACME","total":42}}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "docs-served")
	var run struct{ ID, Status string }
	getJSON(t, req, http.StatusCreated, &run)
	for deadline := time.Now().Add(60 * time.Second); run.Status == "queued" || run.Status == "running"; {
		require.True(t, time.Now().Before(deadline), "run %s still %s after 60s", run.ID, run.Status)
		req, err := http.NewRequest(http.MethodGet, api+"/api/runs/"+run.ID+"/", nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Prefer", "wait=5")
		getJSON(t, req, http.StatusOK, &run)
	}

	resp, err := http.Get(api + "/metrics")
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	served := map[string]bool{}
	for _, m := range servedFamily.FindAllStringSubmatch(string(b), -1) {
		served[m[1]] = true
	}
	documented := map[string][]string{} // name -> pages
	for _, page := range docMetricPages {
		text, err := os.ReadFile(page)
		require.NoError(t, err)
		for _, name := range docMetricName.FindAllString(string(text), -1) {
			if notMetrics[name] {
				continue
			}
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if base, ok := strings.CutSuffix(name, suffix); ok && served[base] {
					name = base
				}
			}
			if !slices.Contains(documented[name], page) {
				documented[name] = append(documented[name], page)
			}
		}
	}
	require.NotEmpty(t, documented)
	var unserved, undocumented []string
	for name, pages := range documented {
		if !served[name] {
			unserved = append(unserved, name+" ("+strings.Join(pages, ", ")+")")
		}
	}
	for name := range served {
		if !slices.Contains(documented[name], "docs/operations.md") {
			undocumented = append(undocumented, name)
		}
	}
	slices.Sort(unserved)
	slices.Sort(undocumented)
	require.Empty(t, unserved, "named in the docs, not served by serve --worker")
	require.Empty(t, undocumented, "served by serve --worker, not named in docs/operations.md")

	var index struct{ Version string }
	getJSON(t, mustRequest(t, api+"/"), http.StatusOK, &index)
	require.Equal(t, cli.Release, index.Version, "GET / says the release")
	for _, doc := range []string{"/swagger/openapi.json", "/swagger/doc.json"} {
		var spec struct{ Info struct{ Version string } }
		getJSON(t, mustRequest(t, api+doc), http.StatusOK, &spec)
		require.Equal(t, cli.Release, spec.Info.Version, "%s's info.version is the release", doc)
	}
	v := proctest.Exec(t, bin, nil, "", "version")
	require.Equal(t, 0, v.Code, v.Stderr)
	require.True(t, strings.HasPrefix(v.Stdout, "valruns "+cli.Release+"\n"), "valruns version: %q", v.Stdout)
}

func mustRequest(t *testing.T, url string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	return req
}

// getJSON sends req, requires status and decodes the answer into v.
func getJSON(t *testing.T, req *http.Request, status int, v any) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, status, resp.StatusCode, "%s %s: %s", req.Method, req.URL, b)
	require.NoError(t, json.Unmarshal(b, v), "%s", b)
}
