package tasks_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/internal/apitest"
	"github.com/valruns/valruns/internal/proctest"
	"github.com/valruns/valruns/tasks"
)

// Tests of the worker's recovery from lost work: Redis losing its tasks,
// a database error during a claim, Redis coming back to a staged backlog.
// (A worker killed mid-run is a process test: process_test.go.)

// startBodies starts n runs (every third one invalid, every other one with
// an Idempotency-Key) and returns their ids and expected final statuses.
func startBodies(t *testing.T, env *apitest.Env, org apitest.Org, wf, prefix string, n int) (ids []string, want map[string]string) {
	t.Helper()
	want = map[string]string{}
	for i := range n {
		var hdr []string
		if i%2 == 0 {
			hdr = []string{"Idempotency-Key", fmt.Sprintf("%s-%d", prefix, i)}
		}
		body, status := validOrder, "passed"
		if i%3 == 0 {
			body, status = invalidOrder, "failed"
		}
		id := startRun(t, env, org, wf, body, hdr...)
		ids = append(ids, id)
		want[id] = status
	}
	return ids, want
}

// requireFinishedOnce checks that every run ended with its expected status,
// as attempt 1, with its findings written once, and that nothing is left
// queued, running or staged.
func requireFinishedOnce(t *testing.T, env *apitest.Env, org apitest.Org, want map[string]string) {
	t.Helper()
	for id, status := range want {
		run := getRun(t, env, org, id)
		require.Equal(t, status, run.Status, "run %s", id)
		require.Equal(t, 1, run.Attempts, "run %s executed once", id)
		wantFindings := []finding{}
		if status == "failed" {
			wantFindings = invalidOrderFindings
		}
		require.Equal(t, wantFindings, run.Findings, "run %s", id)
		require.Equal(t, len(wantFindings), len(dbFindings(t, env, id)), "run %s: findings written once", id)
	}
	require.EqualValues(t, 0, env.Count("validation_runs", "status IN ('queued', 'running')"), "no run left behind")
	require.EqualValues(t, 0, env.Count("staged_jobs", ""))
}

// Finding: a billed run was never executed. The enqueuer had moved the
// staged jobs to Redis and deleted their rows, then Redis restarted without
// persistence and the tasks died with it; the runs stayed queued forever.
// Here the worker keeps running through the loss: its queue is paused so
// the tasks wait in Redis, Redis is killed and started again empty (which
// also forgets the pause), and every run must still finish, once.
func TestRedisLossAfterEnqueueRunsStillFinish(t *testing.T) {
	t.Parallel()
	srv := startRedisServer(t, proctest.FreePort(t))
	rdb := asynq.RedisClientOpt{Addr: srv.addr()}
	env := apitest.New(t)
	org := env.NewOrg("acme")
	wf := env.NewWorkflow(org, orderWorkflow)
	w := startWorker(t, env, rdb, nil)
	waitListening(t, env)
	require.Equal(t, "passed", waitRun(t, env, org, startRun(t, env, org, wf, validOrder), 20*time.Second).Status)

	insp := asynq.NewInspector(rdb)
	t.Cleanup(func() { _ = insp.Close() })
	require.NoError(t, insp.PauseQueue("default"))
	const n = 10
	ids, want := startBodies(t, env, org, wf, "lost", n)
	apitest.Eventually(t, 20*time.Second, func() bool { return env.Count("staged_jobs", "") == 0 },
		"the enqueuer moves every staged job to Redis and deletes its row")
	pending, err := insp.ListPendingTasks("default", asynq.PageSize(100))
	require.NoError(t, err)
	require.Len(t, pending, n, "the tasks wait in Redis only")
	require.EqualValues(t, n, env.Count("validation_runs", "status = 'queued'"))

	srv.stop() // SIGKILL, no persistence: every task is gone
	srv.start()

	for _, id := range ids {
		waitRun(t, env, org, id, 60*time.Second)
	}
	requireFinishedOnce(t, env, org, want)
	eventuallyMetric(t, w.Registry, n, "valruns_runs_redelivered_total", "reason", "queued")
}

