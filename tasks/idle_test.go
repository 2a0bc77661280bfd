package tasks_test

import (
	"context"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/internal/apitest"
	"github.com/valruns/valruns/internal/proctest"
)

// idleMaxPerSecond is the most Redis commands a second an idle process
// may send (issue 47: "idle is free").
const idleMaxPerSecond = 5

// Finding (issue 47): an idle `valruns worker` sent Redis about 860
// commands a second, asynq's poll every RUN_POLL_INTERVAL (2 ms) and the
// direct hand-off's. Now a worker blocks on the ready list and asynq polls
// every 10 s: an idle `valruns worker` and an idle `valruns serve --worker`,
// each on a Redis of its own with its default settings, send at most
// idleMaxPerSecond commands a second, counted by Redis (INFO
// commandstats, every command, those its scripts call included).
func TestAnIdleWorkerBarelyTalksToRedis(t *testing.T) {
	t.Parallel()
	bin := proctest.Binary(t)
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"worker", []string{"worker"}},
		{"serve --worker", []string{"serve", "--worker"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			env := apitest.New(t)
			rs := startRedisServer(t, proctest.FreePort(t))
			rc := redis.NewClient(&redis.Options{Addr: rs.addr()})
			t.Cleanup(func() { _ = rc.Close() })
			cmd := exec.Command(bin, tc.args...)
			log := &proctest.Log{}
			cmd.Env = proctest.Env("DATABASE_URL="+env.DBURL, "REDIS_URL=redis://"+rs.addr()+"/0",
				"HTTP_ADDR="+proctest.FreeAddr(t), "WORKER_METRICS_ADDR="+proctest.FreeAddr(t), "LOG_LEVEL=warn")
			cmd.Stdout, cmd.Stderr = log, log
			require.NoError(t, cmd.Start())
			t.Cleanup(func() {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
				if t.Failed() {
					t.Logf("valruns %s output:\n%s", strings.Join(tc.args, " "), log.String())
				}
			})
			ctx := context.Background()
			apitest.Eventually(t, 30*time.Second, func() bool {
				n, err := rc.ZCard(ctx, "asynq:servers").Result()
				return err == nil && n > 0
			}, "the worker has started")
			time.Sleep(3 * time.Second) // past start-up's own calls

			const window = 20 * time.Second
			before := redisCalls(t, rc)
			time.Sleep(window)
			after := redisCalls(t, rc)
			var total float64
			var busiest []string
			for name, n := range after {
				d := n - before[name]
				if name == "info" || d == 0 {
					continue // the test's own
				}
				total += float64(d)
				busiest = append(busiest, name+"="+strconv.FormatInt(d, 10))
			}
			rate := total / window.Seconds()
			t.Logf("idle %s: %.2f Redis commands a second (%s over %s)", tc.name, rate, strings.Join(busiest, " "), window)
			require.LessOrEqual(t, rate, float64(idleMaxPerSecond), "an idle %s sends Redis at most %d commands a second: %s",
				tc.name, idleMaxPerSecond, strings.Join(busiest, " "))
		})
	}
}

// redisCalls reads INFO commandstats: calls per command.
func redisCalls(t *testing.T, rc *redis.Client) map[string]int64 {
	t.Helper()
	info, err := rc.Info(context.Background(), "commandstats").Result()
	require.NoError(t, err)
	calls := map[string]int64{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		for _, f := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(f, "calls="); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				require.NoError(t, err)
				calls[strings.TrimPrefix(name, "cmdstat_")] = n
			}
		}
	}
	return calls
}
