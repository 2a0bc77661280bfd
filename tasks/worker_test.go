package tasks_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/internal/apitest"
	"github.com/valruns/valruns/models"
	"github.com/valruns/valruns/tasks"
)

// A run started through the API is handed off after its commit, onto the
// ready list a worker waits on, and ends passed or failed with exactly the
// engine's findings, written once, in one write (the fast path).
func TestRunsExecuteThroughHandOff(t *testing.T) {
	t.Parallel()
	env := apitest.New(t)
	org := env.NewOrg("acme")
	wf := env.NewWorkflow(org, orderWorkflow)
	// A sweep only after a minute: runs are prompt because the API hands them off.
	w := newWorker(t, env, newRedis(t), func(c *tasks.Config) { c.SweepInterval, c.RedeliverAfter = time.Minute, time.Minute })
	require.NoError(t, w.Start(context.Background()))
	t.Cleanup(w.Stop)
	handOff(t, env, w.Redis)

	tests := []struct {
		name    string
		body    any
		headers []string
		status  string
		want    []finding
	}{
		{"valid, with Idempotency-Key", validOrder, []string{"Idempotency-Key", "order-1"}, "passed", []finding{}},
		{"invalid, without key", invalidOrder, nil, "failed", invalidOrderFindings},
		{"invalid, with key", invalidOrder, []string{"Idempotency-Key", "order-2"}, "failed", invalidOrderFindings},
		{"warning only", hugeOrder, nil, "passed", hugeOrderFindings},
	}
	ids := map[string]string{}
	for _, tt := range tests {
		ids[tt.name] = startRun(t, env, org, wf, tt.body, tt.headers...)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			run := waitRun(t, env, org, ids[tt.name], 20*time.Second)
			require.Equal(t, tt.status, run.Status)
			require.Equal(t, tt.want, run.Findings)
			require.Nil(t, run.Error)
			require.Equal(t, 1, run.Attempts)
			row := readRun(t, env, run.ID)
			require.NotNil(t, row.FinishedAt)
			require.False(t, row.LeaseSet, "a finished run holds no lease")
		})
	}

	// A replay of a keyed start returns the same run and executes nothing again.
	r := env.Do(http.MethodPost, "/api/workflows/"+wf+"/start/", org.Token, validOrder, "Idempotency-Key", "order-1")
	require.Equal(t, http.StatusCreated, r.Status)
	require.Equal(t, "true", r.Header.Get("Idempotent-Replayed"))
	require.Equal(t, ids[tests[0].name], r.Map(t)["id"])
	require.EqualValues(t, len(tests), env.Count("validation_runs", ""))
	require.EqualValues(t, 2+2+1, countFindings(t, env), "each run's findings once")
	eventuallyMetric(t, w.Registry, float64(len(tests)), "valruns_tasks_processed_total", "type", tasks.TypeRunExecute)
}

// The same run delivered twice (two run tasks with different TaskIDs, as
// an earlier version left them in Redis: each pushes the run onto ready)
// is executed once: findings written once, one attempt.
func TestDuplicateDeliveryExecutesOnce(t *testing.T) {
	t.Parallel()
	env := apitest.New(t)
	org := env.NewOrg("acme")
	wf := env.NewWorkflow(org, orderWorkflow)
	rdb := newRedis(t)

	// Both queued before any worker runs, so both deliveries wait together.
	id := startRun(t, env, org, wf, invalidOrder)
	client := asynq.NewClient(rdb)
	defer client.Close()
	for _, tid := range []string{models.RunTaskIDPrefix + id, models.RunTaskIDPrefix + id + ":duplicate"} {
		_, err := client.Enqueue(tasks.NewRunTask(id, false), asynq.TaskID(tid), asynq.Retention(time.Hour))
		require.NoError(t, err)
	}

	w := startWorker(t, env, rdb, func(c *tasks.Config) { c.RunLease = 2 * time.Second })
	// Both deliveries complete: the second finds the run held by the first
	// (and leaves it to that one) or finished.
	eventuallyMetric(t, w.Registry, 2, "valruns_tasks_processed_total", "type", tasks.TypeRunExecute)

	run := getRun(t, env, org, id)
	require.Equal(t, "failed", run.Status)
	require.Equal(t, invalidOrderFindings, run.Findings)
	require.Equal(t, 1, run.Attempts)
	require.Equal(t, invalidOrderFindings, dbFindings(t, env, id))
	require.EqualValues(t, 1, metricValue(t, w.Registry, "valruns_runs_finished_total"), "the run finished once")
	require.EqualValues(t, 2, metricValue(t, w.Registry, "valruns_tasks_processed_total", "type", tasks.TypeRunExecute))
}

