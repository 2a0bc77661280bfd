package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestStrictGoalsAreIssue48s: at 1 client at least 1.2x the stricter peer
// and a p50 below its (equal is a MISS), and at least 0.6x the limit; at 8
// at least 1.5x; no target elsewhere.
func TestStrictGoalsAreIssue48s(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	v, p, lim := at(valrunsSide, noKey, 1, 1200, ms), at(strictSide, noKey, 1, 1000, ms), at("pgbench", pgbenchPeerScenario, 1, 2000, ms)
	peer, limit := strictCheck(noKey, 1, &v, &p, &lim)
	require.Equal(t, "MISS", peer.result(), "a p50 equal to its is not below it")
	require.Equal(t, "1.20x (1200 / 1000 rps), p50 1.0 / 1.0 ms", peer.Measured)
	require.Equal(t, "PASS", limit.result())
	require.Equal(t, "0.60x (1200 rps / 2000 tps)", limit.Measured)

	v.P50 = ms - time.Microsecond
	peer, _ = strictCheck(noKey, 1, &v, &p, &lim)
	require.Equal(t, "PASS", peer.result())
	v.RPS = 1199
	peer, limit = strictCheck(noKey, 1, &v, &p, &lim)
	require.Equal(t, []string{"MISS", "MISS"}, []string{peer.result(), limit.result()})

	v.RPS, v.Clients, p.Clients = 1500, 8, 8
	peer, limit = strictCheck(newKey, 8, &v, &p, &lim)
	require.Equal(t, ">= 1.5x it", peer.Target)
	require.Equal(t, "PASS", peer.result())
	require.Nil(t, limit, "no limit target at 8")
	p.Failed = "the peer exited"
	peer, _ = strictCheck(newKey, 8, &v, &p, nil)
	require.Equal(t, "not measured", peer.result())

	for _, n := range []int{2, 4, 16, 32, 64, 128} {
		ratio, p50, limit := strictGoal(n)
		require.Zero(t, ratio+limit, n)
		require.False(t, p50, n)
	}
}

// TestStricterPeerRunsAt1And8: the stricter peer runs with the peer's part,
// after it in each round, for starts at 1 and 8 clients only.
func TestStricterPeerRunsAt1And8(t *testing.T) {
	t.Parallel()
	p := makePlan(true)
	require.Equal(t, []string{valrunsSide, peerSide, strictSide}, p.sides(noKey, 1))
	require.Equal(t, []string{valrunsSide, peerSide, strictSide}, p.sides(newKey, 8))
	require.Equal(t, []string{valrunsSide, peerSide}, p.sides(replay, 1))
	require.Equal(t, []string{valrunsSide, peerSide}, p.sides(noKey, 32))
	p.Only = map[string]bool{"valruns": true}
	require.Equal(t, []string{valrunsSide}, p.sides(noKey, 1))
	p.Only = map[string]bool{"peer": true}
	require.Equal(t, []string{peerSide, strictSide}, p.sides(newKey, 8))
}
