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
	for _, k := range []kind{noKey, newKey} {
		require.Equal(t, goal{Ratio: 1, P50: true}, startGoal(k, 1))
		require.Equal(t, goal{Ratio: 1.3}, startGoal(k, 8))
		require.Equal(t, goal{Ratio: 1.75}, startGoal(k, 32))
		require.Equal(t, goal{Ratio: 2.5}, startGoal(k, 128))
		for _, n := range []int{2, 4, 16, 64, 256} {
			require.Zero(t, startGoal(k, n), n)
		}
	}
	for _, n := range curveLevels {
		require.Equal(t, goal{Ratio: 5}, startGoal(replay, n), n)
	}
	require.Equal(t, ">= 1.0x the peer, p50 <= the peer's", startGoal(noKey, 1).text())
	require.Equal(t, ">= 1.75x the peer", startGoal(newKey, 32).text())
	require.Equal(t, ">= 5.0x the peer", startGoal(replay, 4).text())
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
		at("pgbench", pgbenchPeerScenario, 1, 3000, ms/3), at("pgbench", pgbenchScenario(1), 1, 700, 2*ms),
		// 8 clients: 1.29x is a MISS of 1.3x; the replay 4.99x a MISS of 5x.
		at("valruns", "start, no key", 8, 1290, 5*ms), at("peer", "start, no key", 8, 1000, 5*ms),
		at("valruns", "start, new key", 8, 1300, 5*ms), at("peer", "start, new key", 8, 1000, 5*ms),
		at("valruns", "replay", 8, 4990, ms), at("peer", "replay", 8, 1000, ms),
		at("pgbench", pgbenchPeerScenario, 8, 5000, ms),
		// 32 clients: the peer's no-key run failed, its new-key run is missing.
		at("valruns", "start, no key", 32, 3000, 9*ms), {Section: "peer", Scenario: "start, no key", Clients: 32, RPS: 100, Failed: "the peer exited"},
		at("valruns", "start, new key", 32, 2000, 9*ms),
		at("valruns", "replay", 32, 9000, ms), at("peer", "replay", 32, 1000, ms),
		{Section: "pgbench", Scenario: pgbenchPeerScenario, Clients: 32, RPS: 4000, CappedAt: 20},
	}}
}

// TestCurveStartChecks: each count's target compares the right runs; a
// count whose runs are missing or failed is "not measured", never a PASS.
func TestCurveStartChecks(t *testing.T) {
	t.Parallel()
	got := byName(curveResults().curveStartChecks())
	want := map[string]string{
		"start, no key, 1 client: valruns vs the peer":     "MISS", // 1.10x, but p50 2.0 > 1.5 ms
		"start, no key, 8 clients: valruns vs the peer":    "MISS", // 1.29x < 1.3x
		"start, no key, 32 clients: valruns vs the peer":   "not measured",
		"start, no key, 128 clients: valruns vs the peer":  "not measured",
		"start, new key, 1 client: valruns vs the peer":    "PASS", // 1.00x, p50 equal
		"start, new key, 8 clients: valruns vs the peer":   "PASS", // 1.30x
		"start, new key, 32 clients: valruns vs the peer":  "not measured",
		"start, new key, 128 clients: valruns vs the peer": "not measured",
		"replay, 1 client: valruns vs the peer":            "PASS", // 5.00x
		"replay, 8 clients: valruns vs the peer":           "MISS", // 4.99x
		"replay, 32 clients: valruns vs the peer":          "PASS", // 9x
	}
	for _, n := range []int{4, 16, 64, 128} {
		want["replay, "+clientsText(n)+": valruns vs the peer"] = "not measured"
	}
	require.Len(t, got, len(want))
	for name, res := range want {
		c, ok := got[name]
		require.True(t, ok, name)
		require.Equal(t, res, c.result(), "%s: %s", name, c.Measured)
	}
	require.Equal(t, "1.10x (1100 / 1000 rps), p50 2.0 / 1.5 ms", got["start, no key, 1 client: valruns vs the peer"].Measured)
	require.Equal(t, "1.29x (1290 / 1000 rps)", got["start, no key, 8 clients: valruns vs the peer"].Measured)
	require.Equal(t, "4.99x (4990 / 1000 rps)", got["replay, 8 clients: valruns vs the peer"].Measured)

	// Nothing measured: every target is "not measured", none passes.
	for _, c := range (&results{}).curveStartChecks() {
		require.True(t, c.Missing, c.Name)
		require.False(t, c.Pass, c.Name)
		require.Equal(t, "not measured", c.result(), c.Name)
	}
}

