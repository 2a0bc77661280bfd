package tasks_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/internal/apitest"
	"github.com/valruns/valruns/models"
	"github.com/valruns/valruns/tasks"
)

// Runs the gate lets in one by one (a share of 2) reach an idle worker by
// the direct hand-off, and each, once final, is released from the gate,
// which lets the organisation's next runs in: every run ends once, none is
// left admitted or waiting, and none went through asynq's queue. No sweep
// within the test: a run the gate kept would stay queued.
func TestDirectHandOffReleasesTheGate(t *testing.T) {
	t.Parallel()
	const n = 12
	env := apitest.New(t)
	org := env.NewOrg("acme")
	require.NoError(t, models.NewOrgStore(env.DB).SetRunShare(context.Background(), org.ID, new(2)))
	wf := env.NewWorkflow(org, orderWorkflow)
	rdb := newRedis(t)
	w := startWorker(t, env, rdb, noSweep)

	ids, want := startBodies(t, env, org, wf, "direct", n)
	for _, id := range ids {
		waitRun(t, env, org, id, 30*time.Second)
	}
	requireFinishedOnce(t, env, org, want)
	eventuallyMetric(t, w.Registry, n, "valruns_runs_direct_total", "result", "finished")
	require.Zero(t, metricValue(t, w.Registry, "valruns_tasks_processed_total", "type", tasks.TypeRunExecute))
	apitest.Eventually(t, 10*time.Second, func() bool {
		admitted, err := tasks.GateAdmitted(t, rdb, org.ID)
		return err == nil && len(admitted) == 0
	}, "every run released from the gate")
	require.Zero(t, tasks.GateWaiting(t, rdb))
}

// A run is pushed to the direct hand-off only while a worker waits there
// and the queue is not paused; else it goes to asynq's queue, where a
// worker started later (or the queue resumed) finds it.
func TestDirectHandOffNeedsATakerAndAQueueNotPaused(t *testing.T) {
	t.Parallel()
	env := apitest.New(t)
	org := env.NewOrg("acme")
	wf := env.NewWorkflow(org, orderWorkflow)
	rdb := newRedis(t)
	insp := asynq.NewInspector(rdb)
	t.Cleanup(func() { _ = insp.Close() })
	// Each case its own dispatcher: a writer that found no taker skips the
	// direct hand-off for a second.
	place := func(name string) (queued, direct bool) {
		handOff(t, env, rdb)
		id := startRun(t, env, org, wf, validOrder)
		var in map[string]bool
		apitest.Eventually(t, 10*time.Second, func() bool {
			in, _ = tasks.RunsInRedis(t, rdb)
			return in[id] || len(tasks.DirectRuns(t, rdb)) > 0
		}, name+": the run is handed off")
		return in[id], len(tasks.DirectRuns(t, rdb)) > 0
	}

	queued, direct := place("no worker waits")
	require.True(t, queued)
	require.False(t, direct)

	tasks.JoinDirect(t, rdb, "a-worker", 0)
	require.NoError(t, insp.PauseQueue("default"))
	queued, direct = place("the queue is paused")
	require.True(t, queued)
	require.False(t, direct)

	require.NoError(t, insp.UnpauseQueue("default"))
	queued, direct = place("a worker waits")
	require.False(t, queued)
	require.True(t, direct)
}

// A run started just after a worker joined the direct hand-off reaches
// it, even though the same dispatcher found no worker taking a moment
// before: a backlog in asynq's queue (the runs started while no worker
// ran) is no reason to send the new run behind it.
func TestDirectHandOffFindsAWorkerThatHasJustJoined(t *testing.T) {
	t.Parallel()
	env := apitest.New(t)
	org := env.NewOrg("acme")
	wf := env.NewWorkflow(org, orderWorkflow)
	rdb := newRedis(t)
	handOff(t, env, rdb)
	first := startRun(t, env, org, wf, validOrder)
	apitest.Eventually(t, 10*time.Second, func() bool {
		in, _ := tasks.RunsInRedis(t, rdb)
		return in[first]
	}, "with no worker taking, the run is in asynq's queue")

	tasks.JoinDirect(t, rdb, "worker-a", 0)
	next := startRun(t, env, org, wf, validOrder)
	apitest.Eventually(t, 10*time.Second, func() bool {
		in, _ := tasks.RunsInRedis(t, rdb)
		return in[next] || len(tasks.DirectRuns(t, rdb)) > 0
	}, "the next run is handed off")
	require.Equal(t, []string{next}, tasks.DirectRuns(t, rdb))
}

