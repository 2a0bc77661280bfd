package main

// The curve (issue 30): starts and end to end at every client count a user
// may have, valruns beside the peer and the database's limit (pgbench of
// the peer's single INSERT at the same count), one table per scenario,
// with the targets checked at each count. A count that was not
// measured says so; it is never a PASS.

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

var (
	// curveLevels are the start curve's client counts (full mode).
	curveLevels = []int{1, 4, 8, 16, 32, 64, 128}
	// curveQuickLevels: quick mode's, for both curves.
	curveQuickLevels = []int{1, 8, 32}
	// extraLevels: the counts of the start scenarios outside the curve.
	extraLevels = []int{1, 8, 32, 128}
	// e2eLevels: the end-to-end curve's client counts (full mode).
	e2eLevels = []int{1, 8, 32, 128}
)

const curveHeading = "## The curve: starts"

// e2eCurveHeading is a section of its own, so that `make bench-e2e` can
// replace it alone.
const e2eCurveHeading = "## The curve: end to end"

// curveScenario is a start scenario of the curve.
type curveScenario struct {
	Kind  kind
	Name  string // its rows' scenario, valruns and the peer alike
	Title string
}

var startCurve = []curveScenario{
	{noKey, "start, no key", "Start without a key"},
	{newKey, "start, new key", "Start with a new key"},
	{replay, "replay", "Replay (each client re-sends its one finished key)"},
}

// curve says whether the scenario is on the curve (measured at every count).
func (s scenario) curve() bool {
	return !s.Peer && !s.Worker && s.Tracing == tracingDefault && slices.ContainsFunc(startCurve, func(c curveScenario) bool { return c.Name == s.Name })
}

// startStep is one run of the start table, not yet made.
type startStep struct {
	Section, Scenario string
	run               func() row
}

// startSteps are the runs at one client count, in the order they run: each
// scenario on valruns then on the peer, p.Rounds times for a scenario of
// the curve (valruns, peer, valruns, peer: runSteps merges each side's
// rounds into its row); after the new-key starts, the
// pgbench limit (the peer's INSERT) and valruns' own SQL; the scenarios
// outside the curve only where p.extra(clients). Nothing runs until a
// step's run is called (the plan's estimate counts them with no env).
func startSteps(ctx context.Context, e *env, p plan, clients int, own, peerSQL sqlScript) []startStep {
	extra := p.extra(clients)
	var steps []startStep
	http := func(sc scenario) {
		steps = append(steps, startStep{sc.target(), sc.Name, func() row { return e.runHTTP(ctx, sc, clients, p.HTTP) }})
	}
	pgbench := func(sc sqlScript, norgs int) {
		steps = append(steps, startStep{"pgbench", sc.Scenario, func() row { return e.runPgbench(ctx, sc, norgs, clients, p.PG) }})
	}
	for i, vs := range valrunsScenarios {
		if !vs.curve() && !extra {
			continue
		}
		rounds := 1
		if vs.curve() {
			rounds = max(p.Rounds, 1)
		}
		for range rounds {
			if p.want("valruns") {
				http(vs)
			}
			if i < len(peerScenarios) && p.want("peer") {
				http(peerScenarios[i])
			}
		}
		if vs.Kind != newKey || vs.Worker || !p.want("pgbench") {
			continue
		}
		pgbench(peerSQL, 1)
		norgs := []int{1}
		if extra {
			norgs = append(norgs, p.Orgs)
		}
		for _, n := range norgs {
			sc := own
			sc.Scenario = pgbenchScenario(n)
			pgbench(sc, n)
		}
	}
	return steps
}

// goal is one of issue 30's targets at one client count.
type goal struct {
	Ratio float64 // valruns over the peer, at least (0: no target)
	P50   bool    // and valruns' p50 at most the peer's
}

// startGoal is the target of a start scenario at clients.
func startGoal(k kind, clients int) goal {
	if k == replay {
		return goal{Ratio: 5}
	}
	switch clients {
	case 1:
		return goal{Ratio: 1.0, P50: true}
	case 8:
		return goal{Ratio: 1.3}
	case 32:
		return goal{Ratio: 1.75}
	case 128:
		return goal{Ratio: 2.5}
	}
	return goal{}
}