// Calling the handler again for a run that finished changes nothing.
func TestProcessTaskOfFinishedRunIsANoop(t *testing.T) {
	env := apitest.New(t)
	org := env.NewOrg("acme")
	wf := env.NewWorkflow(org, orderWorkflow)
	w := newWorker(t, env, idleRedis(), nil)
	id := startRun(t, env, org, wf, invalidOrder)
	task := tasks.NewRunTask(id, false)
	ctx := context.Background()

	require.NoError(t, tasks.Deliver(ctx, w.Worker, task))
	first := readRun(t, env, id)
	require.Equal(t, "failed", first.Status)
	require.Equal(t, 1, first.Attempts)
	require.Equal(t, invalidOrderFindings, dbFindings(t, env, id))

	for range 3 {
		require.NoError(t, tasks.Deliver(ctx, w.Worker, task))
	}
	again := readRun(t, env, id)
	require.Equal(t, first.Status, again.Status)
	require.Equal(t, 1, again.Attempts, "not executed again")
	require.True(t, first.FinishedAt.Equal(*again.FinishedAt), "finished once")
	require.Equal(t, invalidOrderFindings, dbFindings(t, env, id))
	require.EqualValues(t, 1, metricValue(t, w.Registry, "valruns_runs_finished_total"))

	// A run that does not exist (deleted meanwhile) is dropped, not retried.
	for _, redelivery := range []bool{false, true} {
		gone := tasks.NewRunTask("00000000-0000-0000-0000-000000000000", redelivery)
		require.NoError(t, tasks.Deliver(ctx, w.Worker, gone))
	}
	// A payload that names no run can never succeed.
	require.ErrorIs(t, tasks.Deliver(ctx, w.Worker, asynq.NewTask(tasks.TypeRunExecute, []byte(`{}`))), asynq.SkipRetry)
}

// Two deliveries of the same queued run at the same moment: exactly one
// executes it; the other finds it finished, or finds it held and leaves it
// to the holder.
func TestConcurrentDeliveriesExecuteOnce(t *testing.T) {
	env := apitest.New(t)
	org := env.NewOrg("acme")
	wf := env.NewWorkflow(org, orderWorkflow)
	w := newWorker(t, env, idleRedis(), nil)
	const rounds = 10
	for i := range rounds {
		id := startRun(t, env, org, wf, invalidOrder)
		task := tasks.NewRunTask(id, i%2 == 1) // the fast path, then the claimed one
		start := make(chan struct{})
		errs := make([]error, 2)
		var wg sync.WaitGroup
		for g := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				errs[g] = tasks.Deliver(context.Background(), w.Worker, task)
			}()
		}
		close(start)
		wg.Wait()
		for _, err := range errs {
			require.NoError(t, err, "round %d", i)
		}
		run := readRun(t, env, id)
		require.Equal(t, "failed", run.Status, "round %d", i)
		require.Equal(t, 1, run.Attempts, "round %d: claimed once", i)
		require.Equal(t, invalidOrderFindings, dbFindings(t, env, id), "round %d: findings written once", i)
	}
	require.EqualValues(t, rounds, metricValue(t, w.Registry, "valruns_runs_finished_total", "status", "failed"))
}

// The worker's metrics after some runs and a cleanup.
func TestWorkerMetrics(t *testing.T) {
	t.Parallel()
	env := apitest.New(t)
	org := env.NewOrg("acme")
	wf := env.NewWorkflow(org, orderWorkflow)
	w := newWorker(t, env, newRedis(t), nil)
	require.NoError(t, w.Start(context.Background()))
	t.Cleanup(w.Stop)
	handOff(t, env, w.Redis)

	ids := []string{
		startRun(t, env, org, wf, validOrder),
		startRun(t, env, org, wf, validOrder, "Idempotency-Key", "m-1"),
		startRun(t, env, org, wf, invalidOrder),
	}
	for _, id := range ids {
		waitRun(t, env, org, id, 20*time.Second)
	}
	insertKeys(t, env, org.ID, "old-", 25, true)
	require.NoError(t, w.Mux().ProcessTask(context.Background(), asynq.NewTask(tasks.TypeCleanup, nil)))

	reg := w.Registry
	eventuallyMetric(t, reg, 3, "valruns_tasks_processed_total", "type", tasks.TypeRunExecute)
	eventuallyMetric(t, reg, 1, "valruns_tasks_processed_total", "type", tasks.TypeCleanup)
	eventuallyMetric(t, reg, 2, "valruns_runs_finished_total", "status", "passed")
	eventuallyMetric(t, reg, 1, "valruns_runs_finished_total", "status", "failed")
	eventuallyMetric(t, reg, 25, "valruns_idempotency_keys_deleted_total")
	require.EqualValues(t, 0, metricValue(t, reg, "valruns_runs_finished_total", "status", "error"))
	require.EqualValues(t, 0, metricValue(t, reg, "valruns_tasks_failed_total"))
}

