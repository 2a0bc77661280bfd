package tasks_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/internal/apitest"
	"github.com/valruns/valruns/models"
	"github.com/valruns/valruns/tasks"
)

// executions records the order in which asynq handed runs out, and how
// many executed at once at most.
type executions struct {
	mu      sync.Mutex
	order   []string
	now     atomic.Int64
	maxSeen atomic.Int64
	hold    time.Duration
}

func (x *executions) dequeued(ids []string) {
	x.mu.Lock()
	x.order = append(x.order, ids...)
	x.mu.Unlock()
}

func (x *executions) beforeRun(ctx context.Context, runID string) {
	n := x.now.Add(1)
	defer x.now.Add(-1)
	for {
		m := x.maxSeen.Load()
		if n <= m || x.maxSeen.CompareAndSwap(m, n) {
			break
		}
	}
	select {
	case <-time.After(x.hold):
	case <-ctx.Done():
	}
}

// position is how many runs were handed out before id, and whether id was.
func (x *executions) position(id string) (int, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for i, r := range x.order {
		if r == id {
			return i, true
		}
	}
	return len(x.order), false
}

// Finding (issue 16): the workers ran tasks first in, first out across
// tenants, so organisation B's run waited behind every run organisation A
// had queued (88 s behind 909 of A's slow runs). Now at most A's share of
// its runs is in the queue at once, the rest wait their turn at the gate:
// with a share of one run per worker slot, B's run executes before at most
// workers x 2 of the 1,000 runs A started ahead of it (share of them are
// handed out first; the slack is for tasks handed out in order whose
// handlers begin a moment apart), and every one of A's runs still
// executes, once.
func TestAnOrganisationsRunWaitsBehindAtMostTheOthersShare(t *testing.T) {
	t.Parallel()
	const workers, share, burst = 4, 4, 1000
	env := apitest.New(t)
	a, b := env.NewOrg("a"), env.NewOrg("b")
	wfA, wfB := env.NewWorkflow(a, orderWorkflow), env.NewWorkflow(b, orderWorkflow)
	redis := newRedis(t)
	d := tasks.NewDispatcher(tasks.DispatcherConfig{Redis: redis, MaxRetry: 5, Timeout: time.Minute, GiveUp: time.Minute, RunShare: share})
	env.SetHandOff(d.HandOff)
	t.Cleanup(func() {
		env.SetHandOff(nil)
		d.Close()
	})

	// A's burst and then B's run are all started before any worker runs.
	ids := make([]string, burst)
	var wg sync.WaitGroup
	for c := range 8 {
		wg.Go(func() {
			for i := c; i < burst; i += 8 {
				ids[i] = startRun(t, env, a, wfA, validOrder)
			}
		})
	}
	wg.Wait()
	bID := startRun(t, env, b, wfB, validOrder)
	apitest.Eventually(t, 30*time.Second, func() bool {
		return len(tasks.ReadyRuns(t, redis)) == share+1
	}, "A's share of its runs and B's run are in the queue, the rest of A's wait at the gate")

	x := &executions{hold: 2 * time.Millisecond}
	w := newWorker(t, env, redis, func(c *tasks.Config) {
		c.Concurrency, c.RunShare = workers, share
		c.SweepInterval, c.RedeliverAfter = time.Second, time.Minute
	})
	tasks.SetBeforeRun(w.Worker, x.beforeRun)
	tasks.SetDequeued(w.Worker, x.dequeued)
	require.NoError(t, w.Start(context.Background()))
	t.Cleanup(w.Stop)

	require.Equal(t, "passed", waitRun(t, env, b, bID, time.Minute).Status)
	ahead, began := x.position(bID)
	require.True(t, began)
	t.Logf("B's run was handed out after %d of A's %d runs", ahead, burst)
	require.LessOrEqual(t, ahead, 2*workers, "B's run executes before at most workers x 2 of A's runs")

	apitest.Eventually(t, 3*time.Minute, func() bool {
		return env.Count("validation_runs", "status IN ('queued', 'running')") == 0
	}, "every run of A executes")
	require.EqualValues(t, burst, env.Count("validation_runs", "org_id = '"+a.ID+"' AND status = 'passed' AND attempts = 1"),
		"each of A's runs executed once")
	require.EqualValues(t, 0, tasks.GateWaiting(t, redis), "nothing is left waiting at the gate")
}

