package tasks_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/internal/apitest"
	"github.com/valruns/valruns/tasks"
)

// The cleanup deletes exactly the expired keys (with their day's
// partition: the keys here expired a day ago) while starts keep arriving:
// every start answers 201, live and new keys stay, runs of deleted keys
// stay and still name their key.
func TestCleanupDeletesExactlyExpiredKeysDuringStarts(t *testing.T) {
	env := apitest.New(t)
	org := env.NewOrg("acme")
	wf := env.NewWorkflow(org, orderWorkflow)
	w := newWorker(t, env, idleRedis(), func(c *tasks.Config) { c.CleanupBatchSize = 1000 })

	const expired, live = 50_000, 1_000
	insertKeys(t, env, org.ID, "expired-", expired, true)
	insertKeys(t, env, org.ID, "live-", live, false)

	// Runs whose keys have expired: the runs must outlive their keys.
	const linked = 5
	var linkedRuns []string
	for i := range linked {
		linkedRuns = append(linkedRuns, startRun(t, env, org, wf, validOrder, "Idempotency-Key", fmt.Sprintf("linked-%d", i)))
	}
	for _, id := range linkedRuns {
		require.NotNil(t, readRun(t, env, id).Key)
	}
	res := env.DB.Exec(`UPDATE idempotency_keys SET created_at = now() - interval '2 days', expires_at = now() - interval '1 day'
		WHERE key LIKE 'linked-%'`)
	require.NoError(t, res.Error)
	require.EqualValues(t, linked, res.RowsAffected)
	require.EqualValues(t, expired+live+linked, env.Count("idempotency_keys", ""))

	// 20 clients keep starting runs (each with a new key) until the cleanup
	// is over; each sends at least 3.
	const clients = 20
	done := make(chan struct{})
	var started, during atomic.Int64
	var cleaning atomic.Bool
	statuses := make([][]int, clients)
	var wg sync.WaitGroup
	for g := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 500; i++ {
				if i >= 3 {
					select {
					case <-done:
						return
					default:
					}
				}
				body := `{"submission": {"customer": "ACME", "total": 1}}`
				r := env.Do(http.MethodPost, "/api/workflows/"+wf+"/start/", org.Token, body,
					"Idempotency-Key", fmt.Sprintf("during-%d-%d", g, i))
				statuses[g] = append(statuses[g], r.Status)
				if r.Status == http.StatusCreated {
					started.Add(1)
					if cleaning.Load() {
						during.Add(1)
					}
				}
			}
		}()
	}
	cleaning.Store(true)
	err := w.Mux().ProcessTask(context.Background(), asynq.NewTask(tasks.TypeCleanup, nil))
	cleaning.Store(false)
	close(done)
	wg.Wait()
	require.NoError(t, err)

	total := 0
	for g, ss := range statuses {
		for i, s := range ss {
			require.Equal(t, http.StatusCreated, s, "client %d start %d", g, i)
		}
		total += len(ss)
	}
	require.EqualValues(t, total, started.Load())
	require.GreaterOrEqual(t, total, clients*3)
	t.Logf("%d starts, %d of them answered while the cleanup ran", total, during.Load())

	require.EqualValues(t, 0, env.Count("idempotency_keys", "expires_at <= now()"), "no expired key left")
	require.EqualValues(t, live+total, env.Count("idempotency_keys", ""), "exactly the expired keys are gone")
	require.EqualValues(t, live, env.Count("idempotency_keys", "key LIKE 'live-%'"))
	require.EqualValues(t, total, env.Count("idempotency_keys", "key LIKE 'during-%'"))
	require.EqualValues(t, expired+linked, metricValue(t, w.Registry, "valruns_idempotency_keys_deleted_total"))
	// The keys' partitions it left: through now + IDEMPOTENCY_TTL and two
	// days ahead, today's the oldest.
	require.GreaterOrEqual(t, metricValue(t, w.Registry, "valruns_idempotency_partitions_ahead"), 3.0)
	var today time.Time
	require.NoError(t, env.DB.Raw(`SELECT CAST(date_trunc('day', now() AT TIME ZONE 'UTC') AS timestamp) AT TIME ZONE 'UTC'`).Scan(&today).Error)
	require.EqualValues(t, today.Unix(), metricValue(t, w.Registry, "valruns_idempotency_oldest_partition_timestamp_seconds"))
	for _, id := range linkedRuns {
		r := readRun(t, env, id)
		require.Equal(t, "queued", r.Status, "the run still exists")
		require.NotNil(t, r.Key, "it still names the key that started it")
	}
	require.EqualValues(t, total+linked, env.Count("validation_runs", "idempotency_key IS NOT NULL"))
	require.EqualValues(t, linked+total, env.Count("validation_runs", ""))

	// Nothing left: a second cleanup deletes nothing.
	require.NoError(t, w.Mux().ProcessTask(context.Background(), asynq.NewTask(tasks.TypeCleanup, nil)))
	require.EqualValues(t, expired+linked, metricValue(t, w.Registry, "valruns_idempotency_keys_deleted_total"))
}

