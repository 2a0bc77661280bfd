package tasks_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/internal/apitest"
	"github.com/valruns/valruns/models"
	"github.com/valruns/valruns/tasks"
)

// A worker that stops gives back what it took: the runs it was executing
// (stopped once SHUTDOWN_TIMEOUT is out, their leases released) go back to
// the head of the ready list, its taking list is left empty, and another
// worker executes each of them, once.
func TestAStoppingWorkerGivesBackWhatItTook(t *testing.T) {
	t.Parallel()
	env := apitest.New(t)
	org := env.NewOrg("acme")
	// No share: every run is in ready or taken (the adaptive share starts
	// at twice the 2 slots, 4 of the 5 runs).
	require.NoError(t, models.NewOrgStore(env.DB).SetRunShare(context.Background(), org.ID, new(0)))
	wf := env.NewWorkflow(org, orderWorkflow)
	rdb := newRedis(t)
	const slots, n = 2, 5
	w := newWorker(t, env, rdb, func(c *tasks.Config) {
		claimedPath(c)
		c.Concurrency, c.ShutdownTimeout = slots, 200*time.Millisecond
		noSweep(c)
	})
	began := make(chan string, n)
	tasks.SetBeforeRun(w.Worker, func(ctx context.Context, id string) {
		began <- id
		<-ctx.Done() // a validation that outlasts the shutdown
	})
	require.NoError(t, w.Start(context.Background()))
	t.Cleanup(w.Stop)
	handOff(t, env, rdb)
	ids, want := startBodies(t, env, org, wf, "give-back", n)
	for range slots {
		select {
		case <-began:
		case <-time.After(30 * time.Second):
			t.Fatal("the worker never began its runs")
		}
	}
	apitest.Eventually(t, 30*time.Second, func() bool { return len(tasks.ReadyRuns(t, rdb)) == n-slots },
		"the runs past the worker's slots wait in ready")

	w.Stop()
	require.ElementsMatch(t, ids, tasks.ReadyRuns(t, rdb), "every run is back in ready")
	require.Empty(t, tasks.TakenBy(t, rdb, tasks.TakerID(w.Worker)), "nothing left in the stopped worker's list")
	require.Zero(t, env.Count("validation_runs", "lease_expires_at > clock_timestamp()"), "the runs it held are released")

	startWorker(t, env, rdb, noSweep)
	for _, id := range ids {
		require.Equal(t, want[id], waitRun(t, env, org, id, 30*time.Second).Status)
	}
	failed := 0
	for _, st := range want {
		if st == "failed" {
			failed++
		}
	}
	require.EqualValues(t, failed*len(invalidOrderFindings), countFindings(t, env), "each failed run's findings once")
}

// A paused queue (asynq's PauseQueue, as asynqmon does) holds new runs at
// the gate: nothing reaches the ready list and no worker executes them.
// After the queue is resumed, a sweep lets them in and each executes once.
func TestAPausedQueueHoldsRunsAtTheGate(t *testing.T) {
	t.Parallel()
	env := apitest.New(t)
	org := env.NewOrg("acme")
	wf := env.NewWorkflow(org, orderWorkflow)
	rdb := newRedis(t)
	insp := asynq.NewInspector(rdb)
	t.Cleanup(func() { _ = insp.Close() })
	require.NoError(t, insp.PauseQueue("default"))
	w := startWorker(t, env, rdb, noSweep)
	const n = 6
	ids, want := startBodies(t, env, org, wf, "paused", n)
	apitest.Eventually(t, 30*time.Second, func() bool { return tasks.GateWaiting(t, rdb) == n },
		"every run waits at the gate")
	require.Empty(t, tasks.ReadyRuns(t, rdb), "nothing is handed to the workers")
	require.EqualValues(t, n, env.Count("validation_runs", "status = 'queued'"), "no run executes")

	require.NoError(t, insp.UnpauseQueue("default"))
	_, err := w.Sweeper().Sweep(context.Background())
	require.NoError(t, err)
	for _, id := range ids {
		waitRun(t, env, org, id, 30*time.Second)
	}
	requireFinishedOnce(t, env, org, want)
	require.Zero(t, tasks.GateWaiting(t, rdb))
}