func (g goal) text() string {
	t := ">= " + times(g.Ratio) + " the peer"
	if g.P50 {
		t += ", p50 <= the peer's"
	}
	return t
}

// times is a target factor as written in the issue: 1.0x, 1.3x, 1.75x.
func times(f float64) string {
	if f == float64(int(f)) {
		return fmt.Sprintf("%.1fx", f)
	}
	return strconv.FormatFloat(f, 'f', -1, 64) + "x"
}

func clientsText(n int) string { return count(n, "client") }

// result is the check's verdict: PASS, MISS, or "not measured".
func (c check) result() string {
	switch {
	case c.Missing:
		return "not measured"
	case c.Pass:
		return "PASS"
	}
	return "MISS"
}

// notMeasured is c when a run it compares is missing.
func notMeasured(c check) check {
	c.Missing, c.Pass, c.Measured = true, false, "not measured"
	return c
}

// startCheck is the target of scenario sc at clients, from the runs found
// (nil: not measured or failed); false when the count has no target.
func startCheck(sc curveScenario, clients int, v, p *row) (check, bool) {
	g := startGoal(sc.Kind, clients)
	if g.Ratio == 0 {
		return check{}, false
	}
	c := check{Name: fmt.Sprintf("%s, %s: valruns vs the peer", sc.Name, clientsText(clients)), Target: g.text()}
	if !measured(v) || !measured(p) || p.RPS == 0 {
		return notMeasured(c), true
	}
	ratio := v.RPS / p.RPS
	c.Measured = fmt.Sprintf("%sx (%.0f / %.0f rps)", ratioText(ratio, g.Ratio), v.RPS, p.RPS)
	c.Pass = ratio >= g.Ratio
	if g.P50 {
		c.Measured += fmt.Sprintf(", p50 %s / %s ms", ms(v.P50), ms(p.P50))
		c.Pass = c.Pass && v.P50 <= p.P50
	}
	c.Measured += errorsNote(*v, *p)
	return c, true
}

func measured(x *row) bool { return x != nil && x.Failed == "" }

// rowAt is the run of section and scenario at clients, failed or not (nil:
// not run).
func (r *results) rowAt(section, scenario string, clients int) *row {
	for i := range r.Rows {
		if x := &r.Rows[i]; x.Section == section && x.Scenario == scenario && x.Clients == clients {
			return x
		}
	}
	return nil
}

// limitAt is the pgbench limit at clients: the peer's INSERT replayed.
func (r *results) limitAt(clients int) *row { return r.rowAt("pgbench", pgbenchPeerScenario, clients) }

