package handlers_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/config"
	"github.com/valruns/valruns/idempotency"
	"github.com/valruns/valruns/internal/apitest"
	"github.com/valruns/valruns/problem"
)

// gaugeValue reads the gauge name of reg.
func gaugeValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range families {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no %s metric", name)
	return 0
}

// waitGauge waits until the gauge name reads want; 30 s is a bound on a
// loaded machine, not what is checked.
func waitGauge(t *testing.T, reg *prometheus.Registry, name string, want float64) {
	t.Helper()
	apitest.Eventually(t, 30*time.Second, func() bool { return gaugeValue(t, reg, name) == want },
		fmt.Sprintf("%s never read %v", name, want))
}

// heldStart is a start whose body the test sends in two parts: until
// finish, the server holds it in flight, reading its body.
type heldStart struct {
	pw     *io.PipeWriter
	rest   []byte
	answer chan *http.Response
	err    chan error
}

func holdStart(t *testing.T, hc *http.Client, url, token, key string, body []byte) *heldStart {
	t.Helper()
	pr, pw := io.Pipe()
	req, err := http.NewRequest(http.MethodPost, url, pr)
	require.NoError(t, err)
	req.ContentLength = int64(len(body))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idempotency.HeaderKey, key)
	h := &heldStart{pw: pw, rest: body[len(body)/2:], answer: make(chan *http.Response, 1), err: make(chan error, 1)}
	go func() {
		resp, err := hc.Do(req)
		if err != nil {
			h.err <- err
			return
		}
		h.answer <- resp
	}()
	go func() { _, _ = pw.Write(body[:len(body)/2]) }()
	t.Cleanup(func() { _ = pw.Close() })
	return h
}

// finish sends the rest of the body and returns the answer.
func (h *heldStart) finish(t *testing.T) (int, []byte) {
	t.Helper()
	_, err := h.pw.Write(h.rest)
	require.NoError(t, err)
	require.NoError(t, h.pw.Close())
	select {
	case resp := <-h.answer:
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, b
	case err := <-h.err:
		t.Fatalf("held start: %v", err)
	}
	return 0, nil
}

// slowReader sends a body at a pace: pause after every every bytes.
type slowReader struct {
	r     *bytes.Reader
	every int
	pause time.Duration
}

func (s slowReader) Read(p []byte) (int, error) {
	if len(p) > s.every {
		p = p[:s.every]
	}
	n, err := s.r.Read(p)
	time.Sleep(s.pause)
	return n, err
}

// post sends one start with body (a []byte, or a slowReader) over real
// HTTP and reads the answer.
func post(hc *http.Client, url, token, key string, body any) (status int, header http.Header, answer []byte, err error) {
	var rd io.Reader
	var n int64
	switch b := body.(type) {
	case []byte:
		rd, n = bytes.NewReader(b), int64(len(b))
	case slowReader:
		rd, n = b, int64(b.r.Len())
	}
	req, err := http.NewRequest(http.MethodPost, url, rd)
	if err != nil {
		return 0, nil, nil, err
	}
	req.ContentLength = n
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idempotency.HeaderKey, key)
	resp, err := hc.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	answer, err = io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, answer, err
}

// 300 parallel starts of 1 MB bodies, with room for two bodies in flight
// (MAX_BODY_BYTES_IN_FLIGHT = 2 MiB), get only 201 or 503 overloaded with
// Retry-After: never a reset connection (a refused body is read and
// dropped before the answer), never a 5xx of another kind, and every 201's
// run exists while no 503 left one. First, while two held starts fill the
// budget, every start is refused (so 503s happen whatever the machine's
// speed); then the held two finish with 201, and 300 more come at once.
func TestOverloadBodyBudget(t *testing.T) {
	t.Parallel()
	e := apitest.New(t, apitest.Options{MaxOpenConns: 8, Config: func(c *config.Config) {
		c.MaxBodyBytesInFlight = 2 * c.MaxBodyBytes
		c.OverloadWait = 50 * time.Millisecond
	}})
	org := e.NewOrg("heavy")
	wf := e.NewWorkflow(org, map[string]any{"name": "heavy"})
	srv := e.Server()
	url := srv.URL + "/api/workflows/" + wf + "/start/"
	hc := &http.Client{Timeout: 5 * time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: 300}}
	t.Cleanup(hc.CloseIdleConnections)
	body := []byte(`{"submission": "` + strings.Repeat("x", 1_000_000) + `"}`)

	held := []*heldStart{
		holdStart(t, hc, url, org.Token, "held-0", body),
		holdStart(t, hc, url, org.Token, "held-1", body),
	}
	waitGauge(t, e.Registry, "valruns_http_body_bytes_in_flight", float64(2*len(body)))

	type answer struct {
		status int
		header http.Header
		body   []byte
		err    error
	}
	flood := func(prefix string, n int) map[string]answer {
		var mu sync.Mutex
		out := map[string]answer{}
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				key := fmt.Sprintf("%s-%d", prefix, i)
				var a answer
				a.status, a.header, a.body, a.err = post(hc, url, org.Token, key, body)
				mu.Lock()
				out[key] = a
				mu.Unlock()
			})
		}
		wg.Wait()
		return out
	}
	requireRefused := func(key string, a answer) {
		t.Helper()
		require.Equal(t, http.StatusServiceUnavailable, a.status, "%s: %s", key, a.body)
		require.Equal(t, "1", a.header.Get("Retry-After"), key)
		var p map[string]any
		require.NoError(t, json.Unmarshal(a.body, &p))
		require.Equal(t, problem.Overloaded.String(), p["code"], key)
		require.Zero(t, e.Count("idempotency_keys", "key = ?", key), "a key row for the refused %s", key)
		require.Zero(t, e.Count("validation_runs", "idempotency_key = ?", key), "a run for the refused %s", key)
	}

	for key, a := range flood("full", 50) {
		require.NoError(t, a.err, "%s: the answer must arrive, not a reset", key)
		requireRefused(key, a)
	}
	// A client that sends its body slowly, still sending when the answer
	// is ready, reads the 503 too. (Go's own client and server survive an
	// early answer without the server's draining; this checks the promise,
	// whoever keeps it.)
	for i := range 3 {
		key := fmt.Sprintf("slow-%d", i)
		var a answer
		a.status, a.header, a.body, a.err = post(hc, url, org.Token, key, slowReader{r: bytes.NewReader(body), every: 100 << 10, pause: 100 * time.Millisecond})
		require.NoError(t, a.err, "%s: the answer must arrive, not a reset", key)
		requireRefused(key, a)
	}

	for i, h := range held {
		status, b := h.finish(t)
		require.Equal(t, http.StatusCreated, status, "held start %d: %s", i, b)
	}

	created, refused := 2, 0
	for key, a := range flood("flood", 300) {
		require.NoError(t, a.err, "%s: the answer must arrive, not a reset", key)
		switch a.status {
		case http.StatusCreated:
			created++
			var run map[string]any
			require.NoError(t, json.Unmarshal(a.body, &run))
			require.EqualValues(t, 1, e.Count("validation_runs", "id = ? AND idempotency_key = ?", run["id"], key), key)
		default:
			requireRefused(key, a)
			refused++
		}
	}
	t.Logf("of 300 at once: %d created, %d refused", created-2, refused)
	require.EqualValues(t, created, e.Count("validation_runs", ""), "one run per 201, none per 503")
	require.Zero(t, gaugeValue(t, e.Registry, "valruns_http_body_bytes_in_flight"), "every byte given back")
}