// A worker inside an API process (serve --worker: SingleNode) takes no
// runs from the direct hand-off: its lane is for the process's own runs,
// and the runs other processes hand off reach it through asynq's queue.
func TestASingleNodeWorkerTakesNothingFromTheDirectHandOff(t *testing.T) {
	t.Parallel()
	env := apitest.New(t)
	org := env.NewOrg("acme")
	wf := env.NewWorkflow(org, orderWorkflow)
	rdb := newRedis(t)
	w := startWorker(t, env, rdb, func(c *tasks.Config) { c.SingleNode = true })
	for range 3 {
		waitRun(t, env, org, startRun(t, env, org, wf, validOrder), 30*time.Second)
	}
	require.Empty(t, tasks.DirectRuns(t, rdb))
	require.Zero(t, metricValue(t, w.Registry, "valruns_runs_direct_total", "result", "finished"))
	eventuallyMetric(t, w.Registry, 3, "valruns_tasks_processed_total", "type", tasks.TypeRunExecute)
}

// The list holds at most tasks.DirectPerTaker runs per worker taking from
// it: past that, new runs go to asynq's queue, and a second worker taking
// makes room for as many more. Runs are started one by one, so that each
// is its own call of the gate's script, which pushes it in the same call.
func TestDirectHandOffListHoldsAFewRunsPerWorker(t *testing.T) {
	t.Parallel()
	env := apitest.New(t)
	org := env.NewOrg("acme")
	wf := env.NewWorkflow(org, orderWorkflow)
	rdb := newRedis(t)
	handOff(t, env, rdb)
	// Taking, but never popping: what is pushed stays in the list. Each
	// start renews their beats, however slow the machine.
	takers := []string{"worker-a"}
	queuedNow := func() int {
		in, _ := tasks.RunsInRedis(t, rdb)
		return len(in)
	}
	start := func(n int) {
		for range n {
			for _, id := range takers {
				tasks.JoinDirect(t, rdb, id, 0)
			}
			before := len(tasks.DirectRuns(t, rdb)) + queuedNow()
			startRun(t, env, org, wf, validOrder)
			apitest.Eventually(t, 10*time.Second, func() bool {
				return len(tasks.DirectRuns(t, rdb))+queuedNow() == before+1
			}, "the run is handed off")
		}
	}

	start(tasks.DirectPerTaker + 2)
	require.Len(t, tasks.DirectRuns(t, rdb), tasks.DirectPerTaker)
	require.Equal(t, 2, queuedNow())

	takers = append(takers, "worker-b")
	start(tasks.DirectPerTaker + 1)
	require.Len(t, tasks.DirectRuns(t, rdb), 2*tasks.DirectPerTaker)
	require.Equal(t, 3, queuedNow())
}

