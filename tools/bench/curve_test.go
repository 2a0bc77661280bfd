package main

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// at is a measured run of section and scenario at clients.
func at(section, scenario string, clients int, rps float64, p50 time.Duration) row {
	return row{Section: section, Scenario: scenario, Clients: clients, RPS: rps, P50: p50, P99: 3 * p50}
}

// TestStartGoalsAreTheIssues: 1 client >= 1.0x and p50 <= the peer's, 8
// >= 1.3x, 32 >= 1.75x, 128 >= 2.5x, nothing in between; replays >= 5x at
// every count.
func TestStartGoalsAreTheIssues(t *testing.T) {
	t.Parallel()
	type goal struct {
		ratio float64
		p50   bool
	}
	at := func(sc string, n int) goal { r, p := startGoal(sc, n); return goal{r, p} }
	for _, sc := range []string{noKey, newKey} {
		require.Equal(t, goal{1, true}, at(sc, 1))
		require.Equal(t, goal{1.3, false}, at(sc, 8))
		require.Equal(t, goal{1.75, false}, at(sc, 32))
		require.Equal(t, goal{2.5, false}, at(sc, 128))
		for _, n := range []int{2, 4, 16, 64, 256} {
			require.Zero(t, at(sc, n).ratio, n)
		}
	}
	for _, n := range makePlan(false).Levels {
		require.Equal(t, goal{5, false}, at(replay, n), n)
	}
	c, _ := startCheck(noKey, 1, nil, nil)
	require.Equal(t, ">= 1.0x the peer, p50 <= the peer's", c.Target)
	c, _ = startCheck(newKey, 32, nil, nil)
	require.Equal(t, ">= 1.75x the peer", c.Target)
}

// curveResults is a quick-mode run: 1, 8 and 32 clients measured, the rest
// of the curve not.
func curveResults() *results {
	ms := time.Millisecond
	return &results{Mode: "quick", Timing: timing{Warm: time.Second, Dur: 2 * time.Second}, PgTiming: timing{Dur: 2 * time.Second}, Rows: []row{
		// 1 client: no key faster but slower at p50; new key faster and quicker.
		at("valruns", "start, no key", 1, 1100, 2*ms), at("peer", "start, no key", 1, 1000, 1500*time.Microsecond),
		at("valruns", "start, new key", 1, 1000, ms), at("peer", "start, new key", 1, 1000, ms),
		at("valruns", "replay", 1, 5000, ms/5), at("peer", "replay", 1, 1000, ms),
		at("pgbench", pgbenchPeerScenario, 1, 3000, ms/3), at("pgbench", pgbenchStartScenario, 1, 700, 2*ms),
		// The stricter peer at 1: no key 1.22x but a p50 above its; new key
		// 1.25x and a p50 below.
		at(strictSide, "start, no key", 1, 900, ms), at(strictSide, "start, new key", 1, 800, 2*ms),
		// 8 clients: 1.29x is a MISS of 1.3x; the replay 4.99x a MISS of 5x.
		at("valruns", "start, no key", 8, 1290, 5*ms), at("peer", "start, no key", 8, 1000, 5*ms),
		at("valruns", "start, new key", 8, 1300, 5*ms), at("peer", "start, new key", 8, 1000, 5*ms),
		at("valruns", "replay", 8, 4990, ms), at("peer", "replay", 8, 1000, ms),
		at("pgbench", pgbenchPeerScenario, 8, 5000, ms),
		// The stricter peer at 8: no key 1.50x, new key missing.
		at(strictSide, "start, no key", 8, 860, 5*ms),
		// 32 clients: the peer's no-key run failed, its new-key run is
		// missing; new key 0.67x no key.
		at("valruns", "start, no key", 32, 3000, 9*ms), {Section: "peer", Scenario: "start, no key", Clients: 32, RPS: 100, Failed: "the peer exited"},
		at("valruns", "start, new key", 32, 2000, 9*ms),
		at("valruns", "replay", 32, 9000, ms), at("peer", "replay", 32, 1000, ms),
		{Section: "pgbench", Scenario: pgbenchPeerScenario, Clients: 32, RPS: 4000, CappedAt: 20},
		// A count outside the full curve gets its row.
		at("valruns", "start, no key", 2, 10, ms),
	}}
}

