package tasks_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/internal/apitest"
	"github.com/valruns/valruns/internal/proctest"
	"github.com/valruns/valruns/tasks"
)

// A worker that ends a run names it on RunsEndedChannel, which the API's
// long-poll watches (WatchRunsEnded); a worker that ends nothing says
// nothing. A Redis of its own: a channel is shared by every database of a
// server, so other tests' workers would be heard too.
func TestWorkerSaysRunsEnded(t *testing.T) {
	t.Parallel()
	rs := startRedisServer(t, proctest.FreePort(t))
	rdb := asynq.RedisClientOpt{Addr: rs.addr()}
	env := apitest.New(t)
	org := env.NewOrg("acme")
	wf := env.NewWorkflow(org, orderWorkflow)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rc := redisClient(rdb)
	defer rc.Close()
	ended := tasks.WatchRunsEnded(ctx, rc)
	apitest.Eventually(t, 20*time.Second, func() bool {
		n, err := rc.PubSubNumSub(ctx, tasks.RunsEndedChannel).Result()
		return err == nil && n[tasks.RunsEndedChannel] == 1
	}, "the watcher has subscribed")

	startWorker(t, env, rdb, noSweep)
	time.Sleep(200 * time.Millisecond) // a quiet worker: nothing ended, nothing said
	require.Empty(t, ended, "no run ended yet")

	id := startRun(t, env, org, wf, validOrder)
	require.Equal(t, "passed", waitRun(t, env, org, id, 20*time.Second).Status)
	var heard []string
	apitest.Eventually(t, 20*time.Second, func() bool {
		select {
		case ids := <-ended:
			heard = append(heard, ids...)
		default:
		}
		return slices.Contains(heard, id)
	}, "the worker named the run it ended")
}
