package tasks

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/valruns/valruns/internal/telemetry"
)

// Spans of the queue, built only when tracing is on (a tracer is set). A
// run's trace goes from the request that started it (RunPayload.Trace) to
// its enqueue, whose context the task's headers carry, to its execution. A
// batch task, which carries runs of many requests, is a trace of its own
// whose enqueue and execution link to each run's trace.

// traceEnqueueOne starts the span of a run's enqueue, the child of the
// request that started the run (else of ctx's span), and returns the
// task's headers, which carry the span's context.
func (w queueWriter) traceEnqueueOne(ctx context.Context, p RunPayload, taskID string) (context.Context, map[string]string, func(error)) {
	ctx, span := w.tracer.Start(telemetry.Extract(ctx, p.Trace), "enqueue "+TypeRunExecute,
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attribute.String("messaging.system", "asynq"), attribute.String("messaging.message.id", taskID),
			attribute.String("valruns.run_id", p.RunID), attribute.Bool("valruns.redelivery", p.Redelivery)))
	return ctx, telemetry.Inject(ctx), endSpan(span)
}

// traceEnqueueBatch starts the span of a batch task's enqueue, linked to
// each run's request, and returns the task's headers.
func (w queueWriter) traceEnqueueBatch(ctx context.Context, runs []RunPayload, taskID string) (context.Context, map[string]string, func(error)) {
	ctx, span := w.tracer.Start(ctx, "enqueue "+TypeRunBatch,
		trace.WithSpanKind(trace.SpanKindProducer), trace.WithLinks(runLinks(runs)...),
		trace.WithAttributes(attribute.String("messaging.system", "asynq"), attribute.String("messaging.message.id", taskID),
			attribute.Int("messaging.batch.message_count", len(runs))))
	return ctx, telemetry.Inject(ctx), endSpan(span)
}

// runLinks links to the trace of each run's request.
func runLinks(runs []RunPayload) []trace.Link {
	var links []trace.Link
	for _, p := range runs {
		if sc := telemetry.SpanContextOf(p.Trace); sc.IsValid() {
			links = append(links, trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{attribute.String("valruns.run_id", p.RunID)}})
		}
	}
	return links
}

// traceExecution starts the span of a run task's execution, the child of
// its enqueue (the task's headers), else of the run's request.
func (e *RunExecutor) traceExecution(ctx context.Context, headers map[string]string, p RunPayload) (context.Context, func(error)) {
	parent := telemetry.Extract(ctx, headers)
	if !trace.SpanContextFromContext(parent).IsValid() {
		parent = telemetry.Extract(ctx, p.Trace)
	}
	ctx, span := e.tracer.Start(parent, "execute "+TypeRunExecute, trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attribute.String("messaging.system", "asynq"), attribute.String("valruns.run_id", p.RunID),
			attribute.Bool("valruns.redelivery", p.Redelivery)))
	return ctx, endSpan(span)
}

// traceBatch starts the span of a batch task's execution, the child of
// its enqueue, linked to the trace of each run's request.
func (e *RunExecutor) traceBatch(ctx context.Context, headers map[string]string, runs []RunPayload) (context.Context, func(error)) {
	ctx, span := e.tracer.Start(telemetry.Extract(ctx, headers), "execute "+TypeRunBatch,
		trace.WithSpanKind(trace.SpanKindConsumer), trace.WithLinks(runLinks(runs)...),
		trace.WithAttributes(attribute.String("messaging.system", "asynq"), attribute.Int("messaging.batch.message_count", len(runs))))
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
