package tasks_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/internal/apitest"
	"github.com/valruns/valruns/internal/proctest"
	"github.com/valruns/valruns/models"
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
// queued or running.
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
}

// Finding: a billed run was never executed. Its task was in Redis only,
// then Redis restarted without persistence and the tasks died with it; the
// runs stayed queued forever.
// Here the worker keeps running through the loss: its queue is paused so
// the tasks wait in Redis, Redis is killed and started again empty (which
// also forgets the pause), and every run must still finish, once. The
// sweeper runs every 100 ms here; with the defaults (RUN_SWEEP_INTERVAL=10s,
// RUN_REDELIVER_AFTER=10s) the same takes about 20 s.
func TestRedisLossAfterEnqueueRunsStillFinish(t *testing.T) {
	t.Parallel()
	// share 0: every run is in asynq's queue when Redis dies; 3: three
	// are, the other seven wait their turn at the gate, which dies too.
	for _, share := range []int{0, 3} {
		t.Run(fmt.Sprintf("share %d", share), func(t *testing.T) {
			t.Parallel()
			redisLossAfterEnqueue(t, share)
		})
	}
}

func redisLossAfterEnqueue(t *testing.T, share int) {
	srv := startRedisServer(t, proctest.FreePort(t))
	rdb := asynq.RedisClientOpt{Addr: srv.addr()}
	env := apitest.New(t)
	org := env.NewOrg("acme")
	require.NoError(t, models.NewOrgStore(env.DB).SetRunShare(context.Background(), org.ID, new(share)))
	wf := env.NewWorkflow(org, orderWorkflow)
	startWorker(t, env, rdb, fastSweep)
	require.Equal(t, "passed", waitRun(t, env, org, startRun(t, env, org, wf, validOrder), 20*time.Second).Status)

	insp := asynq.NewInspector(rdb)
	t.Cleanup(func() { _ = insp.Close() })
	require.NoError(t, insp.PauseQueue("default"))
	const n = 10
	ids, want := startBodies(t, env, org, wf, "lost", n)
	// Every run waits in Redis: its task in the queue, or at the gate (with a
	// share, most do). A hand-off slower than RUN_REDELIVER_AFTER (a loaded
	// machine) may have a run enqueued by the sweeper too: counts of tasks
	// would then be off by one, so look for every run by its id.
	apitest.Eventually(t, 20*time.Second, func() bool {
		queued, waiting := tasks.RunsInRedis(t, rdb)
		for _, id := range ids {
			if !queued[id] && !waiting[id] {
				return false
			}
		}
		return share == 0 || len(waiting) > 0
	}, "the API hands every run to Redis (its queue, or the gate's waiting list)")
	require.EqualValues(t, n, env.Count("validation_runs", "status = 'queued'"))

	srv.stop() // SIGKILL, no persistence: every task is gone, and the gate with them
	srv.start()
	back := time.Now()
	for _, id := range ids {
		waitRun(t, env, org, id, 60*time.Second)
	}
	t.Logf("all %d runs final %s after Redis answered again", n, time.Since(back).Round(100*time.Millisecond))
	// The promise: every run final, executed once. Not which path got it
	// there: a run can also finish without the sweeper (a task of it that
	// survived in asynq's own bookkeeping), so the redelivery count is not
	// asserted.
	requireFinishedOnce(t, env, org, want)
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
	WHEN (OLD.status = 'queued' AND NEW.status <> 'queued') EXECUTE FUNCTION test_fail_claim();`).Error)
	w := startWorker(t, env, newRedis(t), func(c *tasks.Config) {
		c.RunMaxRetry = 1
		c.RetryDelay = 0 // the default
	})

	id := startRun(t, env, org, wf, validOrder)
	run := waitRun(t, env, org, id, 20*time.Second)
	require.Equal(t, "passed", run.Status, "error: %v", run.Error)
	require.Equal(t, 1, run.Attempts, "the failed claims were rolled back")
	var calls int64
	require.NoError(t, env.DB.Raw(`SELECT last_value FROM test_claim_failures`).Scan(&calls).Error)
	require.EqualValues(t, 4, calls, "three failed writes, then the one that succeeded")
	eventuallyMetric(t, w.Registry, 3, "valruns_tasks_failed_total", "type", tasks.TypeRunExecute)
	eventuallyMetric(t, w.Registry, 1, "valruns_runs_finished_total", "status", "passed")
}

// Runs started while Redis is down are not lost: the API cannot hand them
// off (it keeps trying until RUN_REDELIVER_AFTER), they stay queued in
// PostgreSQL, and once Redis answers again the hand-off or the sweeper
// enqueues each, and each finishes, once.
func TestRunsHandedOffWhileRedisIsDownFinishOnceItReturns(t *testing.T) {
	t.Parallel()
	srv := startRedisServer(t, proctest.FreePort(t))
	env := apitest.New(t)
	org := env.NewOrg("acme")
	wf := env.NewWorkflow(org, orderWorkflow)
	w := startWorker(t, env, asynq.RedisClientOpt{Addr: srv.addr()}, fastSweep)
	require.Equal(t, "passed", waitRun(t, env, org, startRun(t, env, org, wf, validOrder), 20*time.Second).Status)

	srv.stop()
	var ids []string
	for range 10 {
		ids = append(ids, startRun(t, env, org, wf, validOrder))
	}
	require.EqualValues(t, len(ids), env.Count("validation_runs", "status = 'queued'"), "nothing runs while Redis is down")

	srv.start()
	back := time.Now()
	want := map[string]string{}
	for _, id := range ids {
		waitRun(t, env, org, id, 60*time.Second)
		want[id] = "passed"
	}
	t.Logf("%d runs final %s after Redis answered again", len(ids), time.Since(back).Round(10*time.Millisecond))
	requireFinishedOnce(t, env, org, want)
	eventuallyMetric(t, w.Registry, float64(len(ids)+1), "valruns_runs_finished_total")
}

// A run that executes for several leases keeps its lease by heartbeating:
// the sweeper (looking every 100 ms) never takes it over, no second attempt
// starts, and it finishes as attempt 1. The validation lasts until the
// lease its claim took has been over for a whole lease (read from the
// database, so on any machine the run outlives two leases); without the
// heartbeat, the sweeper would hand the run to another delivery.
func TestHeartbeatKeepsALongRunLeased(t *testing.T) {
	t.Parallel()
	env := apitest.New(t)
	org := env.NewOrg("acme")
	wf := env.NewWorkflow(org, orderWorkflow)
	var lease time.Duration
	w := newWorker(t, env, newRedis(t), func(c *tasks.Config) { fastSweep(c); claimedPath(c); lease = c.RunLease })
	tasks.SetBeforeRun(w.Worker, func(ctx context.Context, id string) {
		var claimed time.Time
		require.NoError(t, env.DB.Raw(`SELECT lease_expires_at FROM validation_runs WHERE id = ?`, id).Scan(&claimed).Error)
		for ctx.Err() == nil {
			var past bool
			require.NoError(t, env.DB.Raw(`SELECT clock_timestamp() > ?`, claimed.Add(lease)).Scan(&past).Error)
			if past {
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	})
	require.NoError(t, w.Start(context.Background()))
	t.Cleanup(w.Stop)
	handOff(t, env, w.Redis)

	id := startRun(t, env, org, wf, validOrder)
	run := waitRun(t, env, org, id, 60*time.Second)
	require.Equal(t, "passed", run.Status)
	require.Equal(t, 1, run.Attempts, "never taken over")
	// Never taken over for its lease. (A hand-off slower than
	// RUN_REDELIVER_AFTER on a loaded machine may have the sweeper enqueue
	// the run while still queued, reason "queued": that delivery finds it
	// held and leaves it.)
	require.EqualValues(t, 0, metricValue(t, w.Registry, "valruns_runs_redelivered_total", "reason", "lease_expired"))
	require.EqualValues(t, 0, metricValue(t, w.Registry, "valruns_run_leases_lost_total"))
	eventuallyMetric(t, w.Registry, 1, "valruns_runs_finished_total", "status", "passed")
}

// A delivery whose run is taken over while it executes (its lease ran out
// and another delivery claimed the run as attempt 2) learns it at its next
// heartbeat: its execution's context ends, it writes nothing, and the run
// stays with attempt 2.
func TestLostLeaseStopsTheExecution(t *testing.T) {
	t.Parallel()
	env := apitest.New(t)
	org := env.NewOrg("acme")
	wf := env.NewWorkflow(org, orderWorkflow)
	w := newWorker(t, env, idleRedis(), func(c *tasks.Config) {
		claimedPath(c)
		c.RunLease = time.Second
		c.RunHeartbeat = 100 * time.Millisecond
	})
	store := models.NewRunStore(env.DB)
	stopped := false
	tasks.SetBeforeRun(w.Worker, func(ctx context.Context, id string) {
		// Another delivery takes the run over: the lease ran out (forced
		// here) and it claims the run.
		require.NoError(t, env.DB.Exec(`UPDATE validation_runs SET lease_expires_at = now() - interval '1 second' WHERE id = ?`, id).Error)
		_, err := store.Claim(context.Background(), id, time.Minute, 6)
		require.NoError(t, err)
		select {
		case <-ctx.Done():
			stopped = true
		case <-time.After(20 * time.Second):
		}
	})
	id := startRun(t, env, org, wf, invalidOrder)
	require.NoError(t, tasks.Deliver(context.Background(), w.Worker, tasks.NewRunTask(id, false)), "losing the run is not an error")

	require.True(t, stopped, "the execution's context ended when the lease was lost")
	run := readRun(t, env, id)
	require.Equal(t, "running", run.Status, "left to the delivery that holds it")
	require.Equal(t, 2, run.Attempts)
	require.Empty(t, dbFindings(t, env, id), "the first delivery wrote nothing")
	require.EqualValues(t, 1, metricValue(t, w.Registry, "valruns_run_leases_lost_total"))
	require.EqualValues(t, 0, metricValue(t, w.Registry, "valruns_runs_finished_total"))
}

// Three workers' sweepers sweep at the same moment, four times over, after
// Redis lost the ready list (deleted here, as a failover to a stale replica
// would): each run is handed on exactly once (one counted redelivery, one
// item in ready), and while that item waits no sweep adds another. Before
// the loss, a sweep finds every run in ready and hands on none.
func TestSweepersRedeliverEachLostRunOnce(t *testing.T) {
	t.Parallel()
	env := apitest.New(t)
	org := env.NewOrg("acme")
	wf := env.NewWorkflow(org, orderWorkflow)
	rdb := newRedis(t)
	const workers, n = 3, 20
	ws := make([]*testWorker, workers)
	for i := range ws {
		ws[i] = newWorker(t, env, rdb, func(c *tasks.Config) { c.RedeliverAfter = 200 * time.Millisecond })
	}
	d := handOff(t, env, rdb)
	_, want := startBodies(t, env, org, wf, "sweep", n)
	ctx := context.Background()
	apitest.Eventually(t, 30*time.Second, func() bool { return len(tasks.ReadyRuns(t, rdb)) == n },
		"the hand-off pushes every run onto ready")
	d.Close()
	time.Sleep(300 * time.Millisecond) // the runs are older than RedeliverAfter

	sweepAll := func() int {
		counts := make([]int, workers)
		var wg sync.WaitGroup
		for i, w := range ws {
			wg.Go(func() {
				var err error
				counts[i], err = w.Sweeper().Sweep(ctx)
				require.NoError(t, err)
			})
		}
		wg.Wait()
		return counts[0] + counts[1] + counts[2]
	}
	require.Zero(t, sweepAll(), "every run is still in ready")

	rc := redisClient(rdb)
	defer rc.Close()
	require.NoError(t, rc.Del(ctx, tasks.ReadyList).Err())

	redelivered := 0
	for range 4 {
		time.Sleep(300 * time.Millisecond) // each run may be looked at again
		redelivered += sweepAll()
	}
	require.Equal(t, n, redelivered, "each run handed on once")
	var total float64
	for _, w := range ws {
		total += metricValue(t, w.Registry, "valruns_runs_redelivered_total", "reason", "queued")
	}
	require.EqualValues(t, n, total)
	require.EqualValues(t, n, env.Count("validation_runs", "redeliveries = 1"))
	ready := tasks.ReadyRuns(t, rdb)
	require.Len(t, ready, n, "one item per run")
	require.ElementsMatch(t, slices.Collect(maps.Keys(want)), ready)

	require.NoError(t, ws[0].Start(ctx))
	t.Cleanup(ws[0].Stop)
	for id := range want {
		waitRun(t, env, org, id, 20*time.Second)
	}
	requireFinishedOnce(t, env, org, want)
}

// A run already started RUN_MAX_RETRY+1 times by workers that died with it
// (a submission that kills its worker, say) is not started again: the
// sweeper's redelivery ends it in status error with the reason.
func TestRunStartedTooOftenEndsInError(t *testing.T) {
	t.Parallel()
	env := apitest.New(t)
	org := env.NewOrg("acme")
	wf := env.NewWorkflow(org, orderWorkflow)
	id := startRun(t, env, org, wf, validOrder)
	// Two workers claimed it and died: its second lease has run out.
	require.NoError(t, env.DB.Exec(`UPDATE validation_runs SET status = 'running', attempts = 2, started_at = now(),
		lease_expires_at = now() - interval '1 second' WHERE id = ?`, id).Error)

	w := startWorker(t, env, newRedis(t), func(c *tasks.Config) {
		fastSweep(c)
		c.RunMaxRetry = 1
	})
	run := waitRun(t, env, org, id, 20*time.Second)
	require.Equal(t, "error", run.Status)
	require.NotNil(t, run.Error)
	require.Contains(t, *run.Error, "started 2 times")
	require.Equal(t, 2, run.Attempts, "not started a third time")
	require.Empty(t, run.Findings)
	eventuallyMetric(t, w.Registry, 1, "valruns_runs_finished_total", "status", "error")
	// "started 2 times" is the sweeper's redelivery finding the attempts used
	// up (nothing else delivers this run); its count is not asserted, as the
	// sweeper counts a redelivery only when the run's row is free.
}

// A worker shut down while a run executes past SHUTDOWN_TIMEOUT hands the
// run back: it releases the run's lease (a minute long here) before asynq
// gets the task back, so another worker takes the run over at once rather
// than after the lease, and it is not counted as a failure.
func TestShutdownHandsTheRunBackAtOnce(t *testing.T) {
	t.Parallel()
	env := apitest.New(t)
	org := env.NewOrg("acme")
	wf := env.NewWorkflow(org, orderWorkflow)
	rdb := newRedis(t)
	w1 := newWorker(t, env, rdb, func(c *tasks.Config) {
		claimedPath(c)
		c.RunLease = time.Minute
		c.RunMaxRetry = 1
		c.ShutdownTimeout = 300 * time.Millisecond
	})
	started := make(chan struct{}, 1)
	tasks.SetBeforeRun(w1.Worker, func(ctx context.Context, _ string) {
		started <- struct{}{}
		<-ctx.Done() // a validation that outlasts the shutdown
	})
	require.NoError(t, w1.Start(context.Background()))
	t.Cleanup(w1.Stop)
	handOff(t, env, w1.Redis)

	id := startRun(t, env, org, wf, validOrder)
	select {
	case <-started:
	case <-time.After(20 * time.Second):
		t.Fatal("the run did not start")
	}
	w1.Stop()
	var released bool
	require.NoError(t, env.DB.Raw(`SELECT lease_expires_at <= now() FROM validation_runs WHERE id = ?`, id).Scan(&released).Error)
	require.True(t, released, "the lease was released")
	require.Equal(t, 1, readRun(t, env, id).Attempts)

	w2 := startWorker(t, env, rdb, func(c *tasks.Config) { c.RunLease = time.Minute })
	run := waitRun(t, env, org, id, 20*time.Second)
	require.Equal(t, "passed", run.Status)
	require.Equal(t, 2, run.Attempts, "taken over at once, not after the minute's lease")
	require.EqualValues(t, 0, metricValue(t, w2.Registry, "valruns_runs_redelivered_total"), "asynq delivered it again, not the sweeper")
}

// A run still executing at RUN_TIMEOUT ends in status error with the reason,
// without retries.
func TestRunPastItsTimeoutEndsInError(t *testing.T) {
	t.Parallel()
	env := apitest.New(t)
	org := env.NewOrg("acme")
	wf := env.NewWorkflow(org, orderWorkflow)
	w := newWorker(t, env, newRedis(t), func(c *tasks.Config) { claimedPath(c); c.RunTimeout = time.Second })
	tasks.SetBeforeRun(w.Worker, func(ctx context.Context, _ string) { <-ctx.Done() })
	require.NoError(t, w.Start(context.Background()))
	t.Cleanup(w.Stop)
	handOff(t, env, w.Redis)

	id := startRun(t, env, org, wf, validOrder)
	run := waitRun(t, env, org, id, 20*time.Second)
	require.Equal(t, "error", run.Status)
	require.NotNil(t, run.Error)
	require.Contains(t, *run.Error, "longer than its time limit (1s)")
	require.Equal(t, 1, run.Attempts)
	eventuallyMetric(t, w.Registry, 1, "valruns_runs_finished_total", "status", "error")
}

// A validation that panics is a failure like any other: the delivery
// releases the run's lease (15 s by default) and the retry claims the run at
// once, rather than a heartbeat goroutine holding it for ever or the retry
// waiting out the lease.
func TestPanicInARunReleasesItsLease(t *testing.T) {
	t.Parallel()
	env := apitest.New(t)
	org := env.NewOrg("acme")
	wf := env.NewWorkflow(org, orderWorkflow)
	w := newWorker(t, env, newRedis(t), claimedPath)
	var calls atomic.Int32
	tasks.SetBeforeRun(w.Worker, func(context.Context, string) {
		if calls.Add(1) == 1 {
			panic("validation blew up")
		}
	})
	require.NoError(t, w.Start(context.Background()))
	t.Cleanup(w.Stop)
	handOff(t, env, w.Redis)

	id := startRun(t, env, org, wf, validOrder)
	run := waitRun(t, env, org, id, 10*time.Second)
	require.Equal(t, "passed", run.Status)
	require.Equal(t, 2, run.Attempts)
	eventuallyMetric(t, w.Registry, 1, "valruns_tasks_failed_total", "type", tasks.TypeRunExecute)
}
