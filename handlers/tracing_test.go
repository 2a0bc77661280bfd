package handlers_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/internal/apitest"
	"github.com/valruns/valruns/internal/otlptest"
	"github.com/valruns/valruns/internal/telemetry"
)

// TestTracedRequestsOfAnyoneAreBounded: with tracing on, the requests
// anyone may send without a token (a path of 1 MB that no route matches, a
// route's path with an id of 1 MB, a path of bytes that are not UTF-8, a
// query and headers of 1 MB, a tracestate of 32 long entries) each reach
// the collector as a small span named by its route, or by its method alone
// when none matched. A span of invalid UTF-8 would fail the export of
// every span sent with it.
func TestTracedRequestsOfAnyoneAreBounded(t *testing.T) {
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
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, shutdown(ctx)) // flushes

	spans := rcv.Spans()
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
