package models

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// A batch's statement joins its requests' traces: a lone start's as the
// child of its request's span; the starts of several requests in a trace
// of its own, "start batch", that links each traced request's span. With
// no traced request, no span at all.
func TestTracedBatch(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	request := func() trace.Span {
		_, span := tp.Tracer("test").Start(context.Background(), "request")
		return span
	}

	ctx, end := tracedBatch([]*startReq{{}, {}})
	require.False(t, trace.SpanFromContext(ctx).SpanContext().IsValid(), "no traced request: no span")
	end()

	lone := request()
	ctx, end = tracedBatch([]*startReq{{span: lone}})
	require.Equal(t, lone.SpanContext(), trace.SpanFromContext(ctx).SpanContext(), "a lone start: its request's span")
	end()
	lone.End()

	a, b := request(), request()
	ctx, end = tracedBatch([]*startReq{{span: a}, {}, {span: b}})
	_, stmt := tp.Tracer("test").Start(ctx, "statement")
	stmt.End()
	end()
	a.End()
	b.End()
	var root, statement sdktrace.ReadOnlySpan
	for _, s := range exp.GetSpans().Snapshots() {
		switch s.Name() {
		case "start batch":
			root = s
		case "statement":
			statement = s
		}
	}
	require.NotNil(t, root)
	require.False(t, root.Parent().IsValid(), "a trace of its own")
	require.NotEqual(t, a.SpanContext().TraceID(), root.SpanContext().TraceID())
	var linked []trace.SpanContext
	for _, l := range root.Links() {
		linked = append(linked, l.SpanContext)
	}
	require.Equal(t, []trace.SpanContext{a.SpanContext(), b.SpanContext()}, linked, "it links each traced request")
	require.Equal(t, root.SpanContext().SpanID(), statement.Parent().SpanID(), "the statements' spans are its children")
	require.Contains(t, root.Attributes(), attribute.Int("valruns.batch.starts", 3))
}