// The periodic cleanup fires by itself on its schedule.
func TestScheduledCleanupFires(t *testing.T) {
	t.Parallel()
	env := apitest.New(t)
	org := env.NewOrg("acme")
	insertKeys(t, env, org.ID, "expired-", 300, true)
	insertKeys(t, env, org.ID, "live-", 10, false)
	w := startWorker(t, env, newRedis(t), func(c *tasks.Config) { c.CleanupSchedule = "@every 1s" })

	apitest.Eventually(t, 30*time.Second, func() bool {
		return env.Count("idempotency_keys", "expires_at <= now()") == 0
	}, "the scheduled cleanup deletes the expired keys")
	require.EqualValues(t, 10, env.Count("idempotency_keys", ""))
	eventuallyMetric(t, w.Registry, 300, "valruns_idempotency_keys_deleted_total")
	apitest.Eventually(t, 10*time.Second, func() bool {
		return metricValue(t, w.Registry, "valruns_tasks_processed_total", "type", tasks.TypeCleanup) >= 1
	}, "the cleanup task is counted")
}

// Two workers (two schedulers) on the same Redis and database enqueue one
// cleanup per tick, with the tick's TaskID, and each tick runs once.
func TestTwoSchedulersCleanOncePerTick(t *testing.T) {
	t.Parallel()
	env := apitest.New(t)
	org := env.NewOrg("acme")
	insertKeys(t, env, org.ID, "expired-", 500, true)
	rdb := newRedis(t)
	every := func(c *tasks.Config) { c.CleanupSchedule = "@every 1s" }
	w1 := startWorker(t, env, rdb, every)
	w2 := startWorker(t, env, rdb, every)

	insp := asynq.NewInspector(rdb)
	defer insp.Close()
	apitest.Eventually(t, 30*time.Second, func() bool {
		done, err := insp.ListCompletedTasks("default", asynq.PageSize(1000))
		return err == nil && len(done) >= 4
	}, "four ticks' cleanups complete")
	// Stop both: every task counted below has been run, or never will be.
	w1.Stop()
	w2.Stop()

	var all []*asynq.TaskInfo
	completed := 0
	for _, list := range []func(string, ...asynq.ListOption) ([]*asynq.TaskInfo, error){
		insp.ListCompletedTasks, insp.ListPendingTasks, insp.ListActiveTasks,
		insp.ListRetryTasks, insp.ListArchivedTasks, insp.ListScheduledTasks,
	} {
		infos, err := list("default", asynq.PageSize(1000))
		require.NoError(t, err)
		for _, info := range infos {
			require.Equal(t, tasks.TypeCleanup, info.Type)
			require.Contains(t, []asynq.TaskState{asynq.TaskStateCompleted, asynq.TaskStatePending}, info.State,
				"task %s: %s (%s)", info.ID, info.State, info.LastErr)
			if info.State == asynq.TaskStateCompleted {
				completed++
			}
		}
		all = append(all, infos...)
	}

	ticks := map[time.Time]bool{}
	var first, last time.Time
	for _, info := range all {
		stamp, ok := strings.CutPrefix(info.ID, "idempotency:cleanup:")
		require.True(t, ok, "task id %q names its tick", info.ID)
		tick, err := time.Parse(time.RFC3339, stamp)
		require.NoError(t, err, "task id %q", info.ID)
		require.Equal(t, stamp, tick.UTC().Format(time.RFC3339), "a UTC second")
		require.False(t, ticks[tick], "tick %s enqueued twice", stamp)
		ticks[tick] = true
		if first.IsZero() || tick.Before(first) {
			first = tick
		}
		if tick.After(last) {
			last = tick
		}
	}
	require.Len(t, ticks, len(all), "one task per tick")
	require.LessOrEqual(t, len(ticks), int(last.Sub(first)/time.Second)+1, "no more tasks than ticks (one per second)")

	processed := metricValue(t, w1.Registry, "valruns_tasks_processed_total", "type", tasks.TypeCleanup) +
		metricValue(t, w2.Registry, "valruns_tasks_processed_total", "type", tasks.TypeCleanup)
	require.EqualValues(t, completed, processed, "each tick's cleanup ran once")
	deleted := metricValue(t, w1.Registry, "valruns_idempotency_keys_deleted_total") +
		metricValue(t, w2.Registry, "valruns_idempotency_keys_deleted_total")
	require.EqualValues(t, 500, deleted, "every expired key deleted once")
	require.EqualValues(t, 0, env.Count("idempotency_keys", ""))
}