// A worker takes what the direct hand-off's list holds, up to its free
// slots, in the round trip its wait returns in: the four runs waiting when
// it starts are taken by one pop, not one pop each. Once final, a run is
// removed from the worker's list of runs taken by its next pop, not by a
// round trip of its own: here that pop waits a minute, so the four are
// still listed when the worker stops, and its leaving does not hand them
// to the queue again. Each run ends once.
func TestAWorkerTakesTheListInOneRoundTripAndForgetsItsRunsWithTheNext(t *testing.T) {
	t.Parallel()
	env, org, rdb, ids, want := runsListedFor(t, "worker-a")
	w := newWorker(t, env, rdb, noSweep)
	var mu sync.Mutex
	var pops []int
	popped := make(chan struct{})
	tasks.SetDirectPops(w.Worker, time.Minute, func(n int) {
		mu.Lock()
		defer mu.Unlock()
		if pops = append(pops, n); len(pops) == 1 {
			close(popped)
		}
	})
	// The runs execute once the worker waits on the list again.
	tasks.SetBeforeRun(w.Worker, func(ctx context.Context, runID string) {
		<-popped
		time.Sleep(200 * time.Millisecond)
	})
	require.NoError(t, w.Start(context.Background()))
	t.Cleanup(w.Stop)
	for _, id := range ids {
		waitRun(t, env, org, id, 30*time.Second)
	}
	requireFinishedOnce(t, env, org, want)
	mu.Lock()
	require.Equal(t, []int{len(ids)}, pops, "one pop took every run the list held")
	mu.Unlock()
	require.ElementsMatch(t, ids, tasks.DirectTaken(t, rdb, w.Worker),
		"the final runs stay listed until the worker's next pop")

	w.Stop()
	rc := redisClient(rdb)
	t.Cleanup(func() { _ = rc.Close() })
	for _, id := range ids {
		n, err := rc.Exists(context.Background(), tasks.TaskKey(tasks.RunTaskID(id, 0))).Result()
		require.NoError(t, err)
		require.Zero(t, n, "run %s, final, is not handed to the queue when its worker leaves", id)
	}
	requireFinishedOnce(t, env, org, want)
}

// A worker that took runs from the direct hand-off and stopped (died, or
// was paused) before their final write loses nothing: once it has not
// beaten for RUN_LEASE, a sweep redelivers the queued runs its list of runs
// taken holds, long before RUN_REDELIVER_AFTER (a minute here, so that only
// this can take them over); each ends once.
func TestRunsAStoppedWorkerTookAreTakenOverWithinTheLease(t *testing.T) {
	t.Parallel()
	env, org, rdb, ids, want := runsTakenBy(t, "stopped:1:dead", time.Minute)
	w := newWorker(t, env, rdb, takeoverSweep)
	tasks.NoDirect(w.Worker) // it takes nothing more from the direct hand-off: only its sweeper finds them
	require.NoError(t, w.Start(context.Background()))
	t.Cleanup(w.Stop)
	for _, id := range ids {
		waitRun(t, env, org, id, 30*time.Second)
	}
	requireFinishedOnce(t, env, org, want)
}

// The runs a worker alive took (its last beat within RUN_LEASE) are its
// own: a sweep does not deliver them again, however old they are
// (RUN_REDELIVER_AFTER is half a second here).
func TestSweeperLeavesTheRunsALiveWorkerTook(t *testing.T) {
	t.Parallel()
	env, _, rdb, ids, _ := runsTakenBy(t, "alive:1:busy", 0)
	w := newWorker(t, env, rdb, fastSweep)
	tasks.NoDirect(w.Worker)
	require.NoError(t, w.Start(context.Background()))
	t.Cleanup(w.Stop)
	time.Sleep(3 * time.Second) // six times RUN_REDELIVER_AFTER, thirty sweeps
	for _, id := range ids {
		require.Equal(t, "queued", readRun(t, env, id).Status, "run %s is left to the worker that took it", id)
	}
}

// runsTakenBy starts four runs that worker taker took from the direct
// hand-off, its last beat ago.
func runsTakenBy(t *testing.T, taker string, ago time.Duration) (*apitest.Env, apitest.Org, asynq.RedisClientOpt, []string, map[string]string) {
	env, org, rdb, ids, want := runsListedFor(t, taker)
	require.ElementsMatch(t, ids, tasks.TakeDirectAs(t, rdb, taker))
	tasks.JoinDirect(t, rdb, taker, ago)
	return env, org, rdb, ids, want
}

// runsListedFor starts four runs (the list's most for one worker) that
// wait in the direct hand-off's list for worker taker, which beats but
// never pops.
func runsListedFor(t *testing.T, taker string) (*apitest.Env, apitest.Org, asynq.RedisClientOpt, []string, map[string]string) {
	env := apitest.New(t)
	org := env.NewOrg("acme")
	wf := env.NewWorkflow(org, orderWorkflow)
	rdb := newRedis(t)
	handOff(t, env, rdb)
	tasks.JoinDirect(t, rdb, taker, 0)
	ids, want := startBodies(t, env, org, wf, "listed", tasks.DirectPerTaker)
	apitest.Eventually(t, 10*time.Second, func() bool { return len(tasks.DirectRuns(t, rdb)) == len(ids) },
		"every run is handed off directly")
	return env, org, rdb, ids, want
}

