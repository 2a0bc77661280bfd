package tasks_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/internal/apitest"
	"github.com/valruns/valruns/models"
	"github.com/valruns/valruns/tasks"
)

// singleNode makes env's API hand its runs off as serve --worker does:
// to w at once when it takes them, else to the queue (d).
func singleNode(env *apitest.Env, w *testWorker, d *tasks.Dispatcher) {
	env.SetHandOff(func(r *models.QueuedRun) {
		if !w.RunHere(r) {
			d.HandOff(r)
		}
	})
}

// The tests of RunHere run their worker as serve --worker does
// (SingleNode), the only worker RunHere is called on in valruns: one that
// pops from the direct hand-off holds its lane's free slots while its pop
// waits (fetch), and RunHere would race it.

// No sweep within a test: a run the lane lost would stay queued.
func noSweep(c *tasks.Config) { c.SweepInterval, c.RedeliverAfter = time.Minute, time.Minute }

// An idle single-node worker executes the runs its process starts at once,
// without the queue: each once, with its findings, and no task is
// processed.
func TestRunHereExecutesWithoutTheQueue(t *testing.T) {
	t.Parallel()
	env := apitest.New(t)
	org := env.NewOrg("acme")
	wf := env.NewWorkflow(org, orderWorkflow)
	rdb := newRedis(t)
	w := startWorker(t, env, rdb, func(c *tasks.Config) { noSweep(c); c.SingleNode = true })
	var queued atomic.Int32
	d := handOff(t, env, rdb)
	env.SetHandOff(func(r *models.QueuedRun) {
		if !w.RunHere(r) {
			queued.Add(1)
			d.HandOff(r)
		}
	})

	valid := startRun(t, env, org, wf, validOrder, "Idempotency-Key", "local-1")
	invalid := startRun(t, env, org, wf, invalidOrder)
	run := waitRun(t, env, org, valid, 20*time.Second)
	require.Equal(t, "passed", run.Status)
	require.Equal(t, 1, run.Attempts)
	run = waitRun(t, env, org, invalid, 20*time.Second)
	require.Equal(t, "failed", run.Status)
	require.Equal(t, invalidOrderFindings, run.Findings)
	require.Equal(t, invalidOrderFindings, dbFindings(t, env, invalid), "findings written once")

	require.Zero(t, queued.Load(), "the idle worker took every run")
	require.EqualValues(t, 2, metricValue(t, w.Registry, "valruns_runs_local_total", "result", "finished"))
	require.EqualValues(t, 2, metricValue(t, w.Registry, "valruns_runs_finished_total"))
	require.Zero(t, metricValue(t, w.Registry, "valruns_tasks_processed_total", "type", tasks.TypeRunExecute), "no task went through the queue")
}

// A run the fast path cannot decide in time goes to the queue as a
// redelivery and is executed there under a claim: once, not lost.
func TestRunHereHandsAnUndecidedRunToTheQueue(t *testing.T) {
	t.Parallel()
	env := apitest.New(t)
	org := env.NewOrg("acme")
	wf := env.NewWorkflow(org, orderWorkflow)
	rdb := newRedis(t)
	w := startWorker(t, env, rdb, func(c *tasks.Config) {
		noSweep(c)
		c.FastBudget = 100 * time.Millisecond
		c.SingleNode = true
	})
	var calls atomic.Int32
	tasks.SetBeforeRun(w.Worker, func(ctx context.Context, _ string) {
		if calls.Add(1) == 1 {
			<-ctx.Done() // the first validation outlasts the budget
		}
	})
	singleNode(env, w, handOff(t, env, rdb))

	id := startRun(t, env, org, wf, invalidOrder)
	run := waitRun(t, env, org, id, 20*time.Second)
	require.Equal(t, "failed", run.Status)
	require.Equal(t, 1, run.Attempts)
	require.Equal(t, invalidOrderFindings, dbFindings(t, env, id), "findings written once")
	require.EqualValues(t, 2, calls.Load(), "validated here, then under a claim")
	require.EqualValues(t, 1, metricValue(t, w.Registry, "valruns_runs_local_total", "result", "queued"))
	eventuallyMetric(t, w.Registry, 1, "valruns_tasks_processed_total", "type", tasks.TypeRunExecute)
}

// The lane takes a run only while the worker runs and one of its slots (4
// per WORKER_CONCURRENCY, and one more: serve --worker's worker, the only
// one RunHere is called on, pops nothing from the direct hand-off) is free;
// a run it refuses is untouched (the caller queues it).
func TestRunHereNeedsARunningWorkerAndAFreeSlot(t *testing.T) {
	t.Parallel()
	env := apitest.New(t)
	org := env.NewOrg("acme")
	wf := env.NewWorkflow(org, orderWorkflow)
	rdb := newRedis(t)
	w := newWorker(t, env, rdb, func(c *tasks.Config) {
		noSweep(c)
		c.Concurrency = 1
		c.SingleNode = true
	})
	queued := func() *models.QueuedRun {
		id := startRun(t, env, org, wf, validOrder)
		q, err := models.NewRunStore(env.DB).Queued(context.Background(), id)
		require.NoError(t, err)
		q.OrgID = org.ID
		return q
	}
	held := []*models.QueuedRun{queued(), queued(), queued(), queued(), queued()}
	extra := queued()
	require.False(t, w.RunHere(held[0]), "not started")

	require.NoError(t, w.Start(context.Background()))
	t.Cleanup(w.Stop)
	hold := make(chan struct{})
	tasks.SetBeforeRun(w.Worker, func(ctx context.Context, id string) {
		if id != extra.ID {
			<-hold
		}
	})
	for _, q := range held {
		require.True(t, w.RunHere(q))
	}
	require.False(t, w.RunHere(extra), "its 5 slots are taken")
	require.Equal(t, "queued", readRun(t, env, extra.ID).Status)
	close(hold)
	for _, q := range held {
		require.Equal(t, "passed", waitRun(t, env, org, q.ID, 20*time.Second).Status)
	}
	apitest.Eventually(t, 10*time.Second, func() bool { return w.RunHere(extra) }, "a slot is free again")
	require.Equal(t, "passed", waitRun(t, env, org, extra.ID, 20*time.Second).Status)

	w.Stop()
	require.False(t, w.RunHere(queued()), "stopped")
}