// A run that can never execute (its workflow no longer compiles) ends in
// status error with the reason, without waiting for retries.
func TestRunThatCannotExecuteEndsInError(t *testing.T) {
	t.Parallel()
	env := apitest.New(t)
	org := env.NewOrg("acme")
	wf := env.NewWorkflow(org, orderWorkflow)
	require.NoError(t, env.DB.Exec(`UPDATE workflows SET assertions = '[{"name":"x","expr":"((","severity":"error"}]' WHERE id = ?`, wf).Error)
	rdb := newRedis(t)
	w := startWorker(t, env, rdb, func(c *tasks.Config) { c.RunMaxRetry = 1 })

	id := startRun(t, env, org, wf, validOrder)
	run := waitRun(t, env, org, id, 20*time.Second)
	require.Equal(t, "error", run.Status)
	require.NotNil(t, run.Error)
	require.Contains(t, *run.Error, "compile workflow")
	require.Empty(t, run.Findings)
	require.Equal(t, 1, run.Attempts, "not retried: it cannot heal")
	require.False(t, readRun(t, env, id).LeaseSet)
	eventuallyMetric(t, w.Registry, 1, "valruns_runs_finished_total", "status", "error")
	rc := redisClient(rdb)
	defer rc.Close()
	require.Zero(t, rc.HLen(context.Background(), tasks.RetryIndex).Val(), "no retry scheduled")
}

// A run past a validation limit (here a CEL assertion that doubles a string
// until it passes validate.MaxValueSize; the workflow passes the create-time
// checks) ends in status error with the limit named, at once and without
// retries, and writes no finding: retrying the same submission cannot help.
func TestRunPastAValidationLimitEndsInError(t *testing.T) {
	t.Parallel()
	env := apitest.New(t)
	org := env.NewOrg("acme")
	doubling := `["ab"]` + strings.Repeat(`.map(s, s + s)`, 24) + `[0] == ""`
	wf := env.NewWorkflow(org, map[string]any{"name": "greedy", "assertions": []map[string]any{
		{"name": "doubling", "expr": doubling, "severity": "error"}}})
	w := startWorker(t, env, newRedis(t), func(c *tasks.Config) { c.RunMaxRetry = 3 })

	id := startRun(t, env, org, wf, validOrder)
	run := waitRun(t, env, org, id, 20*time.Second)
	require.Equal(t, "error", run.Status)
	require.NotNil(t, run.Error)
	require.Contains(t, *run.Error, "MaxValueSize")
	require.Contains(t, *run.Error, "doubling", "the reason names the assertion")
	require.Empty(t, run.Findings)
	require.Equal(t, 1, run.Attempts, "not retried")
	eventuallyMetric(t, w.Registry, 1, "valruns_runs_finished_total", "status", "error")
	require.Zero(t, metricValue(t, w.Registry, "valruns_tasks_failed_total", "type", tasks.TypeRunExecute), "no failed execution to retry")
}

// A run whose task keeps failing (here: the database refuses to finish it)
// is retried, and ends in status error with the reason once the retries are
// exhausted. The failed attempt releases its lease, so the retry (after
// RUN_RETRY_DELAY, here 100 ms) claims the run at once.
func TestRunFailingUntilRetriesExhaustedEndsInError(t *testing.T) {
	t.Parallel()
	env := apitest.New(t)
	org := env.NewOrg("acme")
	wf := env.NewWorkflow(org, orderWorkflow)
	require.NoError(t, env.DB.Exec(`
CREATE FUNCTION test_refuse_finish() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'test: finishing runs is refused'; END $$;
CREATE TRIGGER test_refuse_finish BEFORE UPDATE ON validation_runs FOR EACH ROW
	WHEN (NEW.status IN ('passed', 'failed')) EXECUTE FUNCTION test_refuse_finish();`).Error)
	w := startWorker(t, env, newRedis(t), func(c *tasks.Config) { c.RunMaxRetry = 1 })

	id := startRun(t, env, org, wf, validOrder)
	run := waitRun(t, env, org, id, 20*time.Second)
	require.Equal(t, "error", run.Status)
	require.NotNil(t, run.Error)
	require.Contains(t, *run.Error, "gave up after 2 attempts")
	require.Contains(t, *run.Error, "finishing runs is refused")
	require.Equal(t, 2, run.Attempts)
	require.Empty(t, run.Findings)
	eventuallyMetric(t, w.Registry, 1, "valruns_runs_finished_total", "status", "error")
	eventuallyMetric(t, w.Registry, 2, "valruns_tasks_failed_total", "type", tasks.TypeRunExecute)
}

