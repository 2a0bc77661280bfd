package tasks_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/internal/apitest"
	"github.com/valruns/valruns/internal/proctest"
	"github.com/valruns/valruns/models"
	"github.com/valruns/valruns/tasks"
)

// The enqueuer wakes on a start's NOTIFY (its poll is an hour here), and
// listens again after its LISTEN connection is killed.
func TestEnqueuerWakesOnNotifyAndListensAgain(t *testing.T) {
	t.Parallel()
	env := apitest.New(t)
	org := env.NewOrg("acme")
	wf := env.NewWorkflow(org, orderWorkflow)
	startWorker(t, env, newRedis(t), func(c *tasks.Config) { c.PollInterval = time.Hour })

	listener := func() int {
		var pids []int
		require.NoError(t, env.DB.Raw(`SELECT pid FROM pg_stat_activity
			WHERE datname = current_database() AND query LIKE 'LISTEN %'`).Scan(&pids).Error)
		if len(pids) != 1 {
			return 0
		}
		return pids[0]
	}
	var pid int
	apitest.Eventually(t, 20*time.Second, func() bool { pid = listener(); return pid != 0 }, "the enqueuer listens")

	id := startRun(t, env, org, wf, validOrder)
	require.Equal(t, "passed", waitRun(t, env, org, id, 20*time.Second).Status, "woken by NOTIFY, not by the poll")

	var killed bool
	require.NoError(t, env.DB.Raw(`SELECT pg_terminate_backend(?)`, pid).Scan(&killed).Error)
	require.True(t, killed)
	apitest.Eventually(t, 30*time.Second, func() bool { p := listener(); return p != 0 && p != pid }, "the enqueuer listens again")

	id = startRun(t, env, org, wf, invalidOrder)
	require.Equal(t, "failed", waitRun(t, env, org, id, 20*time.Second).Status, "woken by NOTIFY on the new connection")
	require.EqualValues(t, 0, env.Count("staged_jobs", ""))
}

// A staged job sent twice (a crash between enqueue and delete) is one asynq
// task: the TaskID conflict is swallowed and the row is deleted.
func TestEnqueueSameStagedJobTwiceMakesOneTask(t *testing.T) {
	env := apitest.New(t)
	org := env.NewOrg("acme")
	wf := env.NewWorkflow(org, orderWorkflow)
	rdb := newRedis(t)
	w := newWorker(t, env, rdb, nil) // not started: the task stays pending for the inspector
	id := startRun(t, env, org, wf, validOrder)

	var job models.StagedJob
	require.NoError(t, env.DB.Raw(`SELECT * FROM staged_jobs`).Scan(&job).Error)
	require.Equal(t, models.RunTaskIDPrefix+id, job.TaskID)
	require.Equal(t, tasks.TypeRunExecute, job.JobName)

	ctx := context.Background()
	require.NoError(t, w.Enqueuer().DrainAll(ctx))
	require.EqualValues(t, 0, env.Count("staged_jobs", ""))
	// The crash: the row comes back as if its delete had not committed.
	require.NoError(t, env.DB.Exec(`INSERT INTO staged_jobs (job_name, job_args, task_id) VALUES (?, ?, ?)`,
		job.JobName, string(job.JobArgs), job.TaskID).Error)
	require.NoError(t, w.Enqueuer().DrainAll(ctx), "ErrTaskIDConflict is not an error")
	require.EqualValues(t, 0, env.Count("staged_jobs", ""))

	insp := asynq.NewInspector(rdb)
	defer insp.Close()
	pending, err := insp.ListPendingTasks("default", asynq.PageSize(100))
	require.NoError(t, err)
	require.Len(t, pending, 1)
	require.Equal(t, job.TaskID, pending[0].ID)
	require.Equal(t, tasks.TypeRunExecute, pending[0].Type)
	var p tasks.RunPayload
	require.NoError(t, json.Unmarshal(pending[0].Payload, &p))
	require.Equal(t, id, p.RunID)
	require.EqualValues(t, 2, metricValue(t, w.Registry, "valruns_staged_jobs_enqueued_total"))
	require.EqualValues(t, 0, metricValue(t, w.Registry, "valruns_staged_jobs_backlog"))
}

// While Redis is down, starts still answer 201 (they only write
// PostgreSQL) and their jobs stay staged; when Redis is back (empty), every
// run completes.
func TestRedisDownStartsAccumulateThenDrain(t *testing.T) {
	t.Parallel()
	port := proctest.FreePort(t)
	srv := startRedisServer(t, port)
	env := apitest.New(t)
	org := env.NewOrg("acme")
	wf := env.NewWorkflow(org, orderWorkflow)
	w := startWorker(t, env, asynq.RedisClientOpt{Addr: srv.addr()}, nil)

	before := startRun(t, env, org, wf, validOrder)
	require.Equal(t, "passed", waitRun(t, env, org, before, 20*time.Second).Status)

	srv.stop()
	const n = 10
	ids := make([]string, 0, n)
	for i := range n {
		hdr := []string{}
		if i%2 == 0 {
			hdr = []string{"Idempotency-Key", fmt.Sprintf("down-%d", i)}
		}
		body := validOrder
		if i%3 == 0 {
			body = invalidOrder
		}
		ids = append(ids, startRun(t, env, org, wf, body, hdr...))
	}
	require.EqualValues(t, n, env.Count("staged_jobs", ""), "jobs stay staged while Redis is down")
	require.EqualValues(t, n, env.Count("validation_runs", "status = 'queued'"))
	require.EqualValues(t, n, metricValue(t, w.Registry, "valruns_staged_jobs_backlog"))

	srv.start() // same port, empty
	for i, id := range ids {
		run := waitRun(t, env, org, id, 60*time.Second)
		want := "passed"
		if i%3 == 0 {
			want = "failed"
		}
		require.Equal(t, want, run.Status)
		require.Equal(t, 1, run.Attempts)
	}
	require.EqualValues(t, 0, env.Count("validation_runs", "status IN ('queued', 'running')"), "no run left behind")
	require.EqualValues(t, 0, env.Count("staged_jobs", ""))
	require.EqualValues(t, 0, metricValue(t, w.Registry, "valruns_staged_jobs_backlog"))
}