// TestCurveMarkdown: one table per scenario, a row per count of the full
// curve, the limit and valruns' fraction of it, and the counts quick mode
// skipped shown as not measured.
func TestCurveMarkdown(t *testing.T) {
	t.Parallel()
	md := curveResults().markdown()
	for _, want := range []string{
		curveHeading + "\n",
		"Targets: 4 PASS, 3 MISS, 8 not measured.",
		"### Start without a key", "### Start with a new key", "### Replay",
		"| 1 | 1100 | 1000 | 1.10x | 3000 | 0.37x | 700 | 2.0 / 6.0 | 1.5 / 4.5 | >= 1.0x the peer, p50 <= the peer's | MISS |",
		"| 8 | 1300 | 1000 | 1.30x | 5000 | 0.26x | not measured | 5.0 / 15.0 | 5.0 / 15.0 | >= 1.3x the peer | PASS |",
		"| 4 | not measured | not measured | - | not measured | - | not measured | - | - | - | not measured |",
		"| 32 | 3000 | FAILED | - | 4000 (20 conns) | 0.75x | not measured | 9.0 / 27.0 | - | >= 1.75x the peer | not measured |",
		"| 32 | 2000 | not measured | - | 4000 (20 conns) | 0.50x |",
		"| 128 | not measured | not measured | - | not measured | - | not measured | - | - | >= 2.5x the peer | not measured |",
		"| 16 | not measured | not measured | - | not measured | - | not measured | - | - | >= 5.0x the peer | not measured |",
	} {
		require.Contains(t, md, want)
	}
	// The tables come before the older ratios, one per scenario.
	require.Less(t, strings.Index(md, curveHeading), strings.Index(md, "## Ratios"))
	require.Equal(t, 3, strings.Count(md, "| clients | valruns rps | peer rps |"))
	require.NotContains(t, md, e2eCurveHeading) // no loop ran
}

// TestCurveCountsAddWhatWasMeasured: a count outside the curve that was
// measured (-clients 2) gets its row; the curve's own counts are always there.
func TestCurveCountsAddWhatWasMeasured(t *testing.T) {
	t.Parallel()
	require.Equal(t, []int{1, 2, 4, 8, 16, 32, 64, 128}, curveCounts(curveLevels, 2, 8, 0))
	r := &results{Rows: []row{at("valruns", "start, no key", 2, 10, time.Millisecond), at("pgbench", pgbenchPeerScenario, 3, 10, time.Millisecond)}}
	require.Equal(t, []int{1, 2, 4, 8, 16, 32, 64, 128}, r.startCounts())
}

// e2eAt is a measured loop whose client-felt start to final is p50 and p99
// and its timestamps' 1 ms less.
func e2eAt(side string, mode e2eMode, clients, started, finished int, p50, p99 time.Duration) e2eResult {
	return e2eResult{Side: side, Mode: mode.Name, Clients: clients, Window: 10 * time.Second, Started: started, Finished: finished,
		Final: started, FinalP50: p50 - time.Millisecond, FinalP99: p99 - time.Millisecond, RunningP50: p50 / 2, HasRunning: true,
		WaitFinal: started, WaitP50: p50, WaitP99: p99}
}