// curveCounts are the counts a table lists: the curve's own, and any
// other count measured.
func curveCounts(own []int, measured ...int) []int {
	out := slices.Clone(own)
	for _, n := range measured {
		if n > 0 && !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// curveRan are the counts at which a run of the start curve ran (failed or not).
func (r *results) curveRan() []int {
	var ns []int
	for _, x := range r.Rows {
		if slices.ContainsFunc(startCurve, func(c curveScenario) bool { return c.Name == x.Scenario }) && x.Section != "pgbench" {
			ns = append(ns, x.Clients)
		}
	}
	return ns
}

// startCounts are the counts of the start tables.
func (r *results) startCounts() []int { return curveCounts(curveLevels, r.curveRan()...) }

// curveStartChecks are the start curve's targets, every count that has one.
func (r *results) curveStartChecks() []check {
	var out []check
	for _, sc := range startCurve {
		for _, n := range r.startCounts() {
			if c, ok := startCheck(sc, n, r.rowAt("valruns", sc.Name, n), r.rowAt("peer", sc.Name, n)); ok {
				out = append(out, c)
			}
		}
	}
	return out
}

// rpsCell is a run's rate, or why there is none.
func rpsCell(x *row) string {
	if x == nil {
		return rateCell(false, "", 0)
	}
	return rateCell(true, x.Failed, x.RPS)
}

// rateCell is a rate per second, or "not measured" (the run did not run)
// or "FAILED".
func rateCell(ran bool, failed string, v float64) string {
	switch {
	case !ran:
		return "not measured"
	case failed != "":
		return "FAILED"
	}
	return fmt.Sprintf("%.0f", v)
}

// latCell is a run's p50 / p99, or "-".
func latCell(x *row) string {
	if !measured(x) {
		return "-"
	}
	return ms(x.P50) + " / " + ms(x.P99)
}

// limitCell is a pgbench run's tps, with the connections it had when
// max_connections (or the usage slots) capped them.
func limitCell(x *row) string {
	s := rpsCell(x)
	if measured(x) && x.CappedAt > 0 {
		s += fmt.Sprintf(" (%d conns)", x.CappedAt)
	}
	return s
}

// fraction is a / b as "0.42x", or "-".
func fraction(a, b float64, ok bool) string {
	if !ok || b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx", a/b)
}

// verdictCells are a table row's target and result cells; a count without
// a target shows "-" (or "not measured" when its runs are missing).
func verdictCells(c check, hasTarget, ran bool) string {
	switch {
	case hasTarget:
		return cell(c.Target) + " | " + c.result()
	case ran:
		return "- | -"
	}
	return "- | not measured"
}

// curveMarkdown is the start curve's section: one table per scenario.
func (r *results) curveMarkdown() string {
	if len(r.curveRan()) == 0 {
		return curveHeading + "\n\nNot run.\n"
	}
	var b strings.Builder
	intro := fmt.Sprintf("Issue 30's curve: each scenario at every client count, `valruns serve` beside the peer, run back to back at each count "+
		"(%s warm-up, %s measured, a fresh database each), and the database's limit at the same count: pgbench replaying the peer's start "+
		"(its one `INSERT`, captured from the peer; `tools/bench/results/pgbench-peer.sql`), %s measured. "+
		"\"valruns / limit\" is how far valruns' start is from it; \"own SQL\" is pgbench of valruns' captured start (1 organisation). "+
		"pgbench's connections are capped by `max_connections` (shown when they were). A count that was not measured is never a PASS.\n",
		r.Timing.Warm, r.Timing.Dur, r.PgTiming.Dur)
	writeSectionStart(&b, curveHeading, intro, r.curveStartChecks())
	counts := r.startCounts()
	for _, sc := range startCurve {
		fmt.Fprintf(&b, "\n### %s\n\n", sc.Title)
		b.WriteString("| clients | valruns rps | peer rps | valruns / peer | limit: pgbench of the peer's INSERT, tps | valruns / limit | own SQL, tps | valruns p50 / p99 ms | peer p50 / p99 ms | target | result |\n")
		b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, n := range counts {
			v, p, lim := r.rowAt("valruns", sc.Name, n), r.rowAt("peer", sc.Name, n), r.limitAt(n)
			own := r.rowAt("pgbench", pgbenchScenario(1), n)
			c, has := startCheck(sc, n, v, p)
			fmt.Fprintf(&b, "| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", n, rpsCell(v), rpsCell(p),
				fraction(rpsOf(v), rpsOf(p), measured(v) && measured(p)), limitCell(lim),
				fraction(rpsOf(v), rpsOf(lim), measured(v) && measured(lim)), limitCell(own), latCell(v), latCell(p),
				verdictCells(c, has, v != nil || p != nil))
		}
	}
	return b.String()
}

func rpsOf(x *row) float64 {
	if x == nil {
		return 0
	}
	return x.RPS
}

// writeSectionStart writes a curve section's heading, its introduction and
// the count of its checks by result.
func writeSectionStart(b *strings.Builder, heading, intro string, cs []check) {
	b.WriteString(heading + "\n\n" + intro)
	n := map[string]int{}
	for _, c := range cs {
		n[c.result()]++
	}
	fmt.Fprintf(b, "\nTargets: %d PASS, %d MISS, %d not measured.\n", n["PASS"], n["MISS"], n["not measured"])
}

// e2ePair is a valruns mode and the peer's mode it is compared with.
type e2ePair struct{ Valruns, Peer e2eMode }

var e2ePairs = []e2ePair{{modeInline, peerInline}, {modeSeparate, peerSeparate}}

func (p e2ePair) label() string { return fmt.Sprintf("`%s` vs %s", p.Valruns.Name, p.Peer.Name) }

// e2eAt is the loop of side and mode at clients, failed or not (nil: not run).
func (x *experimentLog) e2eAt(side, mode string, clients int) *e2eResult {
	for i := range x.E2E {
		if r := &x.E2E[i]; r.Side == side && r.Mode == mode && r.Clients == clients {
			return r
		}
	}
	return nil
}

func e2eMeasured(r *e2eResult) bool { return r != nil && r.Failed == "" }

// e2eFinishedCheck: runs finished/s at least 1.5x the peer's at 8 and 32
// clients, and valruns' finished at least 0.95x its started at every count.
func e2eFinishedCheck(p e2ePair, clients int, v, peer *e2eResult) check {
	ratio := clients == 8 || clients == ratioClients
	c := check{Name: fmt.Sprintf("e2e runs finished/s, %s, %s", p.label(), clientsText(clients)), Target: "finished >= 0.95x started"}
	if ratio {
		c.Target = ">= 1.5x the peer, " + c.Target
	}
	if !e2eMeasured(v) || (ratio && (!e2eMeasured(peer) || peer.FinishedPerSec() == 0)) {
		return notMeasured(c)
	}
	c.Pass = v.Ratio() >= 0.95
	if ratio {
		f := v.FinishedPerSec() / peer.FinishedPerSec()
		c.Measured = fmt.Sprintf("%sx (%.0f / %.0f runs/s), ", ratioText(f, 1.5), v.FinishedPerSec(), peer.FinishedPerSec())
		c.Pass = c.Pass && f >= 1.5
	}
	c.Measured += fmt.Sprintf("finished / started %.2f", v.Ratio())
	return c
}

// e2eLatencyCheck: valruns' start-to-final (p50, or p99) at most max times
// the peer's, at 1, 8 and 32 clients; false at other counts.
func e2eLatencyCheck(p e2ePair, clients int, v, peer *e2eResult, what string, of e2eLatency, most float64) (check, bool) {
	if clients != 1 && clients != 8 && clients != ratioClients {
		return check{}, false
	}
	c := check{Name: fmt.Sprintf("e2e start-to-final %s, %s, %s", what, p.label(), clientsText(clients)),
		Target: "<= " + times(most) + " the peer's"}
	a, okV := latencyOf(v, of)
	b, okP := latencyOf(peer, of)
	if !okV || !okP || b == 0 {
		return notMeasured(c), true
	}
	f := float64(a) / float64(b)
	c.Measured = fmt.Sprintf("%sx (%s / %s ms)", ratioText(f, most), ms(a), ms(b))
	c.Pass = f <= most
	return c, true
}

// e2eLatency is a latency of a loop, and whether the loop has it.
type e2eLatency func(*e2eResult) (time.Duration, bool)

// latencyOf is of(r), false when r is missing, failed or without it.
func latencyOf(r *e2eResult, of e2eLatency) (time.Duration, bool) {
	if !e2eMeasured(r) {
		return 0, false
	}
	return of(r)
}

// waitP50 and waitP99, the targets' figure: from the request sent to
// finished_at, what a waiting client feels (none in an older loop).
func waitP50(r *e2eResult) (time.Duration, bool) { return r.WaitP50, r.WaitFinal > 0 }
func waitP99(r *e2eResult) (time.Duration, bool) { return r.WaitP99, r.WaitFinal > 0 }

// finalP50 and finalP99 are from the runs' own timestamps: finished_at -
// created_at.
func finalP50(r *e2eResult) (time.Duration, bool) { return r.FinalP50, r.Final > 0 }
func finalP99(r *e2eResult) (time.Duration, bool) { return r.FinalP99, r.Final > 0 }

// e2eCounts are the counts of the end-to-end tables.
func (x *experimentLog) e2eCounts() []int {
	var ns []int
	for _, r := range x.E2E {
		if r.Side != "baseline" {
			ns = append(ns, r.Clients)
		}
	}
	return curveCounts(e2eLevels, ns...)
}

// curveChecks are the end-to-end curve's targets.
func (x *experimentLog) curveChecks() []check {
	var out []check
	counts := x.e2eCounts()
	for _, p := range e2ePairs {
		for _, n := range counts {
			out = append(out, e2eFinishedCheck(p, n, x.e2eAt("now", p.Valruns.Name, n), x.e2eAt("peer", p.Peer.Name, n)))
		}
	}
	for _, lat := range []struct {
		what string
		of   e2eLatency
		most float64
	}{{"p50", waitP50, 1}, {"p99", waitP99, 2}} {
		for _, p := range e2ePairs {
			for _, n := range counts {
				if c, ok := e2eLatencyCheck(p, n, x.e2eAt("now", p.Valruns.Name, n), x.e2eAt("peer", p.Peer.Name, n), lat.what, lat.of, lat.most); ok {
					out = append(out, c)
				}
			}
		}
	}
	return out
}

func e2eRate(r *e2eResult) string {
	if r == nil {
		return rateCell(false, "", 0)
	}
	return rateCell(true, r.Failed, r.FinishedPerSec())
}

// e2eCell is f of a measured loop, else "-".
func e2eCell(r *e2eResult, f func(*e2eResult) string) string {
	if !e2eMeasured(r) {
		return "-"
	}
	return f(r)
}

// e2eCurveMarkdown is the end-to-end curve's section (empty when no loop
// ran): runs finished/s, start-to-final p50 and p99, one table each, both
// modes at every count. The limit is the start curve's pgbench of the
// peer's INSERT at the same count, when it was measured in this run.
func (r *results) e2eCurveMarkdown() string {
	x := r.Exp
	if x == nil || len(x.E2E) == 0 {
		return ""
	}
	var b strings.Builder
	intro := fmt.Sprintf("Issue 30's curve end to end: the experiment log's loop of new-key starts (%s warm-up, %s measured, a fresh database each, "+
		"see its section for the method) at each client count, valruns in each mode beside the peer in its matching mode, back to back. "+
		"Runs finished/s come from the runs' own timestamps. Start to final, which the targets judge, runs from the moment the harness sent the request to the run's finished_at: "+
		"what a waiting client feels. The runs' own finished_at - created_at is shown beside it but does not start at the same point on both sides: "+
		"the peer stamps created_at in its INSERT, after its middleware, its idempotency library's Redis calls and its pool wait, valruns when it reads the request. "+
		"Runs a 201 named that were still not final when the harness stopped waiting are counted (then the p99 is a floor). "+
		"The limit is the start curve's pgbench of the peer's INSERT at the same count (\"not measured\" when this run did not measure it). "+
		"A count that was not measured is never a PASS.\n", x.Warm, x.Dur)
	writeSectionStart(&b, e2eCurveHeading, intro, x.curveChecks())
	counts := x.e2eCounts()
	type table struct {
		title, head string
		line        func(p e2ePair, n int, v, peer *e2eResult) string
	}
	tables := []table{
		{"Runs finished/s", "| clients | modes | valruns finished/s | peer finished/s | valruns / peer | limit: pgbench of the peer's INSERT, tps | valruns / limit | finished / started, valruns / peer | start-to-final p50 / p99 ms (request sent to finished_at), valruns | peer | target | result |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n",
			func(p e2ePair, n int, v, peer *e2eResult) string {
				lim := r.limitAt(n)
				c := e2eFinishedCheck(p, n, v, peer)
				return fmt.Sprintf("%s | %s | %s | %s | %s | %s | %s | %s | %s",
					e2eRate(v), e2eRate(peer), fraction(fin(v), fin(peer), e2eMeasured(v) && e2eMeasured(peer)), limitCell(lim),
					fraction(fin(v), rpsOf(lim), e2eMeasured(v) && measured(lim)),
					pairCell(v, peer, func(r *e2eResult) string { return f2(r.Ratio()) }),
					e2eCell(v, waitCell), e2eCell(peer, waitCell), verdictCells(c, true, v != nil || peer != nil))
			}},
		{"Start to final, p50", "| clients | modes | valruns p50 ms, request sent to final | peer p50 ms, request sent to final | valruns / peer | timestamps p50 ms (finished_at - created_at), valruns / peer | start-to-running p50 ms, valruns / peer | start answer p50 ms, valruns / peer | target | result |\n|---|---|---|---|---|---|---|---|---|---|\n",
			func(p e2ePair, n int, v, peer *e2eResult) string {
				c, has := e2eLatencyCheck(p, n, v, peer, "p50", waitP50, 1)
				return fmt.Sprintf("%s | %s | %s | %s | %s", latencyCells(v, peer, waitP50), pairCell(v, peer, latencyCell(finalP50)),
					pairCell(v, peer, runningCell), pairCell(v, peer, func(r *e2eResult) string { return ms(r.StartP50) }), verdictCells(c, has, v != nil || peer != nil))
			}},
		{"Start to final, p99", "| clients | modes | valruns p99 ms, request sent to final | peer p99 ms, request sent to final | valruns / peer | timestamps p99 ms (finished_at - created_at), valruns / peer | runs answered but not final when the harness stopped waiting, valruns / peer | target | result |\n|---|---|---|---|---|---|---|---|---|\n",
			func(p e2ePair, n int, v, peer *e2eResult) string {
				c, has := e2eLatencyCheck(p, n, v, peer, "p99", waitP99, 2)
				return fmt.Sprintf("%s | %s | %s | %s", latencyCells(v, peer, waitP99), pairCell(v, peer, latencyCell(finalP99)),
					pairCell(v, peer, waitUnfinishedCell), verdictCells(c, has, v != nil || peer != nil))
			}},
	}
	for _, t := range tables {
		fmt.Fprintf(&b, "\n### %s\n\n%s", t.title, t.head)
		for _, n := range counts {
			for _, p := range e2ePairs {
				v, peer := x.e2eAt("now", p.Valruns.Name, n), x.e2eAt("peer", p.Peer.Name, n)
				fmt.Fprintf(&b, "| %d | %s | %s |\n", n, p.label(), t.line(p, n, v, peer))
			}
		}
	}
	return b.String()
}

func fin(r *e2eResult) float64 {
	if r == nil {
		return 0
	}
	return r.FinishedPerSec()
}

// pairCell is "valruns / peer" of f.
func pairCell(v, peer *e2eResult, f func(*e2eResult) string) string {
	return e2eCell(v, f) + " / " + e2eCell(peer, f)
}

// latencyCells are a latency table's first cells: valruns', the peer's,
// and their ratio.
func latencyCells(v, peer *e2eResult, of e2eLatency) string {
	a, okV := latencyOf(v, of)
	b, okP := latencyOf(peer, of)
	return e2eCell(v, latencyCell(of)) + " | " + e2eCell(peer, latencyCell(of)) + " | " + fraction(float64(a), float64(b), okV && okP)
}

// latencyCell is a cell of of, "-" when the loop does not have it.
func latencyCell(of e2eLatency) func(*e2eResult) string {
	return func(r *e2eResult) string {
		d, ok := of(r)
		if !ok {
			return "-"
		}
		return ms(d)
	}
}

// waitCell is the client-felt start to final, p50 / p99, or "-".
func waitCell(r *e2eResult) string {
	if r.WaitFinal == 0 {
		return "-"
	}
	return ms(r.WaitP50) + " / " + ms(r.WaitP99)
}

// waitUnfinishedCell is how many runs answered in the window were not final
// when the harness stopped waiting, or "-" (not measured).
func waitUnfinishedCell(r *e2eResult) string {
	if r.WaitFinal == 0 && r.WaitUnfinished == 0 {
		return "-"
	}
	return fmt.Sprint(r.WaitUnfinished)
}

func runningCell(r *e2eResult) string {
	if !r.HasRunning {
		return "-"
	}
	return ms(r.RunningP50)
}

// printChecks writes checks to the terminal, one a line.
func printChecks(cs []check) {
	for _, c := range cs {
		fmt.Printf("  %-12s %-70s %s (target %s)\n", c.result(), c.Name, c.Measured, c.Target)
	}
}