// Finding: a PostgreSQL restart delayed runs by 26-39 s: the claim failed
// with 57P01 and asynq's own backoff (15 s and more) applied. Here the
// first three claims fail with that very error (a trigger raises it, as a
// restarting server does); the run must still pass within seconds, and
// those failures must not spend the run's retries (RUN_MAX_RETRY is 1).
func TestTransientDatabaseErrorIsRetriedWithinSeconds(t *testing.T) {
	t.Parallel()
	env := apitest.New(t)
	org := env.NewOrg("acme")
	wf := env.NewWorkflow(org, orderWorkflow)
	// A sequence, not a table: nextval survives the failed statement's rollback.
	require.NoError(t, env.DB.Exec(`
CREATE SEQUENCE test_claim_failures;
CREATE FUNCTION test_fail_claim() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF nextval('test_claim_failures') <= 3 THEN
		RAISE EXCEPTION 'terminating connection due to administrator command' USING ERRCODE = '57P01';
	END IF;
	RETURN NEW;
END $$;
CREATE TRIGGER test_fail_claim BEFORE UPDATE ON validation_runs FOR EACH ROW
	WHEN (OLD.status = 'queued' AND NEW.status = 'running') EXECUTE FUNCTION test_fail_claim();`).Error)
	w := startWorker(t, env, newRedis(t), func(c *tasks.Config) { c.RunMaxRetry = 1 })
	waitListening(t, env)

	id := startRun(t, env, org, wf, validOrder)
	run := waitRun(t, env, org, id, 20*time.Second)
	require.Equal(t, "passed", run.Status, "error: %v", run.Error)
	require.Equal(t, 1, run.Attempts, "the failed claims were rolled back")
	var calls int64
	require.NoError(t, env.DB.Raw(`SELECT last_value FROM test_claim_failures`).Scan(&calls).Error)
	require.EqualValues(t, 4, calls, "three failed claims, then the one that succeeded")
	eventuallyMetric(t, w.Registry, 3, "valruns_tasks_failed_total", "type", tasks.TypeRunExecute)
	eventuallyMetric(t, w.Registry, 1, "valruns_runs_finished_total", "status", "passed")
}

// Finding: after Redis came back with no new traffic, the staged backlog
// waited out the enqueuer's doubled backoff. While Redis is down, runs are
// started every 250 ms for 10 s: each start's NOTIFY wakes the enqueuer,
// whose drain fails (and, before the fix, doubled its backoff up to 30 s).
// Then the starts stop, and Redis comes back to no traffic at all: with the
// default poll interval (1 s), the backlog must drain within a few seconds.
func TestStagedBacklogDrainsPromptlyAfterRedisReturns(t *testing.T) {
	t.Parallel()
	srv := startRedisServer(t, proctest.FreePort(t))
	env := apitest.New(t)
	org := env.NewOrg("acme")
	wf := env.NewWorkflow(org, orderWorkflow)
	startWorker(t, env, asynq.RedisClientOpt{Addr: srv.addr()}, func(c *tasks.Config) { c.PollInterval = 0 })
	waitListening(t, env)
	require.Equal(t, "passed", waitRun(t, env, org, startRun(t, env, org, wf, validOrder), 20*time.Second).Status)

	srv.stop()
	var ids []string
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
		ids = append(ids, startRun(t, env, org, wf, validOrder))
	}
	// The last start's drain (a failing Redis call takes up to about 2 s) is over.
	time.Sleep(4 * time.Second)
	require.EqualValues(t, len(ids), env.Count("staged_jobs", ""), "nothing moves while Redis is down")

	srv.start()
	apitest.Eventually(t, 3*time.Second, func() bool { return env.Count("staged_jobs", "") == 0 },
		"the staged backlog drains within a few seconds of Redis returning, with no new traffic")
	want := map[string]string{}
	for _, id := range ids {
		waitRun(t, env, org, id, 20*time.Second)
		want[id] = "passed"
	}
	requireFinishedOnce(t, env, org, want)
}
