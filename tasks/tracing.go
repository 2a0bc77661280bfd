package tasks

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/valruns/valruns/internal/telemetry"
)

// Spans of the hand-off, built only when tracing is on (a tracer is set).
// A run's trace goes from the request that started it (RunPayload.Trace)
// to its hand-off, whose context its item carries, to its execution.

// traceHandOff starts the span of a run's hand-off, the child of the
// request that started the run (else of ctx's span), and returns the
// item's headers, which carry the span's context.
func (w queueWriter) traceHandOff(ctx context.Context, p RunPayload) (context.Context, map[string]string, func(error)) {
	ctx, span := w.tracer.Start(telemetry.Extract(ctx, p.Trace), "enqueue "+TypeRunExecute,
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attribute.String("messaging.system", "redis"), attribute.String("messaging.destination.name", readyList),
			attribute.String("valruns.run_id", p.RunID), attribute.Bool("valruns.redelivery", p.Redelivery)))
	return ctx, telemetry.Inject(ctx), endSpan(span)
}

// traceExecution starts the span of a run's execution, the child of its
// hand-off (the item's headers), else of the run's request.
func (e *RunExecutor) traceExecution(ctx context.Context, headers map[string]string, p RunPayload) (context.Context, func(error)) {
	parent := telemetry.Extract(ctx, headers)
	if !trace.SpanContextFromContext(parent).IsValid() {
		parent = telemetry.Extract(ctx, p.Trace)
	}
	ctx, span := e.tracer.Start(parent, "execute "+TypeRunExecute, trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attribute.String("messaging.system", "redis"), attribute.String("valruns.run_id", p.RunID),
			attribute.Bool("valruns.redelivery", p.Redelivery)))
	return ctx, endSpan(span)
}

// endSpan ends span, recording err.
func endSpan(span trace.Span) func(error) {
	return func(err error) {
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
}
