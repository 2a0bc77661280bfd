package handlers_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/valruns/valruns/internal/apitest"
	"github.com/valruns/valruns/internal/otlptest"
	"github.com/valruns/valruns/internal/telemetry"
	"github.com/valruns/valruns/models"
)

// startTracing sets tracing up as serve does (telemetry.Setup, from the
// OTEL_* environment), exporting to a receiver in this process; spansSent
// flushes the spans and returns what the receiver got. It sets the
// environment: its test cannot be parallel.
func startTracing(t *testing.T) (tp trace.TracerProvider, spansSent func() []otlptest.Span) {
	rcv, err := otlptest.Start(true)
	require.NoError(t, err)
	t.Cleanup(func() { _ = rcv.Close() })
	for _, name := range []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_SDK_DISABLED",
		"OTEL_TRACES_EXPORTER", "OTEL_TRACES_SAMPLER", "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT"} {
		t.Setenv(name, "")
	}
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rcv.URL)
	tp, shutdown, err := telemetry.Setup(context.Background(), telemetry.Config{})
	require.NoError(t, err)
	require.NotNil(t, tp)
	return tp, func() []otlptest.Span {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		require.NoError(t, shutdown(ctx)) // flushes
		return rcv.Spans()
	}
}

// TestTracedRequestsOfAnyoneAreBounded: with tracing on, the requests
// anyone may send without a token (a path of 1 MB that no route matches, a
// route's path with an id of 1 MB, a path of bytes that are not UTF-8, a
// query and headers of 1 MB, a tracestate of 32 long entries) each reach
// the collector as a small span named by its route, or by its method alone
// when none matched. A span of invalid UTF-8 would fail the export of
// every span sent with it.
func TestTracedRequestsOfAnyoneAreBounded(t *testing.T) {
	tp, spansSent := startTracing(t)
	env := apitest.New(t, apitest.Options{Tracing: tp})

	huge := strings.Repeat("a", 1<<20)
	var tracestate []string
	for i := range 16 { // 16 entries of 455 bytes, 16 of 100, alternating
		tracestate = append(tracestate, fmt.Sprintf("l%02d%s=%s", i, strings.Repeat("k", 200), strings.Repeat("v", 250)),
			fmt.Sprintf("m%02d%s=%s", i, strings.Repeat("k", 40), strings.Repeat("v", 56)))
	}
	traceID := "4bf92f3577b34da6a3ce929d0e0e4736"
	for _, c := range []struct {
		path    string
		headers []string
		status  int
		span    string
	}{
		{path: "/" + huge, status: http.StatusNotFound, span: "GET"},
		{path: "/api/runs/" + huge, status: http.StatusUnauthorized, span: "GET /api/runs/{id}/"},
		{path: "/%ff%fe/%c3", status: http.StatusNotFound, span: "GET"},
		{path: "/healthz?q=" + huge, headers: []string{"User-Agent", huge, "X-Request-Id", huge}, status: http.StatusOK, span: "GET /healthz"},
		{path: "/api/runs/", headers: []string{"traceparent", "00-" + traceID + "-00f067aa0ba902b7-01",
			"tracestate", strings.Join(tracestate, ",")}, status: http.StatusUnauthorized, span: "GET /api/runs/"},
	} {
		r := env.Do(http.MethodGet, c.path, "", nil, c.headers...)
		require.Equal(t, c.status, r.Status, "%.100s: %.300s", c.path, r.Body)
	}
	spans := spansSent()
	var names []string
	for _, s := range spans {
		names = append(names, s.Name)
		size := len(s.Name) + len(s.TraceState)
		for k, v := range s.Attrs {
			size += len(k) + len(v)
		}
		require.Less(t, size, 2048, "span %q: %d bytes of name, trace state and attributes", s.Name, size)
		if s.TraceID == traceID {
			// The long entries go, then entries from the end, as W3C asks.
			require.LessOrEqual(t, len(s.TraceState), telemetry.TraceStateMax)
			require.True(t, strings.HasPrefix(s.TraceState, "m00"), "the first short entries are kept: %q", s.TraceState)
			require.NotContains(t, s.TraceState, "l00")
		}
	}
	require.ElementsMatch(t, []string{"GET", "GET /api/runs/{id}/", "GET", "GET /healthz", "GET /api/runs/"}, names,
		"every request's span reached the collector, named by its route")
}

// TestTracedStartHasItsStatements: what docs/operations.md promises of a
// start's trace. A request whose token is not cached yet has the token
// lookup's span, named by its statement (authenticate, sent through GORM);
// a start whose token is cached has its statement's spans in its trace:
// the batch span and one child per statement, named by its file
// (start_settings, start_locks, start_batch).
func TestTracedStartHasItsStatements(t *testing.T) {
	tp, spansSent := startTracing(t)
	env := apitest.New(t, apitest.Options{Tracing: tp, Tracer: telemetry.PgxTracer(tp, nil, models.StatementName)})
	acme := env.NewOrg("acme")
	wf := env.NewWorkflow(acme, idemWorkflowBody) // acme's token is cached from now on
	other := env.NewOrg("other")
	// The organisation's first start of the month takes the slow path
	// (its usage slots are made): the traced one is its second.
	require.Equal(t, http.StatusCreated, env.Do(http.MethodPost, idemStartPath(wf), acme.Token, idemBody).Status)

	lookup, start := "0af7651916cd43dd8448eb211c80319c", "4bf92f3577b34da6a3ce929d0e0e4736"
	r := env.Do(http.MethodGet, "/api/workflows/", other.Token, nil, "traceparent", "00-"+lookup+"-00f067aa0ba902b7-01")
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	r = env.Do(http.MethodPost, idemStartPath(wf), acme.Token, idemBody, "Idempotency-Key", "traced",
		"traceparent", "00-"+start+"-00f067aa0ba902b7-01")
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)

	byTrace := map[string][]otlptest.Span{}
	for _, s := range spansSent() {
		byTrace[s.TraceID] = append(byTrace[s.TraceID], s)
	}
	names := func(trace string) (names []string) {
		for _, s := range byTrace[trace] {
			names = append(names, s.Name)
		}
		return names
	}
	require.Contains(t, names(lookup), "authenticate", "the token lookup's span, named by its statement")
	require.NotContains(t, names(start), "authenticate", "the token is cached")
	var httpSpan, batch otlptest.Span
	for _, s := range byTrace[start] {
		switch s.Name {
		case "POST /api/workflows/{id}/start/":
			httpSpan = s
		case "batch start":
			batch = s
		}
	}
	require.Equal(t, []string{"start_settings", "start_locks", "start_batch", "batch start", "POST /api/workflows/{id}/start/"},
		names(start), "the start's trace: its statements (ended first), their batch and the request")
	require.Equal(t, httpSpan.SpanID, batch.ParentSpanID, "the batch span is the request span's child")
	for _, s := range byTrace[start][:3] {
		require.Equal(t, batch.SpanID, s.ParentSpanID, s.Name)
		require.Equal(t, "postgresql", s.Attrs["db.system.name"], s.Name)
	}
}