// With one organisation alone, fair admission costs nothing: its default
// share (twice the worker slots alive) keeps every slot busy.
func TestAnOrganisationAloneUsesEveryWorkerSlot(t *testing.T) {
	t.Parallel()
	const workers, n = 4, 120
	env := apitest.New(t)
	org := env.NewOrg("alone")
	wf := env.NewWorkflow(org, orderWorkflow)
	redis := newRedis(t)
	x := &executions{hold: 50 * time.Millisecond}
	w := newWorker(t, env, redis, func(c *tasks.Config) {
		c.Concurrency = workers
		c.SweepInterval, c.RedeliverAfter = time.Second, time.Minute
	})
	tasks.SetBeforeRun(w.Worker, x.beforeRun)
	require.NoError(t, w.Start(context.Background()))
	t.Cleanup(w.Stop)
	handOff(t, env, redis)

	var wg sync.WaitGroup
	ids := make([]string, n)
	for c := range 8 {
		wg.Go(func() {
			for i := c; i < n; i += 8 {
				ids[i] = startRun(t, env, org, wf, validOrder)
			}
		})
	}
	wg.Wait()
	for _, id := range ids {
		require.Equal(t, "passed", waitRun(t, env, org, id, time.Minute).Status)
	}
	require.EqualValues(t, workers, x.maxSeen.Load(), "every worker slot executed one of its runs at once")
	require.EqualValues(t, 0, tasks.GateWaiting(t, redis))
}

// An organisation's own share (`valruns org share`) overrides the default:
// 0 lets all of its runs into the queue at once.
func TestAnOrganisationsOwnShareWins(t *testing.T) {
	t.Parallel()
	env := apitest.New(t)
	limited, unlimited := env.NewOrg("limited"), env.NewOrg("unlimited")
	orgs := models.NewOrgStore(env.DB)
	require.NoError(t, orgs.SetRunShare(context.Background(), limited.ID, new(3)))
	require.NoError(t, orgs.SetRunShare(context.Background(), unlimited.ID, new(0)))
	wfL, wfU := env.NewWorkflow(limited, orderWorkflow), env.NewWorkflow(unlimited, orderWorkflow)
	redis := newRedis(t)
	handOff(t, env, redis) // no worker: what is admitted stays in the queue
	for range 10 {
		startRun(t, env, limited, wfL, validOrder)
		startRun(t, env, unlimited, wfU, validOrder)
	}
	apitest.Eventually(t, 30*time.Second, func() bool {
		return len(tasks.ReadyRuns(t, redis)) == 3+10 && tasks.GateWaiting(t, redis) == 7
	}, "3 of the limited organisation's runs in the queue, 7 waiting; all 10 of the other's in the queue")
}

// Finding (issue 17, Redis Sentinel): a failover promotes a replica that
// missed the master's last writes. It holds the gate as it was a moment
// before: runs admitted whose tasks are gone, some of them since ended
// (their releases reached only the old master), and the organisation's
// other runs waiting their turn behind them. Admitted runs that ended held
// their places until RUN_TIMEOUT; a redelivered run that was admitted
// already kept its place without being enqueued, at every sweep: either
// way the waiting runs stayed queued. Now a sweep releases the admitted
// runs PostgreSQL says have ended, and the redelivery of an admitted run
// is enqueued: every run ends, once.
func TestTheGateRecoversWhatAFailoverForgot(t *testing.T) {
	t.Parallel()
	const share, waiting = 4, 6
	for _, tc := range []struct {
		name  string
		ended int // of the admitted runs, how many ended on the old master
	}{
		{"admitted runs ended", share},
		{"admitted runs lost their tasks", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			env := apitest.New(t)
			a := env.NewOrg("a")
			wf := env.NewWorkflow(a, orderWorkflow)
			redis := newRedis(t)
			d := tasks.NewDispatcher(tasks.DispatcherConfig{Redis: redis, MaxRetry: 5, Timeout: 5 * time.Minute, GiveUp: time.Minute, RunShare: share})
			env.SetHandOff(d.HandOff)
			t.Cleanup(func() {
				env.SetHandOff(nil)
				d.Close()
			})
			for range share + waiting {
				startRun(t, env, a, wf, validOrder)
			}
			apitest.Eventually(t, 30*time.Second, func() bool {
				return len(tasks.ReadyRuns(t, redis)) == share && tasks.GateWaiting(t, redis) == waiting
			}, "the share's runs are in the queue, the others wait at the gate")

			// What the promoted replica holds: the admitted runs' tasks are
			// gone, and some of those runs ended.
			rc := goredis.NewClient(&goredis.Options{Addr: redis.Addr, DB: redis.DB})
			require.NoError(t, rc.Del(context.Background(), tasks.ReadyList).Err())
			_ = rc.Close()
			admitted, err := tasks.GateAdmitted(t, redis, a.ID)
			require.NoError(t, err)
			require.Len(t, admitted, share)
			if tc.ended > 0 {
				require.NoError(t, env.DB.Exec(`UPDATE validation_runs SET status = 'passed', finished_at = now()
					WHERE id IN ?`, admitted[:tc.ended]).Error)
			}

			w := newWorker(t, env, redis, func(c *tasks.Config) {
				c.RunShare, c.RunTimeout = share, 5*time.Minute // stale admissions would hold for 5 minutes
				c.SweepInterval, c.RedeliverAfter = 200*time.Millisecond, 500*time.Millisecond
			})
			require.NoError(t, w.Start(context.Background()))
			t.Cleanup(w.Stop)

			apitest.Eventually(t, time.Minute, func() bool {
				return env.Count("validation_runs", "status IN ('queued', 'running')") == 0
			}, "every run ends")
			require.EqualValues(t, share+waiting-tc.ended,
				env.Count("validation_runs", "org_id = '"+a.ID+"' AND status = 'passed' AND attempts = 1"),
				"each run the failover did not end executed once")
			require.EqualValues(t, 0, tasks.GateWaiting(t, redis), "nothing is left waiting at the gate")
		})
	}
}