// TestCurveChecks: each count's target compares the right runs; a count
// whose runs are missing or failed is "not measured", never a PASS.
func TestCurveChecks(t *testing.T) {
	t.Parallel()
	got := byName(curveResults().curveChecks())
	want := map[string]string{
		"start, no key, 1 client: valruns vs the peer":          "MISS", // 1.10x, but p50 2.0 > 1.5 ms
		"start, no key, 8 clients: valruns vs the peer":         "MISS", // 1.29x < 1.3x
		"start, no key, 32 clients: valruns vs the peer":        "not measured",
		"start, no key, 128 clients: valruns vs the peer":       "not measured",
		"start, new key, 1 client: valruns vs the peer":         "PASS", // 1.00x, p50 equal
		"start, new key, 8 clients: valruns vs the peer":        "PASS", // 1.30x
		"start, new key, 32 clients: valruns vs the peer":       "not measured",
		"start, new key, 128 clients: valruns vs the peer":      "not measured",
		"replay, 1 client: valruns vs the peer":                 "PASS", // 5.00x
		"replay, 8 clients: valruns vs the peer":                "MISS", // 4.99x
		"replay, 32 clients: valruns vs the peer":               "PASS", // 9x
		"start, new key vs start, no key, 32 clients (valruns)": "MISS", // 0.67x

		"start, no key, 1 client: valruns vs the peer without its enqueue (issue 48)":    "MISS", // 1.22x, but p50 2.0 > 1.0 ms
		"start, no key, 1 client: valruns vs the limit of the peer's INSERT (issue 48)":  "MISS", // 0.37x
		"start, no key, 8 clients: valruns vs the peer without its enqueue (issue 48)":   "PASS", // 1.50x
		"start, new key, 1 client: valruns vs the peer without its enqueue (issue 48)":   "PASS", // 1.25x, p50 1.0 < 2.0 ms
		"start, new key, 1 client: valruns vs the limit of the peer's INSERT (issue 48)": "MISS", // 0.33x
		"start, new key, 8 clients: valruns vs the peer without its enqueue (issue 48)":  "not measured",
	}
	for _, n := range []int{2, 4, 16, 64, 128} {
		want["replay, "+clientsText(n)+": valruns vs the peer"] = "not measured"
	}
	require.Len(t, got, len(want))
	for name, res := range want {
		require.Equal(t, res, got[name].result(), "%s: %s", name, got[name].Measured)
	}
	require.Equal(t, "1.10x (1100 / 1000 rps), p50 2.0 / 1.5 ms", got["start, no key, 1 client: valruns vs the peer"].Measured)
	require.Equal(t, "4.99x (4990 / 1000 rps)", got["replay, 8 clients: valruns vs the peer"].Measured)

	for _, c := range (&results{}).curveChecks() {
		require.Equal(t, "not measured", c.result(), c.Name)
	}
}

