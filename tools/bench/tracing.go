package main

// The cost of tracing (issue 31): new-key starts at 32 clients, with a
// worker draining, with tracing off (no OTLP endpoint: the default) and on
// (every trace sampled, exported over OTLP/HTTP to a receiver in the
// harness's own process, which decodes and counts the spans).

import (
	"context"
	"fmt"

	"github.com/valruns/valruns/internal/otlptest"
)

// tracing says how a scenario's processes trace.
type tracing int

const (
	tracingDefault tracing = iota // as the harness's environment has it
	tracingOff                    // no OTLP endpoint
	tracingOn                     // 100% sampled, to the harness's receiver
)

// tracingClients is the concurrency of the tracing rows.
const tracingClients = ratioClients

// Names of the tracing rows (their ratio is a check).
const (
	tracingOffName = "new key, serve + worker, tracing off"
	tracingOnName  = "new key, serve + worker, tracing on (100%)"
)

// tracingScenarios run back to back at tracingClients, off then on, so
// that the two rows are close in time on a machine whose load drifts.
var tracingScenarios = []scenario{
	{Name: tracingOffName, Kind: newKey, Worker: true, Tracing: tracingOff},
	{Name: tracingOnName, Kind: newKey, Worker: true, Tracing: tracingOn},
}

// tracingSteps are the tracing rows' runs: off then on, p.Rounds times.
func tracingSteps(ctx context.Context, e *env, p plan) []startStep {
	var steps []startStep
	for range max(p.Rounds, 1) {
		for _, sc := range tracingScenarios {
			steps = append(steps, startStep{sc.target(), sc.Name, func() row { return e.runHTTP(ctx, sc, tracingClients, p.HTTP) }})
		}
	}
	return steps
}

// tracingEnv is the settings of a scenario's serve and worker, and the
// receiver they export to (nil unless tracing is on; close it after).
func tracingEnv(t tracing) ([]string, *otlptest.Receiver, error) {
	switch t {
	case tracingOff:
		return []string{"OTEL_EXPORTER_OTLP_ENDPOINT=", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=", "OTEL_SDK_DISABLED="}, nil, nil
	case tracingOn:
		rcv, err := otlptest.Start(false)
		if err != nil {
			return nil, nil, fmt.Errorf("OTLP receiver: %w", err)
		}
		return []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + rcv.URL, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=",
			"OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf", "OTEL_TRACES_SAMPLER=always_on", "OTEL_SDK_DISABLED=",
			"OTEL_TRACES_EXPORTER=otlp", "OTEL_SERVICE_NAME=valruns-bench"}, rcv, nil
	}
	return nil, nil, nil
}

// tracingNote is what the receiver got, per request measured and warmed up.
func tracingNote(rcv *otlptest.Receiver, requests int) string {
	spans, posts := rcv.Count()
	per := 0.0
	if requests > 0 {
		per = float64(spans) / float64(requests)
	}
	return fmt.Sprintf("tracing on: the in-process receiver got %d spans in %d exports (%.1f per measured start, warm-up included; its CPU counts as the load generator's)", spans, posts, per)
}