// Findings longer than their columns allow are stored truncated and the run
// finishes: a schema finding at a very long property name (path over the
// column's 2000 characters), and an assertion message of multi-byte
// characters over 4000 bytes (a byte cut splits a rune, which PostgreSQL
// refuses). Otherwise Finish fails on every retry and the run ends in error.
func TestLongFindingsAreTruncatedAndStored(t *testing.T) {
	env := apitest.New(t)
	org := env.NewOrg("acme")
	w := newWorker(t, env, idleRedis(), nil)
	longKey := strings.Repeat("k", 2100)
	longMessage := strings.Repeat("€", 1400) // 4200 bytes

	tests := []struct {
		name       string
		workflow   map[string]any
		submission map[string]any
		check      func(t *testing.T, f finding)
	}{
		{
			name:       "path over 2000 characters",
			workflow:   map[string]any{"name": "long path", "schema": json.RawMessage(`{"type": "object", "additionalProperties": {"type": "string"}}`)},
			submission: map[string]any{longKey: 1},
			check: func(t *testing.T, f finding) {
				require.Equal(t, "schema", f.Step)
				require.LessOrEqual(t, utf8.RuneCountInString(f.Path), 2000)
				require.True(t, strings.HasPrefix("/"+longKey, f.Path))
			},
		},
		{
			name:       "multi-byte message over 4000 bytes",
			workflow:   map[string]any{"name": "long message", "assertions": []map[string]any{{"name": "never", "expr": "false", "message": longMessage}}},
			submission: map[string]any{"a": 1},
			check: func(t *testing.T, f finding) {
				require.Equal(t, "assertion:never", f.Step)
				require.True(t, utf8.ValidString(f.Message))
				require.LessOrEqual(t, utf8.RuneCountInString(f.Message), 4000)
				require.True(t, strings.HasPrefix(longMessage, f.Message))
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wf := env.NewWorkflow(org, tt.workflow)
			id := startRun(t, env, org, wf, map[string]any{"submission": tt.submission})
			require.NoError(t, tasks.Deliver(context.Background(), w.Worker, tasks.NewRunTask(id, false)))
			require.Equal(t, "failed", readRun(t, env, id).Status)
			fs := dbFindings(t, env, id)
			require.Len(t, fs, 1)
			tt.check(t, fs[0])
		})
	}
}

// A run claimed by a worker that then died (its lease is never renewed):
// once the lease has run out, the sweeper hands it on, and that delivery
// claims it and finishes it once, as attempt 2.
func TestDeadWorkersRunIsRedeliveredWhenItsLeaseRunsOut(t *testing.T) {
	t.Parallel()
	env := apitest.New(t)
	org := env.NewOrg("acme")
	wf := env.NewWorkflow(org, orderWorkflow)
	id := startRun(t, env, org, wf, invalidOrder)
	// A worker that claimed the run with a 2 s lease and died.
	_, err := models.NewRunStore(env.DB).Claim(context.Background(), id, 2*time.Second, 6)
	require.NoError(t, err)

	rdb := newRedis(t)
	w := startWorker(t, env, rdb, fastSweep)
	run := waitRun(t, env, org, id, 30*time.Second)
	require.Equal(t, "failed", run.Status)
	require.Equal(t, 2, readRun(t, env, id).Attempts, "taken over as attempt 2")
	require.Equal(t, invalidOrderFindings, dbFindings(t, env, id), "findings written once")
	// Attempt 2 is the sweeper's redelivery (nothing else delivers this
	// run). Its count is not asserted: the sweeper counts a redelivery only
	// when the run's row is free, and one whose delivery was already writing
	// it goes uncounted (nothing waits on it).
	require.EqualValues(t, 0, metricValue(t, w.Registry, "valruns_runs_redelivered_total", "reason", "queued"))
}
