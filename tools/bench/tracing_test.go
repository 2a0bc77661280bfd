package main

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/internal/telemetry"
)

// TestTracingRowsConfigureValruns: the settings the tracing rows give serve
// and worker turn valruns's tracing off and on, as its set-up reads them,
// and "on" exports to the harness's receiver.
func TestTracingRowsConfigureValruns(t *testing.T) {
	for _, c := range []struct {
		t  tracing
		on bool
	}{{tracingOff, false}, {tracingOn, true}} {
		env, rcv, err := tracingEnv(c.t)
		require.NoError(t, err)
		// Whatever the harness's own environment says.
		t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
		for _, kv := range env {
			k, v, _ := strings.Cut(kv, "=")
			t.Setenv(k, v)
		}
		tp, shutdown, err := telemetry.Setup(context.Background(), telemetry.Config{})
		require.NoError(t, err)
		require.Equal(t, c.on, tp != nil)
		if c.on {
			_, span := telemetry.Tracer(tp).Start(context.Background(), "bench")
			span.End()
			require.NoError(t, shutdown(context.Background()))
			spans, posts := rcv.Count()
			require.Equal(t, 1, spans)
			require.Equal(t, 1, posts)
			require.Contains(t, tracingNote(rcv, 1), "got 1 spans in 1 exports (1.0 per measured start")
			require.NoError(t, rcv.Close())
		}
	}
}
