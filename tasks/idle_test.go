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

// idleMaxPerSecond is the most Redis commands, and the most PostgreSQL
// transactions, a second an idle process may send (issue 47: "idle is
// free").
const idleMaxPerSecond = 5

// Finding (issue 47): an idle `valruns worker` sent Redis about 860
// commands a second, asynq's poll every RUN_POLL_INTERVAL (2 ms) and the
// direct hand-off's. Now a worker blocks on the ready list and asynq polls
// every 10 s: an idle `valruns worker` and an idle `valruns serve --worker`,
// each on a Redis and a database of its own with its default settings,
// send at most idleMaxPerSecond commands a second over a minute, counted
// by Redis (INFO commandstats, every command, those its scripts call
// included), and as many PostgreSQL transactions (pg_stat_database).
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

			const window = time.Minute
			before, xacts := redisCalls(t, rc), dbXacts(t, env)
			time.Sleep(window)
			after, xacts := redisCalls(t, rc), dbXacts(t, env)-xacts
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
			rate, xrate := total/window.Seconds(), float64(xacts)/window.Seconds()
			t.Logf("idle %s: %.2f Redis commands a second (%s), %.2f PostgreSQL transactions a second, over %s",
				tc.name, rate, strings.Join(busiest, " "), xrate, window)
			require.LessOrEqual(t, rate, float64(idleMaxPerSecond), "an idle %s sends Redis at most %d commands a second: %s",
				tc.name, idleMaxPerSecond, strings.Join(busiest, " "))
			require.LessOrEqual(t, xrate, float64(idleMaxPerSecond), "an idle %s sends PostgreSQL at most %d transactions a second",
				tc.name, idleMaxPerSecond)
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

// dbXacts is the transactions committed and rolled back in env's database
// so far (pg_stat_database; a backend reports its own within about a
// second of going idle).
func dbXacts(t *testing.T, env *apitest.Env) int64 {
	t.Helper()
	var n int64
	require.NoError(t, env.DB.Raw(`SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()`).Scan(&n).Error)
	return n
}