// The default bounds admit ordinary heavy traffic: 16 starts of 300 KB,
// all in flight at once (each holding its body half sent), are all
// admitted and answered 201, none 503 overloaded.
func TestOverloadDefaultsAdmitHeavyStarts(t *testing.T) {
	t.Parallel()
	defaults, err := config.Load(func(string) (string, bool) { return "", false })
	require.NoError(t, err)
	e := apitest.New(t, apitest.Options{MaxOpenConns: 8, Config: func(c *config.Config) {
		c.MaxRequestsInFlight, c.MaxBodyBytesInFlight = defaults.MaxRequestsInFlight, defaults.MaxBodyBytesInFlight
		c.OverloadWait = defaults.OverloadWait
	}})
	org := e.NewOrg("heavy")
	wf := e.NewWorkflow(org, map[string]any{"name": "heavy"})
	url := e.Server().URL + "/api/workflows/" + wf + "/start/"
	hc := &http.Client{Timeout: time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	t.Cleanup(hc.CloseIdleConnections)
	body := []byte(`{"submission":[` + strings.Repeat("12345,", 49_999) + `12345]}`) // 300 KB
	var held []*heldStart
	for i := range 16 {
		held = append(held, holdStart(t, hc, url, org.Token, fmt.Sprintf("heavy-%d", i), body))
	}
	waitGauge(t, e.Registry, "valruns_http_body_bytes_in_flight", float64(16*len(body)))
	for i, h := range held {
		status, answer := h.finish(t)
		require.Equal(t, http.StatusCreated, status, "start %d: %s", i, answer)
	}
}

// With MAX_REQUESTS_IN_FLIGHT=1 and one start held in flight, an /api/
// request is 503 overloaded with Retry-After, while /healthz, /metrics and
// the Swagger spec, outside the bound, still answer. Once the held start
// finishes, the API answers again.
func TestOverloadRequestCount(t *testing.T) {
	t.Parallel()
	e := apitest.New(t, apitest.Options{Config: func(c *config.Config) {
		c.MaxRequestsInFlight = 1
		c.OverloadWait = 0
	}})
	org := e.NewOrg("busy")
	wf := e.NewWorkflow(org, map[string]any{"name": "busy"})
	srv := e.Server()
	hc := &http.Client{Timeout: time.Minute}

	h := holdStart(t, hc, srv.URL+"/api/workflows/"+wf+"/start/", org.Token, "held", []byte(`{"submission": {"total": 42}}`))
	waitGauge(t, e.Registry, "valruns_http_requests_in_flight", 1)

	r := e.Do(http.MethodGet, "/api/runs/", org.Token, nil)
	requireProblem(t, r, http.StatusServiceUnavailable, problem.Overloaded.String())
	require.Equal(t, "1", r.Header.Get("Retry-After"))
	for _, path := range []string{"/healthz", "/metrics", "/swagger/doc.json"} {
		require.Equal(t, http.StatusOK, e.Do(http.MethodGet, path, "", nil).Status, path)
	}

	status, b := h.finish(t)
	require.Equal(t, http.StatusCreated, status, "%s", b)
	require.Equal(t, http.StatusOK, e.Do(http.MethodGet, "/api/runs/", org.Token, nil).Status)
}