func e2eCurveLog() *experimentLog {
	ms := time.Millisecond
	return &experimentLog{Clients: 32, Levels: curveQuickLevels, Warm: time.Second, Dur: 5 * time.Second, E2E: []e2eResult{
		// 1 client: no ratio target; finished 0.94x started is a MISS; p50 equal, p99 2x: PASS.
		e2eAt("now", modeInline, 1, 1000, 940, 5*ms, 20*ms), e2eAt("peer", peerInline, 1, 2000, 2000, 5*ms, 10*ms),
		e2eAt("now", modeSeparate, 1, 1000, 1000, 4*ms, 21*ms), e2eAt("peer", peerSeparate, 1, 1000, 1000, 5*ms, 10*ms),
		// 8 clients: 1.5x the peer; 1.49x.
		e2eAt("now", modeInline, 8, 3000, 3000, 6*ms, 12*ms), e2eAt("peer", peerInline, 8, 2000, 2000, 5*ms, 10*ms),
		e2eAt("now", modeSeparate, 8, 2980, 2980, 5*ms, 10*ms), e2eAt("peer", peerSeparate, 8, 2000, 2000, 5*ms, 10*ms),
		// 32 clients: the baseline (not on the curve) and a failed peer.
		e2eAt("baseline", modeInline, 32, 100, 10, time.Second, 2*time.Second),
		e2eAt("now", modeInline, 32, 4000, 4000, 6*ms, 12*ms), {Side: "peer", Mode: peerInline.Name, Clients: 32, Failed: "boom"},
	}}
}

// TestE2ECurveChecks: finished/s >= 1.5x the peer at 8 and 32 and finished
// >= 0.95x started at every count; start-to-final p50 <= the peer's and p99
// <= 2x at 1, 8 and 32; a loop missing or failed is "not measured".
func TestE2ECurveChecks(t *testing.T) {
	t.Parallel()
	got := byName(e2eCurveLog().curveChecks())
	in, sep := e2ePairs[0].label(), e2ePairs[1].label()
	want := map[string]string{
		"e2e runs finished/s, " + in + ", 1 client":      "MISS", // finished 0.94x started
		"e2e runs finished/s, " + sep + ", 1 client":     "PASS",
		"e2e runs finished/s, " + in + ", 8 clients":     "PASS", // 1.50x
		"e2e runs finished/s, " + sep + ", 8 clients":    "MISS", // 1.49x
		"e2e runs finished/s, " + in + ", 32 clients":    "not measured",
		"e2e runs finished/s, " + sep + ", 32 clients":   "not measured",
		"e2e runs finished/s, " + in + ", 128 clients":   "not measured",
		"e2e runs finished/s, " + sep + ", 128 clients":  "not measured",
		"e2e start-to-final p50, " + in + ", 1 client":   "PASS", // equal
		"e2e start-to-final p50, " + sep + ", 1 client":  "PASS",
		"e2e start-to-final p50, " + in + ", 8 clients":  "MISS", // 6 > 5 ms
		"e2e start-to-final p50, " + sep + ", 8 clients": "PASS",
		"e2e start-to-final p99, " + in + ", 1 client":   "PASS", // 2.00x
		"e2e start-to-final p99, " + sep + ", 1 client":  "MISS", // 2.10x
		"e2e start-to-final p99, " + in + ", 8 clients":  "PASS",
		"e2e start-to-final p99, " + sep + ", 8 clients": "PASS",
	}
	for _, what := range []string{"p50", "p99"} {
		for _, p := range []string{in, sep} {
			want["e2e start-to-final "+what+", "+p+", 32 clients"] = "not measured"
		}
	}
	require.Len(t, got, len(want))
	for name, res := range want {
		c, ok := got[name]
		require.True(t, ok, name)
		require.Equal(t, res, c.result(), "%s: %s", name, c.Measured)
	}
	require.Equal(t, "1.50x (300 / 200 runs/s), finished / started 1.00", got["e2e runs finished/s, "+in+", 8 clients"].Measured)
	require.Equal(t, "2.10x (21.0 / 10.0 ms)", got["e2e start-to-final p99, "+sep+", 1 client"].Measured)
	for _, c := range (&experimentLog{}).curveChecks() {
		require.Equal(t, "not measured", c.result(), c.Name)
	}
}