// takeoverSweep: a sweep every 100 ms, RUN_LEASE 2 s, and the queued runs'
// pass only after a minute.
func takeoverSweep(c *tasks.Config) {
	c.RunLease, c.RunHeartbeat = 2*time.Second, 500*time.Millisecond
	c.SweepInterval, c.RedeliverAfter = 100*time.Millisecond, time.Minute
}

// The last worker taking from the direct hand-off hands what the list
// still holds to asynq's queue when it stops: here its five lane slots are
// busy (4 per WORKER_CONCURRENCY of 1, and the one its pop waits with), so
// three more runs wait in the list, and must be in the queue once it
// stops, not left for the sweeper. Each run ends once.
func TestLastWorkerStoppingHandsTheListToTheQueue(t *testing.T) {
	t.Parallel()
	env := apitest.New(t)
	org := env.NewOrg("acme")
	wf := env.NewWorkflow(org, orderWorkflow)
	rdb := newRedis(t)
	w := newWorker(t, env, rdb, func(c *tasks.Config) {
		noSweep(c)
		c.Concurrency = 1
		c.FastBudget = time.Minute // bounded by the heartbeat: 5s
	})
	held, release := make(chan struct{}, 16), make(chan struct{})
	tasks.SetBeforeRun(w.Worker, func(ctx context.Context, runID string) {
		held <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
		}
	})
	require.NoError(t, w.Start(context.Background()))
	t.Cleanup(w.Stop)
	handOff(t, env, rdb)

	busy, want := startBodies(t, env, org, wf, "busy", 5)
	for range busy {
		<-held // every lane slot holds a run
	}
	waiting, want2 := startBodies(t, env, org, wf, "waiting", 3)
	for id, st := range want2 {
		want[id] = st
	}
	apitest.Eventually(t, 10*time.Second, func() bool { return len(tasks.DirectRuns(t, rdb)) == len(waiting) },
		"the runs past the lane's slots wait in the list")

	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		w.Stop()
	}()
	// Each has its task in asynq: pending, or active if the stopping
	// worker's task server took it meanwhile.
	rc := redisClient(rdb)
	t.Cleanup(func() { _ = rc.Close() })
	apitest.Eventually(t, 10*time.Second, func() bool {
		for _, id := range waiting {
			if n, err := rc.Exists(context.Background(), tasks.TaskKey(tasks.RunTaskID(id, 0))).Result(); err != nil || n == 0 {
				return false
			}
		}
		return len(tasks.DirectRuns(t, rdb)) == 0
	}, "the stopping worker hands the list's runs to the queue")
	close(release)
	<-stopped

	startWorker(t, env, rdb, noSweep)
	for _, id := range append(busy, waiting...) {
		waitRun(t, env, org, id, 30*time.Second)
	}
	requireFinishedOnce(t, env, org, want)
}

// A direct item built from the payload's JSON (marshalled once, for the
// gate's call too) reads back as the payload and its trace headers, with
// headers and without.
func TestDirectItemFromThePayloadsJSON(t *testing.T) {
	t.Parallel()
	p := tasks.RunPayload{RunID: "0b9d5c49-6a43-4bd4-9a56-6c2b3f1e0a11", OrgID: "org", RequestID: "req",
		CreatedAt: time.Date(2026, 11, 27, 21, 0, 0, 0, time.UTC)}
	raw, err := json.Marshal(p)
	require.NoError(t, err)
	for _, headers := range []map[string]string{nil, {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}} {
		b, err := tasks.DirectItemJSON(raw, headers)
		require.NoError(t, err)
		require.True(t, json.Valid(b), "%s", b)
		got, h, err := tasks.DecodeDirectItem(b)
		require.NoError(t, err)
		require.Equal(t, p, got)
		require.Equal(t, headers, h)
	}
}
