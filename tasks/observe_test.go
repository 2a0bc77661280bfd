package tasks_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/internal/apitest"
	"github.com/valruns/valruns/internal/proctest"
	"github.com/valruns/valruns/internal/testdb"
	"github.com/valruns/valruns/tasks"
)

// The metrics an SLO is written on move with what they measure: the
// backlog's gauges (runs not final, the oldest one's age, the runs waiting
// at the fair-share gate) rise while runs wait and fall back to 0 once
// they are final; valruns_run_start_to_final_seconds counts every run
// once, by its final status, and its sum is the runs' time from start to
// final as their rows record it; valruns_worker_running is 1 exactly while
// the worker runs.
func TestBacklogMetricsMove(t *testing.T) {
	t.Parallel()
	const share, valid = 2, 5
	env := apitest.New(t)
	org := env.NewOrg("backlog")
	wf := env.NewWorkflow(org, orderWorkflow)
	opt := newRedis(t)
	d := tasks.NewDispatcher(tasks.DispatcherConfig{Redis: opt, MaxRetry: 5, Timeout: time.Minute, GiveUp: time.Minute, RunShare: share})
	env.SetHandOff(d.HandOff)
	t.Cleanup(func() {
		env.SetHandOff(nil)
		d.Close()
	})
	w := newWorker(t, env, opt, func(c *tasks.Config) {
		c.RunShare, c.BacklogInterval = share, 50*time.Millisecond
		c.SweepInterval, c.RedeliverAfter = time.Second, time.Minute
	})
	hold := make(chan struct{})
	tasks.SetBeforeRun(w.Worker, func(ctx context.Context, _ string) {
		select {
		case <-hold:
		case <-ctx.Done():
		}
	})
	reg := w.Registry
	require.Zero(t, metricValue(t, reg, "valruns_worker_running"), "not started")
	require.NoError(t, w.Start(context.Background()))
	t.Cleanup(w.Stop)
	require.Equal(t, 1.0, metricValue(t, reg, "valruns_worker_running"))

	for range valid {
		startRun(t, env, org, wf, validOrder)
	}
	startRun(t, env, org, wf, invalidOrder)
	const started = valid + 1
	eventuallyMetric(t, reg, started, "valruns_runs_unfinished")
	eventuallyMetric(t, reg, started-share, "valruns_runs_waiting_fair_share")
	apitest.Eventually(t, 30*time.Second, func() bool {
		return metricValue(t, reg, "valruns_runs_oldest_unfinished_seconds") >= 1
	}, "the oldest run's age grows while it waits")

	close(hold)
	apitest.Eventually(t, time.Minute, func() bool {
		return env.Count("validation_runs", "status IN ('queued', 'running')") == 0
	}, "every run is final")
	eventuallyMetric(t, reg, 0, "valruns_runs_unfinished")
	eventuallyMetric(t, reg, 0, "valruns_runs_oldest_unfinished_seconds")
	eventuallyMetric(t, reg, 0, "valruns_runs_waiting_fair_share")

	passed, failed := histogram(t, reg, "passed"), histogram(t, reg, "failed")
	require.EqualValues(t, valid, passed.count, "each passed run observed once")
	require.EqualValues(t, 1, failed.count, "the failed run observed once")
	require.Zero(t, histogram(t, reg, "error").count)
	var recorded float64
	require.NoError(t, env.DB.Raw(`SELECT sum(extract(epoch FROM finished_at - created_at))::float8 FROM validation_runs`).Scan(&recorded).Error)
	require.InDelta(t, recorded, passed.sum+failed.sum, 0.001, "the observations are the runs' start-to-final times as recorded")

	w.Stop()
	require.Zero(t, metricValue(t, reg, "valruns_worker_running"), "stopped")
}

// The worker's readiness is honest: not ready before it starts and once it
// stops, nor while PostgreSQL or Redis is unreachable; ready again when
// they answer.
func TestWorkerReadiness(t *testing.T) {
	t.Parallel()
	env := apitest.New(t)
	rs := startRedisServer(t, proctest.FreePort(t))
	opt := redisBase(t)
	opt.Addr, opt.DB, opt.Username, opt.Password = rs.addr(), 0, "", ""
	w := newWorker(t, env, opt, nil)
	ready := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return w.Ready(ctx)
	}
	require.ErrorIs(t, ready(), tasks.ErrNotRunning, "before Start")
	require.NoError(t, w.Start(context.Background()))
	t.Cleanup(w.Stop)
	require.NoError(t, ready())

	allow := testdb.Refuse(t, env.DB)
	require.ErrorContains(t, ready(), "PostgreSQL does not answer")
	allow()
	apitest.Eventually(t, 30*time.Second, func() bool { return ready() == nil }, "ready once PostgreSQL answers again")

	rs.stop()
	require.ErrorContains(t, ready(), "Redis does not answer")
	rs.start()
	apitest.Eventually(t, 30*time.Second, func() bool { return ready() == nil }, "ready once Redis answers again")

	w.Stop()
	require.ErrorIs(t, ready(), tasks.ErrNotRunning, "once stopped")
}

// histogramSample is one child of a histogram: its count and sum.
type histogramSample struct {
	count uint64
	sum   float64
}

// histogram reads valruns_run_start_to_final_seconds{status} from reg.
func histogram(t testing.TB, reg prometheus.Gatherer, status string) histogramSample {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "valruns_run_start_to_final_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if hasLabels(m, []string{"status", status}) {
				return histogramSample{m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()}
			}
		}
	}
	t.Fatalf("no valruns_run_start_to_final_seconds{status=%q}", status)
	return histogramSample{}
}