// TestE2ECurveMarkdown: three tables, both modes at every count, the limit
// from the start curve of the same run; the baseline is not on the curve.
func TestE2ECurveMarkdown(t *testing.T) {
	t.Parallel()
	r := &results{Exp: e2eCurveLog(), Rows: []row{at("pgbench", pgbenchPeerScenario, 8, 6000, time.Millisecond)}}
	md := r.e2eCurveMarkdown()
	in := e2ePairs[0].label()
	for _, want := range []string{
		e2eCurveHeading + "\n", "### Runs finished/s", "### Start to final, p50", "### Start to final, p99",
		"| 8 | " + in + " | 300 | 200 | 1.50x | 6000 | 0.05x | 1.00 / 1.00 | 6.0 / 12.0 | 5.0 / 10.0 | >= 1.5x the peer, finished >= 0.95x started | PASS |",
		"| 1 | " + in + " | 94 | 200 | 0.47x | not measured | - | 0.94 / 1.00 |",
		"| 32 | " + in + " | 400 | FAILED | - | not measured | - |",
		"| 128 | " + in + " | not measured | not measured |",
		"| 8 | " + in + " | 6.0 | 5.0 | 1.20x | 5.0 / 4.0 | 3.0 / 2.5 | 0.0 / 0.0 | <= 1.0x the peer's | MISS |",
		"| 128 | " + in + " | - | - | - | - / - | - / - | - / - | - | not measured |",
		"| 1 | " + in + " | 20.0 | 10.0 | 2.00x | 19.0 / 9.0 | 0 / 0 | <= 2.0x the peer's | PASS |",
		"| 32 | " + in + " | 12.0 | - | - | 11.0 / - | 0 / - | <= 2.0x the peer's | not measured |",
	} {
		require.Contains(t, md, want)
	}
	require.NotContains(t, md, "1000.0") // the baseline's loop (p50 1 s)
	require.Empty(t, (&results{Exp: &experimentLog{}}).e2eCurveMarkdown())
	require.Contains(t, r.markdown(), e2eCurveHeading)
}

// TestE2ELatencyJudgesTheClientFigure: the start-to-final targets judge
// the time from the request sent to finished_at, not the runs' own
// finished_at - created_at (the two sides stamp created_at at different
// points); a loop without the client figure (an older results.json) is
// not measured, never a 0 ms PASS.
func TestE2ELatencyJudgesTheClientFigure(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	pair := e2ePairs[0]
	check := func(v, peer e2eResult) check {
		x := &experimentLog{E2E: []e2eResult{v, peer}}
		return byName(x.curveChecks())["e2e start-to-final p50, "+pair.label()+", 8 clients"]
	}
	peer := e2eAt("peer", pair.Peer, 8, 1000, 1000, 10*ms, 20*ms)
	peer.FinalP50 = 6 * ms // its created_at is late: after its middleware and pool wait

	// The timestamps pass (5 <= 6 ms), the client's wait misses (11 > 10 ms).
	v := e2eAt("now", pair.Valruns, 8, 1000, 1000, 11*ms, 20*ms)
	v.FinalP50 = 5 * ms
	c := check(v, peer)
	require.Equal(t, "MISS", c.result(), c.Measured)
	require.Equal(t, "1.10x (11.0 / 10.0 ms)", c.Measured)
	md := (&results{Exp: &experimentLog{E2E: []e2eResult{v, peer}}}).e2eCurveMarkdown()
	require.Contains(t, md, "| 8 | "+pair.label()+" | 11.0 | 10.0 | 1.10x | 5.0 / 6.0 | 5.5 / 5.0 | 0.0 / 0.0 | <= 1.0x the peer's | MISS |")

	// The timestamps miss (7 > 6 ms), the client's wait passes (9 <= 10 ms).
	v = e2eAt("now", pair.Valruns, 8, 1000, 1000, 9*ms, 20*ms)
	v.FinalP50 = 7 * ms
	require.Equal(t, "PASS", check(v, peer).result())

	// No client figure on either side: not measured, and "-" in the tables.
	old := v
	old.WaitFinal, old.WaitP50, old.WaitP99 = 0, 0, 0
	require.Equal(t, "not measured", check(old, peer).result())
	require.Equal(t, "not measured", check(v, func() e2eResult { p := peer; p.WaitFinal = 0; return p }()).result())
	md = (&results{Exp: &experimentLog{E2E: []e2eResult{old, peer}}}).e2eCurveMarkdown()
	require.Contains(t, md, "| 8 | "+pair.label()+" | - | 10.0 | - | 7.0 / 6.0 | 4.5 / 5.0 | 0.0 / 0.0 | <= 1.0x the peer's | not measured |")
	require.Contains(t, md, "| 8 | "+pair.label()+" | - | 20.0 | - | 19.0 / 19.0 | - / 0 | <= 2.0x the peer's | not measured |")
	require.Contains(t, md, "| - | 10.0 / 20.0 |") // runs finished/s: the client figure, or "-"
}