// TestCurveSection: the targets first, then one table per scenario, a row
// per count of the full curve, the limit and valruns' fraction of it, and
// the counts quick mode skipped shown as not measured.
func TestCurveSection(t *testing.T) {
	t.Parallel()
	r := curveResults()
	s := r.curveSection()
	require.Equal(t, "## The curve: starts", s.Heading)
	for _, want := range []string{
		"| 1 | 1100 | 1000 | 1.10x | 3000 | 0.37x | 700 | 2.0 / 6.0 | 1.5 / 4.5 |",
		"| 8 | 1300 | 1000 | 1.30x | 5000 | 0.26x | not measured | 5.0 / 15.0 | 5.0 / 15.0 |",
		"| 4 | not measured | not measured | - | not measured | - | not measured | - | - |",
		"| 32 | 3000 | FAILED | - | 4000 (20 conns) | 0.75x | not measured | 9.0 / 27.0 | - |",
		"| 2 | 10 | not measured | - | not measured | - | not measured | 1.0 / 3.0 | - |",
	} {
		require.Contains(t, s.Body, want)
	}
	require.Equal(t, 3, strings.Count(s.Body, "| clients | valruns rps | peer rps |"))
	text := s.text(r)
	require.Contains(t, text, "Targets: 6 PASS, 7 MISS, 10 not measured.")
	for _, want := range []string{
		"| start, no key, 1 client: valruns vs the peer | 1.10x (1100 / 1000 rps), p50 2.0 / 1.5 ms | >= 1.0x the peer, p50 <= the peer's | MISS |",
		"| replay, 16 clients: valruns vs the peer | not measured | >= 5.0x the peer | not measured |",
		"| start, no key, 1 client: valruns vs the peer without its enqueue (issue 48) | 1.22x (1100 / 900 rps), p50 2.0 / 1.0 ms | >= 1.2x it, p50 < its | MISS |",
		"| start, no key, 1 client: valruns vs the limit of the peer's INSERT (issue 48) | 0.37x (1100 rps / 3000 tps) | >= 0.6x the limit | MISS |",
	} {
		require.Contains(t, text, want)
	}
	require.Less(t, strings.Index(text, "| target |"), strings.Index(text, "### Start without a key"), "the targets come first")
	for _, want := range []string{
		"| start, no key | 1 | 1100 | 900 | 1.22x | 2.0 / 6.0 | 1.0 / 3.0 | 0.37x |",
		"| start, no key | 8 | 1290 | 860 | 1.50x | 5.0 / 15.0 | 5.0 / 15.0 | 0.26x |",
		"| start, new key | 8 | 1300 | not measured | - | 5.0 / 15.0 | - | 0.26x |",
	} {
		require.Contains(t, s.Body[strings.Index(s.Body, "### Issue 48: against the stricter peer"):], want)
	}
}

// TestMergeRounds: a scenario's rounds make one row of their means (errors:
// the sum) that lists each round's rps; one failed
// round fails the row.
func TestMergeRounds(t *testing.T) {
	t.Parallel()
	a := row{Section: "valruns", Scenario: "start, new key", Clients: 8, RPS: 1000, P50: 4 * time.Millisecond, P99: 10 * time.Millisecond,
		P999: 20 * time.Millisecond, Errors: 1, CPUPerReq: 400 * time.Microsecond, Notes: []string{"first"}}
	b := a
	b.RPS, b.P50, b.P99, b.P999, b.Errors, b.CPUPerReq = 1400, 6*time.Millisecond, 14*time.Millisecond, 30*time.Millisecond, 2, 200*time.Microsecond
	b.Notes = []string{"second"}
	require.Equal(t, a, mergeRounds([]row{a}))

	m := mergeRounds([]row{a, b})
	require.Empty(t, m.Failed)
	require.InDelta(t, 1200, m.RPS, 1e-9)
	require.Equal(t, []time.Duration{5 * time.Millisecond, 12 * time.Millisecond, 25 * time.Millisecond, 300 * time.Microsecond},
		[]time.Duration{m.P50, m.P99, m.P999, m.CPUPerReq})
	require.Equal(t, 3, m.Errors)
	require.Equal(t, []string{"first", "second"}, m.Notes)
	require.Equal(t, []string{"first"}, a.Notes, "the first round's notes are not changed")

	b.Failed = "server did not start"
	require.Equal(t, "round 2 of 2: server did not start", mergeRounds([]row{a, b}).Failed)
}

// byName indexes checks by their names.
func byName(cs []check) map[string]check {
	got := map[string]check{}
	for _, c := range cs {
		got[c.Name] = c
	}
	return got
}
