package tasks_test

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/valruns/valruns/config"
	"github.com/valruns/valruns/internal/apitest"
	"github.com/valruns/valruns/internal/telemetry"
	"github.com/valruns/valruns/models"
	"github.com/valruns/valruns/tasks"
)

// documentedSpans are the span names docs/operations.md's table of spans
// names: every name in backticks in the first cell of its rows.
func documentedSpans(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../docs/operations.md")
	require.NoError(t, err)
	_, table, ok := strings.Cut(string(b), "\n| span | process | what |\n|---|---|---|\n")
	require.True(t, ok, "docs/operations.md has the table of spans")
	var names []string
	for _, row := range strings.Split(table, "\n") {
		if !strings.HasPrefix(row, "| ") {
			break
		}
		first := strings.Split(row, " | ")[0]
		for _, m := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(first, -1) {
			names = append(names, m[1])
		}
	}
	require.NotEmpty(t, names)
	return names
}

// TestDocumentedSpansAreEmitted: each span docs/operations.md names is
// sent by the API and the worker, traced as serve and worker trace (the
// router's spans, the PostgreSQL statements' tracer, the dispatcher's
// and the worker's spans), for what a user does: create a workflow and a
// webhook endpoint, ask for an unknown path, start runs (an
// organisation's first, which takes the slow path, then others, some at
// once), and a webhook delivery.
func TestDocumentedSpansAreEmitted(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	env := apitest.New(t, apitest.Options{Tracing: tp, Tracer: telemetry.PgxTracer(tp, nil, models.StatementName),
		Config: func(c *config.Config) { c.WebhookAllowPrivateTargets = true }})
	rdb := newRedis(t)
	w := startWorker(t, env, rdb, func(c *tasks.Config) {
		c.Tracing = tp
		c.WebhookAllowPrivate = true
		c.WebhookPollInterval = 50 * time.Millisecond
	})
	d := tasks.NewDispatcher(tasks.DispatcherConfig{Redis: rdb, MaxRetry: 5, Timeout: time.Minute, GiveUp: time.Minute, Tracing: tp})
	t.Cleanup(d.Close)
	org := env.NewOrg("acme")
	wf := env.NewWorkflow(org, orderWorkflow)
	rc := newHookReceiver(t, func(int) int { return http.StatusOK })
	ep := createEndpoint(t, env, org, rc.URL+"/hooks")
	require.Equal(t, http.StatusNotFound, env.Do(http.MethodGet, "/nothing-here", "", nil).Status)

	// A redelivery (the sweeper's), in a trace of its own: the claimed path.
	redelivered := startRun(t, env, org, wf, validOrder, "Idempotency-Key", "redelivered")
	rctx, span := telemetry.Tracer(tp).Start(context.Background(), "redelivery")
	require.NoError(t, tasks.Deliver(rctx, w.Worker, tasks.NewRunTask(redelivered, true)))
	span.End()
	env.SetHandOff(d.HandOff)
	t.Cleanup(func() { env.SetHandOff(nil) })
	one := startRun(t, env, org, wf, invalidOrder, "Idempotency-Key", "one")
	waitRun(t, env, org, one, 30*time.Second)
	waitDeliveries(t, env, org, ep.ID, 2)

	seen := func() map[string]bool {
		names := map[string]bool{}
		for _, s := range exp.GetSpans().Snapshots() {
			names[s.Name()] = true
		}
		return names
	}
	// Starts sent at once share statements: "start batch" (the
	// batcher decides, so rounds until one did, within a generous bound).
	for round := 0; !seen()["start batch"]; round++ {
		require.Less(t, round, 20, "20 rounds of 16 starts at once, and no statement carried two")
		var wg sync.WaitGroup
		for i := range 16 {
			wg.Go(func() {
				r := env.Do(http.MethodPost, "/api/workflows/"+wf+"/start/", org.Token, validOrder,
					"Idempotency-Key", fmt.Sprintf("at-once-%d-%d", round, i))
				require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
			})
		}
		wg.Wait()
	}

	// The worker's spans end after the answers the test waited for.
	documented := documentedSpans(t)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		names := seen()
		var missing []string
		for _, name := range documented {
			if !names[name] {
				missing = append(missing, name)
			}
		}
		if len(missing) == 0 {
			return
		}
		if time.Now().After(deadline) {
			sent := slices.Sorted(maps.Keys(names))
			t.Fatalf("docs/operations.md names spans none of these requests sent: %q\nsent: %q", missing, sent)
		}
	}
}
