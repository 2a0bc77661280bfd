package main

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/internal/otlptest"
	"github.com/valruns/valruns/internal/proctest"
)

// TestProcTracing: one start sent with a W3C traceparent to the real
// binary, exporting to an OTLP/HTTP receiver in this process (protobuf, as
// a collector gets it). The receiver gets, in the client's trace, the
// start's HTTP span (named by route, with the idempotency decision), its
// PostgreSQL statements' spans and the worker's execution of the run: from
// one `serve --worker`, and from a `serve` and a `worker` apart.
func TestProcTracing(t *testing.T) {
	t.Parallel()
	bin := proctest.Binary(t)
	// The workers share RedisURL's queue: no other test's worker may take
	// this one's task (its run would then wait for a sweeper, in a new trace).
	proctest.LockRedis(t)
	t.Run("serve --worker", func(t *testing.T) {
		f := procNewDB(t)
		rcv := startReceiver(t)
		api := traceProc(t, bin, "serve --worker", "", traceEnv(rcv, f.url, "valruns-single"), "serve", "--worker")
		traceOneStart(t, f, rcv, api, "valruns-single", "valruns-single")
	})
	t.Run("serve and worker apart", func(t *testing.T) {
		f := procNewDB(t)
		rcv := startReceiver(t)
		metrics := proctest.FreeAddr(t)
		traceProc(t, bin, "worker", "http://"+metrics+"/healthz",
			append(traceEnv(rcv, f.url, "valruns-worker"), "WORKER_METRICS_ADDR="+metrics), "worker")
		api := traceProc(t, bin, "serve", "", traceEnv(rcv, f.url, "valruns-api"), "serve")
		traceOneStart(t, f, rcv, api, "valruns-api", "valruns-worker")
	})
}

func startReceiver(t *testing.T) *otlptest.Receiver {
	rcv, err := otlptest.Start(true)
	require.NoError(t, err)
	t.Cleanup(func() { _ = rcv.Close() })
	return rcv
}

// traceEnv is a traced process's environment: only the standard OTEL_*
// variables say where traces go (spans flushed every 100 ms).
func traceEnv(rcv *otlptest.Receiver, dbURL, service string) []string {
	return []string{"DATABASE_URL=" + dbURL, "REDIS_URL=" + proctest.RedisURL(), "LOG_FORMAT=json",
		"OTEL_EXPORTER_OTLP_ENDPOINT=" + rcv.URL, "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
		"OTEL_SERVICE_NAME=" + service, "OTEL_BSP_SCHEDULE_DELAY=100"}
}

// traceProc starts the binary with args and waits for health (the API's
// /healthz when health is ""). It is stopped when the test ends.
func traceProc(t *testing.T, bin, name, health string, env []string, args ...string) *procServer {
	t.Helper()
	addr := proctest.FreeAddr(t)
	s := &procServer{name: name, url: "http://" + addr, log: &proctest.Log{}, exited: make(chan struct{})}
	s.cmd = exec.Command(bin, args...)
	s.cmd.Env = proctest.Env(append([]string{"HTTP_ADDR=" + addr, "AUTH_CACHE_TTL=0"}, env...)...)
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	require.NoError(t, s.cmd.Start())
	go func() {
		_ = s.cmd.Wait()
		close(s.exited)
	}()
	t.Cleanup(func() {
		s.kill()
		if t.Failed() {
			t.Logf("%s output:\n%s", s.name, s.log.String())
		}
	})
	if health == "" {
		health = s.url + "/healthz"
	}
	proctest.WaitHTTP(t, health, proctest.ExitedChild(s.exited, s.log))
	return s
}

func randomHex(t *testing.T, n int) string {
	b := make([]byte, n)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return hex.EncodeToString(b)
}

// traceOneStart sends one start with a traceparent to api and waits for
// its trace at the receiver.
func traceOneStart(t *testing.T, f *procFixture, rcv *otlptest.Receiver, api *procServer, apiService, workerService string) {
	wf := f.workflow(t, api)
	traceID, parentID, requestID := randomHex(t, 16), randomHex(t, 8), "trace-"+randomHex(t, 6)
	req, err := http.NewRequest(http.MethodPost, api.url+"/api/workflows/"+wf+"/start/", strings.NewReader(procBody))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+f.token)
	req.Header.Set("Idempotency-Key", "trace-"+traceID)
	req.Header.Set("X-Request-Id", requestID)
	req.Header.Set("traceparent", "00-"+traceID+"-"+parentID+"-01")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode, "%s", body)
	var run struct{ ID string }
	require.NoError(t, json.Unmarshal(body, &run))

	var httpSpan, pgSpan, execSpan *otlptest.Span
	deadline := time.Now().Add(60 * time.Second)
	for httpSpan == nil || pgSpan == nil || execSpan == nil {
		if time.Now().After(deadline) {
			var got []string
			for _, s := range rcv.Spans() {
				got = append(got, fmt.Sprintf("%s %s trace=%s parent=%s links=%v %v", s.Service, s.Name, s.TraceID, s.ParentSpanID, s.Links, s.Attrs))
			}
			t.Fatalf("trace %s incomplete after 60s: http %v, postgresql %v, execution %v; received:\n%s",
				traceID, httpSpan != nil, pgSpan != nil, execSpan != nil, strings.Join(got, "\n"))
		}
		time.Sleep(50 * time.Millisecond)
		for _, s := range rcv.Spans() {
			switch {
			case s.Service == apiService && s.TraceID == traceID && s.Name == "POST /api/workflows/{id}/start/":
				httpSpan = &s
			case s.Service == apiService && s.TraceID == traceID && (s.Attrs["db.system.name"] == "postgresql" || s.Attrs["db.system"] == "postgresql"):
				pgSpan = &s
			case s.Service == workerService && s.Name == "execute validation_run:execute" && s.TraceID == traceID,
				s.Service == workerService && s.Name == "execute validation_run:batch" && slices.Contains(s.Links, traceID):
				execSpan = &s
			}
		}
	}
	require.Equal(t, parentID, httpSpan.ParentSpanID, "the HTTP span is the child of the client's traceparent")
	require.Equal(t, "SPAN_KIND_SERVER", httpSpan.Kind)
	require.Equal(t, "new", httpSpan.Attrs["idempotency.decision"])
	require.Equal(t, "201", httpSpan.Attrs["http.response.status_code"])
	require.NotContains(t, pgSpan.Attrs, "db.query.text", "a statement's span is named by it, without its text")
	if execSpan.TraceID == traceID {
		require.Equal(t, run.ID, execSpan.Attrs["valruns.run_id"])
	}

	// The API's log line of the request names its trace, span and id.
	found := false
	sc := bufio.NewScanner(strings.NewReader(api.log.String()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var line map[string]any
		if json.Unmarshal(sc.Bytes(), &line) != nil || line["msg"] != "request" || line["trace_id"] != traceID {
			continue
		}
		require.Equal(t, requestID, line["request_id"], sc.Text())
		require.Equal(t, httpSpan.SpanID, line["span_id"], sc.Text())
		found = true
	}
	require.True(t, found, "no request log line with trace_id %s", traceID)
}
