package tasks_test

import (
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"
)

// TestTestsSeeAForeignWorker: a Redis DB handed to a test is checked for a
// live asynq server before it is flushed (refuseForeignWorker), so a `make
// run` whose REDIS_URL names one of the tests' DBs is never flushed. A worker
// of this test on the DB counts as live, one that has shut down does not.
func TestTestsSeeAForeignWorker(t *testing.T) {
	opt := newRedis(t)
	n, err := liveServers(opt)
	require.NoError(t, err)
	require.Zero(t, n, "a DB handed out holds no live server")

	srv := asynq.NewServer(opt, asynq.Config{Concurrency: 1, LogLevel: asynq.FatalLevel})
	require.NoError(t, srv.Start(asynq.NewServeMux()))
	deadline := time.Now().Add(time.Minute)
	for n == 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		n, err = liveServers(opt)
		require.NoError(t, err)
	}
	require.EqualValues(t, 1, n, "a running asynq server (such as make run's worker) is seen")
	srv.Shutdown()
	n, err = liveServers(opt)
	require.NoError(t, err)
	require.Zero(t, n, "a server that shut down is not")
}