// TestSpliceSectionBefore: `make bench-e2e` puts a new end-to-end curve
// before the experiment log, and replaces one that is there.
func TestSpliceSectionBefore(t *testing.T) {
	t.Parallel()
	doc := "# R\n\n## A\n\na\n\n" + expHeading + "\n\nold log\n"
	got := spliceSectionBefore(doc, e2eCurveHeading, e2eCurveHeading+"\n\nnew\n", expHeading)
	require.Equal(t, "# R\n\n## A\n\na\n\n"+e2eCurveHeading+"\n\nnew\n\n"+expHeading+"\n\nold log\n", got)
	again := spliceSectionBefore(got, e2eCurveHeading, e2eCurveHeading+"\n\nnewer\n", expHeading)
	require.Equal(t, strings.Replace(got, "\nnew\n", "\nnewer\n", 1), again)
	require.Equal(t, "# R\n\n"+e2eCurveHeading+"\n\nx\n", spliceSectionBefore("# R\n", e2eCurveHeading, e2eCurveHeading+"\n\nx\n", expHeading))
}

// TestPlanCurve: the full plan measures the whole curve, quick mode 1, 8
// and 32; at each count valruns and the peer run back to back, scenario by
// scenario (in full mode twice each, in turn), with the limit after the
// new-key starts; the other scenarios only at their counts, once.
func TestPlanCurve(t *testing.T) {
	t.Parallel()
	full, quick := makePlan(false), makePlan(true)
	require.Equal(t, []int{1, 4, 8, 16, 32, 64, 128}, full.Levels)
	require.Equal(t, []int{1, 8, 32}, quick.Levels)
	require.Equal(t, []int{1, 8, 32, 128}, full.E2ELevels)
	require.Equal(t, []int{1, 8, 32}, quick.E2ELevels)
	require.Equal(t, 15*time.Second, full.E2E.Dur)
	require.Equal(t, time.Minute, full.Noisy.Dur) // its own windows, not the loops'
	require.Equal(t, 32, full.e2eMain())
	require.Equal(t, 8, mainLevel([]int{1, 8}))

	names := func(p plan, clients int) []string {
		var out []string
		for _, s := range startSteps(t.Context(), nil, p, clients, sqlScript{}, sqlScript{Scenario: pgbenchPeerScenario}) {
			out = append(out, s.Section+": "+s.Scenario)
		}
		return out
	}
	require.Equal(t, 2, full.Rounds)
	require.Equal(t, 1, quick.Rounds)
	curve := []string{
		"valruns: start, no key", "peer: start, no key",
		"valruns: start, new key", "peer: start, new key",
		"pgbench: " + pgbenchPeerScenario, "pgbench: " + pgbenchScenario(1),
		"valruns: replay", "peer: replay",
	}
	rounds := []string{
		"valruns: start, no key", "peer: start, no key", "valruns: start, no key", "peer: start, no key",
		"valruns: start, new key", "peer: start, new key", "valruns: start, new key", "peer: start, new key",
		"pgbench: " + pgbenchPeerScenario, "pgbench: " + pgbenchScenario(1),
		"valruns: replay", "peer: replay", "valruns: replay", "peer: replay",
	}
	require.Equal(t, rounds, names(full, 4))
	require.Equal(t, rounds, names(full, 64))
	require.Equal(t, curve, names(quick, 8))
	all := names(full, 8)
	require.Equal(t, append(rounds[:10:10], "pgbench: "+pgbenchScenario(100), "valruns: replay", "peer: replay",
		"valruns: replay", "peer: replay",
		"valruns: hot key", "peer: hot key", "valruns: new key, 100 orgs", "valruns: new key, org with quota",
		"valruns: new key, serve + worker"), all)
	require.Len(t, names(quick, 32), len(all)-6)

	only := full
	only.Only = map[string]bool{"valruns": true, "pgbench": true}
	require.Equal(t, []string{"valruns: start, no key", "valruns: start, no key", "valruns: start, new key", "valruns: start, new key",
		"pgbench: " + pgbenchPeerScenario, "pgbench: " + pgbenchScenario(1), "valruns: replay", "valruns: replay"}, names(only, 16))

	// 3 curve scenarios x 2 sides x 2 rounds x 7 counts + 5 more at 4
	// counts; 2 pgbench a count, 1 more at 4.
	http, pgbench := full.startRuns()
	require.Equal(t, 84+20, http)
	require.Equal(t, 14+4, pgbench)
	require.Equal(t, 18, full.e2eLoops(true))
	// The full plan stays within the hour the issue allows.
	require.Less(t, full.estimate(true), time.Hour)
	require.Less(t, quick.estimate(true), full.estimate(true))
	require.Contains(t, full.describe(true), "starts at clients 1, 4, 8, 16, 32, 64 and 128: 104 HTTP runs of 2s + 6s, 18 pgbench runs")
	require.Contains(t, full.describe(true), "end to end at clients 1, 8, 32 and 128: 18 loops of 2s + 15s")
}

