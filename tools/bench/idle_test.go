package main

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// TestCommandStatsCountsWhatWasSent: between two readings of INFO
// commandstats on a Redis of its own, each command's calls grow by what
// was sent, and INFO's by the first reading alone (idle leaves it out).
func TestCommandStatsCountsWhatWasSent(t *testing.T) {
	t.Parallel()
	needTool(t, "redis-server")
	ctx := context.Background()
	p, url, err := startRedis(t.TempDir())
	require.NoError(t, err)
	t.Cleanup(func() { p.Stop(5 * time.Second) })
	opt, err := redis.ParseURL(url)
	require.NoError(t, err)
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	before := commandStats(ctx, rdb, &err)
	for range 7 {
		require.NoError(t, rdb.Exists(ctx, "k").Err())
	}
	for range 3 {
		_ = rdb.RPopLPush(ctx, "a", "b").Err() // nil: the list is empty
	}
	after := commandStats(ctx, rdb, &err)
	require.NoError(t, err)
	require.Equal(t, int64(7), after["exists"]-before["exists"])
	require.Equal(t, int64(3), after["rpoplpush"]-before["rpoplpush"])
	require.Equal(t, int64(1), after["info"]-before["info"])
}

// TestIdleSection: each idle process against issue 47's target of 5
// commands a second, its most sent commands first; a failed one is not
// measured.
func TestIdleSection(t *testing.T) {
	t.Parallel()
	s := idleSection([]idleResult{
		{Mode: "worker", Window: time.Minute, Commands: 860, Top: map[string]float64{"evalsha": 230, "rpoplpush": 230, "exists": 230, "brpop": 170},
			Xacts: 2.5},
		{Mode: "serve --worker", Window: time.Minute, Commands: 4.9, Top: map[string]float64{"brpop": 4.9}},
	})
	got := byName(s.Checks)
	require.Equal(t, "MISS", got["idle `valruns worker`: Redis commands per second"].result())
	require.Equal(t, "860.0/s over 1m0s", got["idle `valruns worker`: Redis commands per second"].Measured)
	require.Equal(t, "PASS", got["idle `valruns serve --worker`: Redis commands per second"].result())
	require.Contains(t, s.Body, "| `valruns worker` | 860.0 | EVALSHA 230.0, EXISTS 230.0, RPOPLPUSH 230.0, BRPOP 170.0 | 2.5 |")
	require.Equal(t, "not measured", idleSection([]idleResult{{Mode: "worker", Failed: "boom"}}).Checks[0].result())
}
