package main

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func rps(section, scenario string, v float64) row {
	return row{Section: section, Scenario: scenario, Clients: ratioClients, RPS: v, PeakRSSKB: 80 << 10}
}

// TestChecksCompareTheRightRuns: each ratio divides the runs it names, at
// 32 clients, and says PASS only when its target is met.
func TestChecksCompareTheRightRuns(t *testing.T) {
	t.Parallel()
	r := &results{Rows: []row{
		rps("valruns", "start, no key", 1000),
		rps("valruns", "start, new key", 900),
		rps("valruns", "replay", 9000),
		rps("valruns", tracingOffName, 1000),
		rps("valruns", tracingOnName, 850),
		rps("peer", "start, no key", 900),
		rps("peer", "start, new key", 1000),
		rps("peer", "replay", 1500),
		rps("pgbench", "new-key start SQL, 1 org", 1700),
		rps("pgbench", "new-key start SQL, 100 orgs", 2000),
		{Section: "valruns", Scenario: "start, new key", Clients: 8, RPS: 99999}, // another concurrency: ignored
		{Section: "valruns", Scenario: "hot key", Clients: 128, PeakRSSKB: 160 << 10},
	},
		Cleanup: &cleanupResult{AloneDeleted: 1_000_000, Alone: 10 * time.Second,
			Baseline: row{P99: 100 * time.Millisecond}, During: row{P99: 150 * time.Millisecond}},
		Latency: &latencyResult{Observed: []time.Duration{10 * time.Millisecond, 20 * time.Millisecond, 90 * time.Millisecond}},
	}
	got := map[string]check{}
	for _, c := range r.checks() {
		got[c.Name] = c
	}
	want := map[string]bool{
		"new-key start vs the peer's new-key start":                    false, // 0.90
		"no-key start vs the peer's no-key start":                      false, // 1.11 < 1.2
		"new-key start vs no-key start":                                true,  // 0.90
		"new-key start vs pgbench of its own SQL (1 org)":              true,  // 0.53
		"its SQL: pgbench 1 org vs 100 orgs":                           true,  // 0.85
		"replay vs the peer's replay":                                  true,  // 6.0
		"replay vs new-key start":                                      true,  // 10
		"tracing on (100% sampled) vs off, new key + worker":           true,  // 0.85
		"cleanup of expired keys, alone":                               true,  // 100000/s
		"new-key start p99 during the cleanup vs without (32 clients)": true,  // 1.5
		"server peak RSS, heaviest scenario":                           false, // 160 MB
		"start-to-running p50, 1 client, serve --worker":               true,  // 20 ms
	}
	require.Len(t, got, len(want))
	for name, pass := range want {
		c, ok := got[name]
		require.True(t, ok, name)
		require.Equal(t, pass, c.Pass, "%s: %s", name, c.Measured)
	}
	require.True(t, strings.HasPrefix(got["new-key start vs the peer's new-key start"].Measured, "0.90x (900 / 1000"))
	require.Contains(t, got["server peak RSS, heaviest scenario"].Measured, "hot key, 128 clients")

	// Missing runs are MISS with "no data", never a PASS.
	empty := (&results{}).checks()
	for _, c := range empty {
		require.False(t, c.Pass, c.Name)
		require.Equal(t, "no data", c.Measured, c.Name)
	}
}

// TestMarkdownShowsErrors: a run with errors is flagged in its ratio and
// counted in the summary.
func TestMarkdownShowsErrors(t *testing.T) {
	t.Parallel()
	bad := rps("valruns", "start, new key", 900)
	bad.Non2xx = 3
	r := &results{Mode: "quick", Rows: []row{bad, rps("peer", "start, new key", 1000)}}
	require.Equal(t, 3, r.totalErrors())
	md := r.markdown()
	require.Contains(t, md, "(runs had errors)")
	require.Contains(t, md, "**3 answers were errors")
	require.Contains(t, md, "| valruns | start, new key | 32 | 900 |")
}

func TestRatioTextNeverRoundsOntoTheTarget(t *testing.T) {
	t.Parallel()
	require.Equal(t, "0.696", ratioText(0.6957, 0.7))
	require.Equal(t, "0.70", ratioText(0.7, 0.7))
	require.Equal(t, "1.23", ratioText(1.2345, 1.0))
}

// TestWhyBehindUsesThisRunsNumbers: when a new-key start serves less than
// the peer's, RESULTS.md explains it with the two pgbench limits and the
// servers' CPU of the same run; when it does not, or a number is missing,
// it says nothing.
func TestWhyBehindUsesThisRunsNumbers(t *testing.T) {
	t.Parallel()
	vr := rps("valruns", "start, new key", 1600)
	vr.CPUPerReq = 300 * time.Microsecond
	peer := rps("peer", "start, new key", 1800)
	peer.CPUPerReq = 420 * time.Microsecond
	r := &results{Rows: []row{vr, peer,
		rps("pgbench", "new-key start SQL, 1 org", 2000),
		rps("pgbench", pgbenchPeerScenario, 9000),
	}}
	r.Capture.A = requestCapture{Stmts: make([]wireStmt, 5), RoundTrips: 3}
	r.PeerCapture.A = requestCapture{Stmts: make([]wireStmt, 1), RoundTrips: 1}
	why := r.whyBehind()
	for _, s := range []string{
		"**2000 tps** and the peer's at **9000 tps**, so the peer's start asks it for 4.50x less work",
		"valruns serves 1600 rps, 0.80x its SQL's limit; the peer 1800 rps, 0.20x its own",
		"valruns 0.300 ms, the peer 0.420 ms",
		"5 statements in 3 round trips",
		"The peer's is 1 statement in 1 round trip",
	} {
		require.Contains(t, why, s)
	}
	require.Contains(t, r.markdown(), "## Why a new-key start serves less than the peer's")

	ahead := &results{Rows: []row{rps("valruns", "start, new key", 2000), peer,
		rps("pgbench", "new-key start SQL, 1 org", 2000), rps("pgbench", pgbenchPeerScenario, 9000)}}
	require.Empty(t, ahead.whyBehind())
	missing := &results{Rows: []row{vr, peer, rps("pgbench", "new-key start SQL, 1 org", 2000)}}
	require.Empty(t, missing.whyBehind())
}
