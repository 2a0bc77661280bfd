package tasks_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/internal/apitest"
	"github.com/valruns/valruns/tasks"
)

// The hand-off's histogram counts each run the gate let in once, from its
// commit: valruns_run_handoff_seconds sees as many runs as
// valruns_run_start_to_queued_seconds, each no longer than from its start.
func TestHandOffTimeCountsEachRun(t *testing.T) {
	t.Parallel()
	const runs = 5
	env := apitest.New(t)
	org := env.NewOrg("handoff-time")
	wf := env.NewWorkflow(org, orderWorkflow)
	reg := prometheus.NewRegistry()
	d := tasks.NewDispatcher(tasks.DispatcherConfig{Redis: newRedis(t), MaxRetry: 5, Timeout: time.Minute, GiveUp: time.Minute, Registry: reg})
	env.SetHandOff(d.HandOff)
	t.Cleanup(func() {
		env.SetHandOff(nil)
		d.Close()
	})
	for range runs {
		startRun(t, env, org, wf, validOrder)
	}
	eventuallyMetric(t, reg, runs, "valruns_runs_handed_off_total", "result", "queued")
	handOff, fromStart := histogramNamed(t, reg, "valruns_run_handoff_seconds"), histogramNamed(t, reg, "valruns_run_start_to_queued_seconds")
	require.EqualValues(t, runs, handOff.count, "each run observed once")
	require.EqualValues(t, runs, fromStart.count)
	require.Positive(t, handOff.sum)
	require.LessOrEqual(t, handOff.sum, fromStart.sum, "from the commit, which comes after the start")
}

// histogramNamed reads the histogram name (without labels) from reg.
func histogramNamed(t testing.TB, reg prometheus.Gatherer, name string) histogramSample {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			h := mf.GetMetric()[0].GetHistogram()
			return histogramSample{h.GetSampleCount(), h.GetSampleSum()}
		}
	}
	t.Fatalf("no histogram %s", name)
	return histogramSample{}
}