// The adaptive share starts small: an organisation whose runs have not yet
// said how long they take gets twice the slots alive (no worker alive: 10
// slots assumed), not sixteen times, so that a burst of slow runs started
// before any ran does not fill the ready list ahead of other organisations.
func TestTheAdaptiveShareStartsAtItsSmallest(t *testing.T) {
	t.Parallel()
	const burst = 100
	env := apitest.New(t)
	a := env.NewOrg("a")
	wf := env.NewWorkflow(a, orderWorkflow)
	redis := newRedis(t)
	d := tasks.NewDispatcher(tasks.DispatcherConfig{Redis: redis, MaxRetry: 5, Timeout: time.Minute, GiveUp: time.Minute})
	env.SetHandOff(d.HandOff)
	t.Cleanup(func() {
		env.SetHandOff(nil)
		d.Close()
	})
	for range burst {
		startRun(t, env, a, wf, validOrder)
	}
	apitest.Eventually(t, 30*time.Second, func() bool {
		return tasks.GateWaiting(t, redis) == burst-20
	}, "the rest of the burst waits at the gate")
	require.Len(t, tasks.ReadyRuns(t, redis), 20, "twice the 10 slots assumed are in the ready list")
}

// The gate's own rules, on a Redis of the test's own: runs past the share
// wait; a release lets the oldest waiting run in, and one with nothing
// waiting lets nothing in; a run admitted and never released counts
// against its organisation for at most stale (RUN_TIMEOUT), then a waiting
// run takes its place. Every admitted run is on the ready list, in order.
func TestTheGateCountsAnUnreleasedRunForAtMostStale(t *testing.T) {
	t.Parallel()
	opt := newRedis(t)
	rc := redisClient(opt)
	defer rc.Close()
	ctx := context.Background()
	const stale = 300 * time.Millisecond
	g := tasks.NewGate(rc, 2, stale)
	admit := func(ids, released []string) []string {
		t.Helper()
		let, err := g.Admit(ctx, "org-a", ids, released)
		require.NoError(t, err)
		return let
	}
	require.Equal(t, []string{"r1", "r2"}, admit([]string{"r1", "r2", "r3"}, nil), "a share of 2: r3 waits")
	require.Equal(t, []string{"r3"}, admit(nil, []string{"r1"}), "r1's release lets r3 in")
	require.Empty(t, admit(nil, []string{"r3"}), "nothing waits: a release lets nothing in")
	require.Equal(t, []string{"r4"}, admit([]string{"r4", "r5"}, nil), "r2 (never released) and r4 fill the share")
	require.Empty(t, admit(nil, nil), "r2 and r4 are not stale yet: r5 waits")
	time.Sleep(stale + 100*time.Millisecond)
	require.Equal(t, []string{"r5"}, admit(nil, nil), "r2 and r4 are stale: they no longer keep r5 out")
	require.Equal(t, []string{"r1", "r2", "r3", "r4", "r5"}, tasks.ReadyRuns(t, opt))
	_, waiting := tasks.RunsInRedis(t, opt)
	require.Empty(t, waiting)
}