// A worker killed with runs in its taking list stops beating; once its
// alive key runs out (RUN_LEASE), a sweep moves its list back to ready and
// a live worker executes each run once. Here a taker that took every run
// and never beat stands for it.
func TestAStoppedTakersRunsAreTakenOver(t *testing.T) {
	t.Parallel()
	env := apitest.New(t)
	org := env.NewOrg("acme")
	wf := env.NewWorkflow(org, orderWorkflow)
	rdb := newRedis(t)
	handOff(t, env, rdb)
	const n = 8
	ids, want := startBodies(t, env, org, wf, "taken", n)
	apitest.Eventually(t, 30*time.Second, func() bool { return len(tasks.ReadyRuns(t, rdb)) == n },
		"every run is in ready")
	require.ElementsMatch(t, ids, tasks.TakeAs(t, rdb, "dead-worker"))

	w := newWorker(t, env, rdb, noSweep)
	require.NoError(t, w.Start(context.Background()))
	t.Cleanup(w.Stop)
	_, err := w.Sweeper().Sweep(context.Background())
	require.NoError(t, err)
	require.Empty(t, tasks.TakenBy(t, rdb, "dead-worker"), "the stopped taker's list is moved")
	for _, id := range ids {
		waitRun(t, env, org, id, 30*time.Second)
	}
	requireFinishedOnce(t, env, org, want)
	require.EqualValues(t, n, metricValue(t, w.Registry, "valruns_runs_redelivered_total", "reason", "taker_stopped"))
}

// A worker left out of the takers set (a sweep that found its alive key
// gone while it was paused, or a failover that lost its entry) joins again
// at its next beat, so that a sweep sees what it holds.
func TestAWorkerLeftOutOfTheTakersJoinsAgain(t *testing.T) {
	t.Parallel()
	env := apitest.New(t)
	rdb := newRedis(t)
	w := startWorker(t, env, rdb, noSweep)
	rc := redisClient(rdb)
	defer rc.Close()
	ctx := context.Background()
	id := tasks.TakerID(w.Worker)
	require.True(t, rc.SIsMember(ctx, tasks.TakersSet, id).Val(), "a started worker is a taker")
	require.NoError(t, rc.SRem(ctx, tasks.TakersSet, id).Err())
	require.NoError(t, rc.Del(ctx, tasks.AliveKey+id).Err())
	apitest.Eventually(t, 30*time.Second, func() bool {
		return rc.SIsMember(ctx, tasks.TakersSet, id).Val() && rc.Exists(ctx, tasks.AliveKey+id).Val() == 1
	}, "the worker joins the takers again at its next beat")
}

// Every accepted run reaches a worker exactly once: many clients start
// runs at once, three workers take them, and each run is delivered once
// (counted as each delivery begins) and ends once, at its first attempt.
func TestEveryRunReachesAWorkerOnce(t *testing.T) {
	t.Parallel()
	env := apitest.New(t)
	org := env.NewOrg("acme")
	wf := env.NewWorkflow(org, orderWorkflow)
	rdb := newRedis(t)
	var mu sync.Mutex
	delivered := map[string]int{}
	for range 3 {
		w := newWorker(t, env, rdb, noSweep)
		tasks.SetDequeued(w.Worker, func(ids []string) {
			mu.Lock()
			defer mu.Unlock()
			for _, id := range ids {
				delivered[id]++
			}
		})
		require.NoError(t, w.Start(context.Background()))
		t.Cleanup(w.Stop)
	}
	handOff(t, env, rdb)
	const clients, each = 16, 15
	ids := make([]string, clients*each)
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			for i := range each {
				ids[c*each+i] = startRun(t, env, org, wf, validOrder, "Idempotency-Key", fmt.Sprintf("once-%d-%d", c, i))
			}
		})
	}
	wg.Wait()
	apitest.Eventually(t, 2*time.Minute, func() bool {
		return env.Count("validation_runs", "status IN ('queued', 'running')") == 0
	}, "every run ends")
	require.EqualValues(t, len(ids), env.Count("validation_runs", "status = 'passed' AND attempts <= 1"),
		"every run passed at its first delivery")
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, delivered, len(ids), "every run reached a worker")
	for _, id := range ids {
		require.Equal(t, 1, delivered[id], "run %s reached a worker once", id)
	}
}

// A live worker is never taken for a stopped one, however short RUN_LEASE:
// it beats at least three times per lease, so its alive key never runs out
// between two beats, and sweeps leave its place alone.
func TestALiveWorkerWithAShortLeaseIsNotTakenOver(t *testing.T) {
	t.Parallel()
	env := apitest.New(t)
	rdb := newRedis(t)
	w := startWorker(t, env, rdb, func(c *tasks.Config) {
		c.RunLease, c.RunHeartbeat = 1500*time.Millisecond, 300*time.Millisecond
		noSweep(c)
	})
	rc := redisClient(rdb)
	defer rc.Close()
	ctx := context.Background()
	id := tasks.TakerID(w.Worker)
	for deadline := time.Now().Add(4 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		_, err := w.Sweeper().Sweep(ctx)
		require.NoError(t, err)
		require.True(t, rc.SIsMember(ctx, tasks.TakersSet, id).Val(), "a sweep left the live worker in the takers")
	}
}

