package tasks_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/valruns/valruns/internal/apitest"
	"github.com/valruns/valruns/internal/proctest"
	"github.com/valruns/valruns/internal/telemetry"
	"github.com/valruns/valruns/models"
	"github.com/valruns/valruns/tasks"
)

// TestHandOffCarriesEachRunsTrace: three runs, each started by a request
// in a trace of its own, are handed off together. Each run's hand-off is
// the child of its request's span, and its execution the child of its
// hand-off, whose context the item carried: one trace per run.
func TestHandOffCarriesEachRunsTrace(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	env := apitest.New(t)
	org := env.NewOrg("acme")
	wf := env.NewWorkflow(org, orderWorkflow)
	rdb := newRedis(t)
	w := newWorker(t, env, rdb, func(c *tasks.Config) { c.Tracing = tp })
	ids, _ := startBodies(t, env, org, wf, "traced", 3)
	store := models.NewRunStore(env.DB)
	ctx := context.Background()
	traces := map[string]string{} // run id -> its request's trace
	d := tasks.NewDispatcher(tasks.DispatcherConfig{Redis: rdb, MaxRetry: 5, Timeout: time.Minute, GiveUp: time.Minute, Tracing: tp})
	t.Cleanup(d.Close)
	for _, id := range ids {
		q, err := store.Queued(ctx, id)
		require.NoError(t, err)
		rctx, span := telemetry.Tracer(tp).Start(ctx, "request")
		q.Trace = telemetry.Inject(rctx)
		span.End()
		traces[id] = span.SpanContext().TraceID().String()
		d.HandOff(q)
	}
	require.NoError(t, w.Start(ctx))
	t.Cleanup(w.Stop)
	for _, id := range ids {
		waitRun(t, env, org, id, 30*time.Second)
	}

	spans := func(name string) map[string]sdktrace.ReadOnlySpan {
		out := map[string]sdktrace.ReadOnlySpan{}
		for _, s := range exp.GetSpans().Snapshots() {
			if s.Name() != name {
				continue
			}
			for _, a := range s.Attributes() {
				if a.Key == "valruns.run_id" {
					out[a.Value.AsString()] = s
				}
			}
		}
		return out
	}
	apitest.Eventually(t, 10*time.Second, func() bool {
		return len(spans("execute "+tasks.TypeRunExecute)) == len(ids)
	}, "each run's execution span")
	handOffs, executions := spans("enqueue "+tasks.TypeRunExecute), spans("execute "+tasks.TypeRunExecute)
	for _, id := range ids {
		h, x := handOffs[id], executions[id]
		require.NotNil(t, h, "run %s's hand-off span", id)
		require.Equal(t, traces[id], h.SpanContext().TraceID().String(), "the hand-off is in the request's trace")
		require.Equal(t, h.SpanContext().SpanID(), x.Parent().SpanID(), "the item carries the hand-off's context")
		require.Equal(t, traces[id], x.SpanContext().TraceID().String())
	}
}

// TestWebhookAttemptsAreTraced: each attempt of a delivery is a span
// naming its run, its attempt and the receiver's answer.
func TestWebhookAttemptsAreTraced(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	env, org, wf, _ := hookEnv(t, func(c *tasks.Config) { c.Tracing = tp })
	rc := newHookReceiver(t, func(n int) int {
		if n == 1 {
			return http.StatusInternalServerError
		}
		return http.StatusOK
	})
	ep := createEndpoint(t, env, org, rc.URL+"/hooks")
	runID := startRun(t, env, org, wf, invalidOrder)
	waitRun(t, env, org, runID, 30*time.Second)
	waitDeliveries(t, env, org, ep.ID, 1)

	type attempt struct{ attempt, status int64 }
	var got []attempt
	apitest.Eventually(t, 10*time.Second, func() bool {
		got = got[:0]
		for _, s := range exp.GetSpans().Snapshots() {
			if s.Name() != "webhook attempt" {
				continue
			}
			a := attempt{}
			run := ""
			for _, kv := range s.Attributes() {
				switch kv.Key {
				case "valruns.webhook.attempt":
					a.attempt = kv.Value.AsInt64()
				case "http.response.status_code":
					a.status = kv.Value.AsInt64()
				case "valruns.run_id":
					run = kv.Value.AsString()
				}
			}
			if run == runID {
				got = append(got, a)
			}
		}
		return len(got) == 2
	}, "a span per attempt")
	slices.SortFunc(got, func(a, b attempt) int { return int(a.attempt - b.attempt) })
	require.Equal(t, []attempt{{1, 500}, {2, 200}}, got)
}

// TestWorkerLogsNameTheStartsRequest: the worker's log lines about a run
// carry the request_id of the start that created it, and its trace_id and
// span_id while the execution is traced.
func TestWorkerLogsNameTheStartsRequest(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	logs := &proctest.Log{}
	env := apitest.New(t)
	org := env.NewOrg("acme")
	wf := env.NewWorkflow(org, orderWorkflow)
	startWorker(t, env, newRedis(t), func(c *tasks.Config) {
		claimedPath(c) // the claimed path logs "run claimed" and "run finished"
		c.Tracing = tp
		c.Log = slog.New(telemetry.LogHandler(slog.NewJSONHandler(logs, nil)))
	})
	runID := startRun(t, env, org, wf, invalidOrder, "X-Request-Id", "start-req-1")
	waitRun(t, env, org, runID, 30*time.Second)

	var lines []map[string]any
	apitest.Eventually(t, 10*time.Second, func() bool {
		lines = lines[:0]
		for _, l := range strings.Split(logs.String(), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(l), &m) == nil && m["run_id"] == runID && (m["msg"] == "run claimed" || m["msg"] == "run finished") {
				lines = append(lines, m)
			}
		}
		return len(lines) == 2
	}, "the run's claimed and finished lines")
	for _, m := range lines {
		require.Equal(t, "start-req-1", m["request_id"], "%v", m)
		require.Len(t, m["trace_id"], 32, "%v", m)
		require.Len(t, m["span_id"], 16, "%v", m)
	}
}