// TestCurveNotRun: a run without the start curve (-only tracing) says so
// in one line, not with a table of counts.
func TestCurveNotRun(t *testing.T) {
	t.Parallel()
	r := &results{Rows: []row{at("valruns", tracingOffName, 32, 1000, time.Millisecond)}}
	require.Equal(t, curveHeading+"\n\nNot run.\n", r.curveMarkdown())
	require.Empty(t, r.curveRan())
}

// TestMergeRounds: a scenario's rounds make one row of their means (RSS
// and connections: the largest; errors: the sum) that lists each round's
// rps; one failed round fails the row.
func TestMergeRounds(t *testing.T) {
	t.Parallel()
	a := row{Section: "valruns", Scenario: "start, new key", Clients: 8, RPS: 1000, P50: 4 * time.Millisecond, P99: 10 * time.Millisecond,
		P999: 20 * time.Millisecond, Errors: 1, CPUPerReq: 400 * time.Microsecond, PeakRSSKB: 90_000, DBConns: 8, DBBusy: 4, Notes: []string{"load generator 0.1 ms CPU/req"}}
	b := a
	b.RPS, b.P50, b.P99, b.P999, b.Errors, b.CPUPerReq, b.PeakRSSKB, b.DBConns, b.DBBusy = 1400, 6*time.Millisecond, 14*time.Millisecond, 30*time.Millisecond, 2, 200*time.Microsecond, 95_000, 6, 5
	b.Notes = []string{"load generator 0.3 ms CPU/req"}
	require.Equal(t, a, mergeRounds([]row{a}))

	m := mergeRounds([]row{a, b})
	require.Empty(t, m.Failed)
	require.Equal(t, "start, new key", m.Scenario)
	require.InDelta(t, 1200, m.RPS, 1e-9)
	require.Equal(t, 5*time.Millisecond, m.P50)
	require.Equal(t, 12*time.Millisecond, m.P99)
	require.Equal(t, 25*time.Millisecond, m.P999)
	require.Equal(t, 300*time.Microsecond, m.CPUPerReq)
	require.Equal(t, 3, m.Errors)
	require.Equal(t, int64(95_000), m.PeakRSSKB)
	require.Equal(t, 8, m.DBConns)
	require.Equal(t, 5, m.DBBusy)
	require.Equal(t, []string{"mean of 2 rounds: 1000, 1400 rps (the notes after this: round 1)", "load generator 0.1 ms CPU/req"}, m.Notes)
	require.Equal(t, a.Notes, []string{"load generator 0.1 ms CPU/req"}, "the first round's notes are not changed")

	b.Failed = "server did not start"
	m = mergeRounds([]row{a, b})
	require.Equal(t, "round 2 of 2: server did not start", m.Failed)
}