// A take whose answer never arrives (here its connection is killed while
// it waits; a worker stopped past its read deadline is the same) may have
// moved a run into the worker's taking list: the worker, which still beats,
// looks there after the error and executes what it finds, once.
func TestARunMovedByALostTakeIsExecuted(t *testing.T) {
	t.Parallel()
	env := apitest.New(t)
	org := env.NewOrg("acme")
	wf := env.NewWorkflow(org, orderWorkflow)
	rdb := newRedis(t)
	id := startRun(t, env, org, wf, invalidOrder) // no hand-off: it stays queued
	w := newWorker(t, env, rdb, noSweep)
	tasks.SetTakerBlock(w.Worker, time.Second) // its next take, which forgets the run, comes soon
	require.NoError(t, w.Start(context.Background()))
	t.Cleanup(w.Stop)
	rc := redisClient(rdb)
	defer rc.Close()
	ctx := context.Background()
	var waiting string // the client id of the worker's take
	apitest.Eventually(t, 30*time.Second, func() bool {
		list, err := rc.ClientList(ctx).Result()
		require.NoError(t, err)
		for _, line := range strings.Split(list, "\n") {
			if strings.Contains(line, "cmd=blmove") && strings.Contains(line, fmt.Sprintf(" db=%d ", rdb.DB)) {
				waiting, _, _ = strings.Cut(strings.TrimPrefix(line, "id="), " ")
				return true
			}
		}
		return false
	}, "the worker waits on the ready list")
	item := fmt.Sprintf(`{"run":{"run_id":%q,"org_id":%q}}`, id, org.ID)
	require.NoError(t, rc.RPush(ctx, tasks.TakingList+tasks.TakerID(w.Worker), item).Err())
	n, err := strconv.ParseInt(waiting, 10, 64)
	require.NoError(t, err)
	require.NoError(t, rc.ClientKillByFilter(ctx, "ID", strconv.FormatInt(n, 10)).Err())

	run := waitRun(t, env, org, id, 30*time.Second)
	require.Equal(t, "failed", run.Status)
	require.Equal(t, invalidOrderFindings, dbFindings(t, env, id), "findings written once")
	apitest.Eventually(t, 30*time.Second, func() bool {
		return len(tasks.TakenBy(t, rdb, tasks.TakerID(w.Worker))) == 0
	}, "the run leaves the taking list once final")
}

// A run whose outcome is computed gives its slot to the next run while its
// final write waits: with one slot, a second run is validated while the
// first run's write is held by a lock on its row.
func TestAWaitingWriteFreesItsSlot(t *testing.T) {
	t.Parallel()
	env := apitest.New(t)
	org := env.NewOrg("acme")
	wf := env.NewWorkflow(org, orderWorkflow)
	rdb := newRedis(t)
	w := newWorker(t, env, rdb, func(c *tasks.Config) { c.Concurrency = 1; noSweep(c) })
	lock := env.DB.Begin()
	t.Cleanup(func() { lock.Rollback() })
	began := make(chan string, 2)
	var first sync.Once
	tasks.SetBeforeRun(w.Worker, func(_ context.Context, id string) {
		first.Do(func() { // the first run's row is locked before its write
			require.NoError(t, lock.Exec("SELECT 1 FROM validation_runs WHERE id = ? FOR UPDATE", id).Error)
		})
		began <- id
	})
	handOff(t, env, rdb)
	ids := []string{startRun(t, env, org, wf, validOrder), startRun(t, env, org, wf, validOrder)}
	require.NoError(t, w.Start(context.Background()))
	t.Cleanup(w.Stop)
	held := <-began
	select {
	case <-began:
	case <-time.After(30 * time.Second):
		t.Fatal("the second run waited for the first one's write")
	}
	require.Equal(t, "queued", readRun(t, env, held).Status, "the first run's write still waits")
	require.NoError(t, lock.Rollback().Error)
	for _, id := range ids {
		require.Equal(t, "passed", waitRun(t, env, org, id, 30*time.Second).Status)
	}
}
