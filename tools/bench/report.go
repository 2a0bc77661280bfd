package main

// RESULTS.md: the machine, the ratios with their targets, the full table,
// the cleanup and latency measurements, and the captured SQL.

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"
)

// ratioClients is the concurrency the ratios compare at.
const ratioClients = 32

type results struct {
	Mode     string
	Date     time.Time
	Elapsed  time.Duration
	Machine  machine
	Redis    string
	Levels   []int
	Timing   timing
	PgTiming timing
	Rows     []row
	Capture  captured
	// PeerCapture is the peer's new-key start, captured the same way.
	PeerCapture captured
	Cleanup     *cleanupResult
	Latency     *latencyResult
	Exp         *experimentLog
	Noisy       *noisyLog
}

// check is one ratio or limit with its target.
type check struct {
	Name     string
	Measured string
	Target   string
	Pass     bool
	Missing  bool // a run it compares was not measured (never a PASS)
}

func (r *results) find(section, scenario string, clients int) (row, bool) {
	for _, x := range r.Rows {
		if x.Section == section && x.Scenario == scenario && x.Clients == clients && x.Failed == "" {
			return x, true
		}
	}
	return row{}, false
}

// errorsNote flags a run whose answers were not all as expected.
func errorsNote(rs ...row) string {
	for _, x := range rs {
		if x.Errors+x.Non2xx+x.Unexpect > 0 {
			return " (runs had errors)"
		}
	}
	return ""
}

func (r *results) checks() []check {
	var out []check
	ratio := func(name string, a, b [2]string, target float64, unit string) {
		x, ok1 := r.find(a[0], a[1], ratioClients)
		y, ok2 := r.find(b[0], b[1], ratioClients)
		c := check{Name: name, Target: fmt.Sprintf(">= %.1fx", target)}
		if !ok1 || !ok2 || y.RPS == 0 {
			c.Measured = "no data"
		} else {
			v := x.RPS / y.RPS
			c.Measured = fmt.Sprintf("%sx (%.0f / %.0f %s)%s", ratioText(v, target), x.RPS, y.RPS, unit, errorsNote(x, y))
			c.Pass = v >= target
		}
		out = append(out, c)
	}
	vr, peer, pgb := "valruns", "peer", "pgbench"
	ratio("new-key start vs the peer's new-key start", [2]string{vr, "start, new key"}, [2]string{peer, "start, new key"}, 1.0, "rps")
	ratio("no-key start vs the peer's no-key start", [2]string{vr, "start, no key"}, [2]string{peer, "start, no key"}, 1.2, "rps")
	ratio("new-key start vs no-key start", [2]string{vr, "start, new key"}, [2]string{vr, "start, no key"}, 0.8, "rps")
	ratio("new-key start vs pgbench of its own SQL (1 org)", [2]string{vr, "start, new key"}, [2]string{pgb, "new-key start SQL, 1 org"}, 0.5, "rps / tps")
	ratio("its SQL: pgbench 1 org vs 100 orgs", [2]string{pgb, "new-key start SQL, 1 org"}, [2]string{pgb, "new-key start SQL, 100 orgs"}, 0.7, "tps")
	ratio("replay vs the peer's replay", [2]string{vr, "replay"}, [2]string{peer, "replay"}, 5, "rps")
	ratio("replay vs new-key start", [2]string{vr, "replay"}, [2]string{vr, "start, new key"}, 3, "rps")
	// The cost of tracing every start (issue 31): what an operator pays
	// at 100% sampling; off is the default and costs nothing.
	ratio("tracing on (100% sampled) vs off, new key + worker", [2]string{vr, tracingOnName}, [2]string{vr, tracingOffName}, 0.8, "rps")

	c := check{Name: "cleanup of expired keys, alone", Target: ">= 50000 keys/s"}
	if r.Cleanup == nil || r.Cleanup.Failed != "" {
		c.Measured = "no data"
	} else {
		k := r.Cleanup.KeysPerSec()
		c.Measured = fmt.Sprintf("%.0f keys/s (%d keys in %.1f s)", k, r.Cleanup.AloneDeleted, r.Cleanup.Alone.Seconds())
		c.Pass = k >= 50000
	}
	out = append(out, c)

	c = check{Name: fmt.Sprintf("new-key start p99 during the cleanup vs without (%d clients)", ratioClients), Target: "<= 2.0x"}
	if r.Cleanup == nil || r.Cleanup.Failed != "" || r.Cleanup.Baseline.P99 == 0 {
		c.Measured = "no data"
	} else {
		v := float64(r.Cleanup.During.P99) / float64(r.Cleanup.Baseline.P99)
		c.Measured = fmt.Sprintf("%.2fx (%s / %s ms)%s", v, ms(r.Cleanup.During.P99), ms(r.Cleanup.Baseline.P99), errorsNote(r.Cleanup.During, r.Cleanup.Baseline))
		c.Pass = v <= 2.0
	}
	out = append(out, c)

	c = check{Name: "server peak RSS, heaviest scenario", Target: "<= 150 MB"}
	var heavy row
	for _, x := range r.Rows {
		if x.Section == vr && x.Failed == "" && x.PeakRSSKB > heavy.PeakRSSKB {
			heavy = x
		}
	}
	if heavy.PeakRSSKB == 0 {
		c.Measured = "no data"
	} else {
		mb := float64(heavy.PeakRSSKB) / 1024
		c.Measured = fmt.Sprintf("%.0f MB (%s, %d clients)", mb, heavy.Scenario, heavy.Clients)
		c.Pass = mb <= 150
	}
	out = append(out, c)

	c = check{Name: "start-to-running p50, 1 client, serve --worker", Target: "<= 50 ms"}
	if r.Latency == nil || r.Latency.Failed != "" || len(r.Latency.Observed) == 0 {
		c.Measured = "no data"
	} else {
		p := percentile(r.Latency.Observed, 0.5)
		c.Measured = fmt.Sprintf("%s ms (observed by polling)", ms(p))
		c.Pass = p <= 50*time.Millisecond
	}
	out = append(out, c)
	return out
}

// ratioText writes v with two decimals, or three when two would round it
// onto its target (0.696 is not 0.70).
func ratioText(v, target float64) string {
	if s := fmt.Sprintf("%.2f", v); s != fmt.Sprintf("%.2f", target) || v == target {
		return s
	}
	return fmt.Sprintf("%.3f", v)
}

// totalErrors counts the answers that were not as expected, over every run.
func (r *results) totalErrors() int {
	n := 0
	rows := slices.Clone(r.Rows)
	if r.Cleanup != nil {
		rows = append(rows, r.Cleanup.Baseline, r.Cleanup.During)
	}
	for _, x := range rows {
		n += x.Errors + x.Non2xx + x.Unexpect
	}
	return n
}

var sectionOrder = map[string]int{"valruns": 0, "peer": 1, "pgbench": 2}

func scenarioOrder(section, name string) int {
	list := append(slices.Clip(valrunsScenarios), tracingScenarios...)
	if section == "peer" {
		list = peerScenarios
	}
	for i, s := range list {
		if s.Name == name {
			return i
		}
	}
	return 100
}

// sortedRows is the table's order: valruns, the peer, pgbench; scenarios
// in their order; clients ascending.
func (r *results) sortedRows() []row {
	rows := slices.Clone(r.Rows)
	slices.SortStableFunc(rows, func(a, b row) int {
		if d := sectionOrder[a.Section] - sectionOrder[b.Section]; d != 0 {
			return d
		}
		if d := scenarioOrder(a.Section, a.Scenario) - scenarioOrder(b.Section, b.Scenario); d != 0 {
			return d
		}
		if a.Scenario != b.Scenario {
			return strings.Compare(a.Scenario, b.Scenario)
		}
		return a.Clients - b.Clients
	})
	return rows
}

func mb(kb int64) string {
	if kb == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f", float64(kb)/1024)
}

func msOrDash(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	return ms(d)
}

func cell(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

func tableRow(b *strings.Builder, x row) {
	if x.Failed != "" {
		fmt.Fprintf(b, "| %s | %s | %d | FAILED | | | | | | | | | %s |\n", x.Section, x.Scenario, x.Clients, cell(short(x.Failed, 300)))
		return
	}
	conns := "-"
	if x.DBConns > 0 {
		conns = fmt.Sprintf("%d (%d)", x.DBConns, x.DBBusy)
	}
	cpu := "-"
	if x.CPUPerReq > 0 {
		cpu = ms3(x.CPUPerReq)
	}
	fmt.Fprintf(b, "| %s | %s | %d | %.0f | %s | %s | %s | %d | %d | %d | %s | %s | %s | %s |\n",
		x.Section, x.Scenario, x.Clients, x.RPS, msOrDash(x.P50), msOrDash(x.P99), msOrDash(x.P999),
		x.Errors, x.Non2xx, x.Unexpect, cpu, mb(x.PeakRSSKB), conns, cell(strings.Join(x.Notes, "; ")))
}

var arrayRe = regexp.MustCompile(`ARRAY\[[^\]]*\]`)

// abbreviate shortens the per-organisation arrays for display.
func abbreviate(script string) string {
	return arrayRe.ReplaceAllStringFunc(script, func(s string) string {
		n := strings.Count(s, ",") + 1
		first := s[len("ARRAY[") : len("ARRAY[")+min(len(s)-len("ARRAY["), 44)]
		return fmt.Sprintf("ARRAY[%s... (%d values)]", first, n)
	})
}

func (r *results) markdown() string {
	var b strings.Builder
	m := r.Machine
	fmt.Fprintf(&b, "# valruns benchmark results\n\n")
	fmt.Fprintf(&b, "Written by `make bench%s` (scripts/bench.sh, harness in tools/bench/) on %s in %s, valruns %s.\n",
		map[bool]string{true: " QUICK=1", false: ""}[r.Mode == "quick"], r.Date.UTC().Format("2006-01-02 15:04 MST"), r.Elapsed.Round(time.Second), m.Commit)
	fmt.Fprintf(&b, "Mode %s: clients %v; HTTP runs warm up %s then measure %s; pgbench warms up %s then measures %s.\n",
		r.Mode, r.Levels, r.Timing.Warm, r.Timing.Dur, r.PgTiming.Warm, r.PgTiming.Dur)
	if r.Mode == "quick" {
		b.WriteString("**Quick mode: short runs, for checking the harness; do not quote these numbers.**\n")
	}
	b.WriteString("\n## Machine\n\n| | |\n|---|---|\n")
	fmt.Fprintf(&b, "| CPU | %s, %d cores |\n| RAM | %s |\n| kernel | %s |\n", m.CPU, m.Cores, m.RAM, m.Kernel)
	fmt.Fprintf(&b, "| load average (1 min) | %s before the run, %s after (anything well above 0 before means other work shared the CPU) |\n", m.LoadStart, m.LoadEnd)
	fmt.Fprintf(&b, "| PostgreSQL | %s, fsync=%s, synchronous_commit=%s, max_connections=%s, shared_buffers=%s |\n", m.Postgres, m.Fsync, m.SyncCommit, m.MaxConns, m.SharedBuffers)
	fmt.Fprintf(&b, "| Go | %s |\n| Node | %s |\n| pgbench | %s |\n| Redis | %s (%s) |\n", m.Go, m.Node, m.Pgbench, m.Redis, r.Redis)
	b.WriteString("\nThe load generator, the servers, PostgreSQL and Redis share these cores: a client's CPU is the server's loss.\n")

	b.WriteString("\n" + r.curveMarkdown())
	if e := r.e2eCurveMarkdown(); e != "" {
		b.WriteString("\n" + e)
	}

	fmt.Fprintf(&b, "\n## Ratios (%d clients unless stated)\n\n| check | measured | target | result |\n|---|---|---|---|\n", ratioClients)
	for _, c := range r.checks() {
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", c.Name, c.Measured, c.Target, c.result())
	}
	if n := r.totalErrors(); n > 0 {
		fmt.Fprintf(&b, "\n**%d answers were errors, non-2xx or unexpected: see the table.** They must be 0.\n", n)
	} else {
		b.WriteString("\nEvery answer of every measured run was the expected 2xx (errors, non-2xx and unexpected are all 0).\n")
	}

	b.WriteString(r.whyBehind())

	b.WriteString("\n## All runs\n\n")
	b.WriteString("Closed loop: each client sends its next request when the previous answer has arrived, on a keep-alive connection. " +
		"rps counts expected answers inside the measured window. CPU ms/req is the server process's user+system time in the window " +
		"(/proc/PID/stat) over its requests; peak RSS is VmHWM. DB conns: the most connections the database saw, and of them busy at once. " +
		"errors: transport errors; unexpected: a 2xx that was not what the scenario expects (a replay that executed, a new key answered as a replay). " +
		"pgbench rows: tps, and the latency of its transactions. " +
		"A start scenario of the curve, and each tracing row, ran in rounds, valruns and the peer (tracing off and on) in turn, each round on a fresh database and fresh processes: " +
		"its row is the rounds' means (rps, latencies, CPU; peak RSS and connections: the largest; errors: the sum), its notes give each round's rps (one round: no such note).\n\n")
	b.WriteString("| target | scenario | clients | rps | p50 ms | p99 ms | p99.9 ms | errors | non-2xx | unexpected | CPU ms/req | peak RSS MB | DB conns (busy) | notes |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, x := range r.sortedRows() {
		tableRow(&b, x)
	}

	b.WriteString("\n## Cleanup\n\n")
	if c := r.Cleanup; c == nil {
		b.WriteString("Not run.\n")
	} else if c.Failed != "" {
		fmt.Fprintf(&b, "FAILED: %s\n", c.Failed)
	} else {
		fmt.Fprintf(&b, "%d expired keys, inserted with one statement (copies of a key row the server wrote) in %.1f s, then deleted by `valruns cleanup`:\n\n", c.Keys, c.InsertTime.Seconds())
		fmt.Fprintf(&b, "- alone: %d keys in %.2f s = **%.0f keys/s**;\n", c.AloneDeleted, c.Alone.Seconds(), c.KeysPerSec())
		dk := 0.0
		if c.DuringTime > 0 {
			dk = float64(c.DuringKeys) / c.DuringTime.Seconds()
		}
		fmt.Fprintf(&b, "- while new-key starts arrive (%d clients): %d keys in %.2f s = %.0f keys/s.\n\n", ratioClients, c.DuringKeys, c.DuringTime.Seconds(), dk)
		b.WriteString("| scenario | clients | rps | p50 ms | p99 ms | p99.9 ms | errors | non-2xx | unexpected | CPU ms/req | peak RSS MB |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, x := range []row{c.Baseline, c.During} {
			fmt.Fprintf(&b, "| %s | %d | %.0f | %s | %s | %s | %d | %d | %d | %.3f | %s |\n", x.Scenario, x.Clients, x.RPS,
				ms(x.P50), ms(x.P99), ms(x.P999), x.Errors, x.Non2xx, x.Unexpect, float64(x.CPUPerReq.Microseconds())/1000, mb(x.PeakRSSKB))
		}
	}

	b.WriteString("\n## Start to running (1 client, `valruns serve --worker`)\n\n")
	if l := r.Latency; l == nil {
		b.WriteString("Not run.\n")
	} else if l.Failed != "" {
		fmt.Fprintf(&b, "FAILED: %s\n", l.Failed)
	} else {
		fmt.Fprintf(&b, "%d runs, one at a time: each started with a new key, then polled every %s until it was no longer `queued`.\n\n", l.Samples, l.PollEvery)
		b.WriteString("| measured from the 201 to | p50 ms | p99 ms | max ms |\n|---|---|---|---|\n")
		fmt.Fprintf(&b, "| the first poll that saw it taken | %s | %s | %s |\n", ms(percentile(l.Observed, .5)), ms(percentile(l.Observed, .99)), ms(percentile(l.Observed, 1)))
		fmt.Fprintf(&b, "| its `started_at` (the worker's claim) | %s | %s | %s |\n", ms(percentile(l.Started, .5)), ms(percentile(l.Started, .99)), ms(percentile(l.Started, 1)))
	}

	b.WriteString("\n## The SQL of a new-key start, captured from the running server\n\n")
	cp := r.Capture
	if cp.Err != nil {
		fmt.Fprintf(&b, "FAILED: %v\n", cp.Err)
	}
	if len(cp.A.Stmts) > 0 {
		prepared := ""
		if cp.A.PrepareRoundTrips > 0 {
			prepared = fmt.Sprintf(" (plus %d that prepared statements on a connection that had not yet used them)", cp.A.PrepareRoundTrips)
		}
		fmt.Fprintf(&b, "`valruns serve` reached PostgreSQL through a wire-protocol proxy in the harness, which recorded what one new-key start sent: "+
			"**%d statements in %d round trips**%s. Statements sent together, without waiting for an answer, share a round trip.\n\n",
			len(cp.A.Stmts), cp.A.RoundTrips-cp.A.PrepareRoundTrips, prepared)
		writeStatements(&b, cp.A)
	}
	if sc := cp.Script; sc != nil {
		fmt.Fprintf(&b, "\nThe pgbench script made from it (written to %s; per-organisation arrays shortened here). "+
			"Values were classified by comparing captures: two starts of one organisation and one of each of %d organisations.\n\n", "`tools/bench/results/pgbench-start.sql`", sc.MaxOrgs)
		b.WriteString("Values not listed are the same in every capture and written as captured.\n\n")
		b.WriteString("| variable | what | captured value |\n|---|---|---|\n")
		for _, v := range sc.Vars {
			name := v.Name
			switch {
			case name != "":
			case strings.HasPrefix(v.Kind, "per-organisation"):
				name = "`[:org]`"
			default:
				name = "(as captured)"
			}
			fmt.Fprintf(&b, "| %s | %s | `%s` |\n", name, v.Kind, cell(v.Example))
		}
		for _, n := range sc.Notes {
			fmt.Fprintf(&b, "\nNote: %s\n", n)
		}
		b.WriteString("\n```\n" + abbreviate(sc.Text) + "```\n")
	}

	if pc := r.PeerCapture; pc.Err != nil || len(pc.A.Stmts) > 0 {
		b.WriteString("\n## The SQL of the peer's new-key start, captured the same way\n\n")
		if pc.Err != nil {
			fmt.Fprintf(&b, "FAILED: %v\n", pc.Err)
		} else {
			fmt.Fprintf(&b, "**%s in %s**, replayed by pgbench as the rows \"%s\" (script in `tools/bench/results/pgbench-peer.sql`).\n\n",
				count(len(pc.A.Stmts), "statement"), count(pc.A.RoundTrips-pc.A.PrepareRoundTrips, "round trip"), pgbenchPeerScenario)
			writeStatements(&b, pc.A)
		}
	}
	if r.Exp != nil {
		b.WriteString("\n" + r.Exp.markdown())
	}
	if r.Noisy != nil {
		b.WriteString("\n" + r.Noisy.markdown())
	}
	return b.String()
}

// writeStatements writes a captured request's statements with their
// parameters, round trip by round trip.
func writeStatements(b *strings.Builder, rc requestCapture) {
	b.WriteString("```sql\n")
	prev := [2]int{-1, -1}
	rt := 0
	for _, s := range rc.Stmts {
		if k := [2]int{s.Conn, s.Burst}; k != prev {
			rt++
			fmt.Fprintf(b, "-- round trip %d\n", rt)
			prev = k
		}
		fmt.Fprintf(b, "%s;\n", strings.TrimRight(strings.TrimSpace(s.SQL), ";"))
		for j, p := range s.Params {
			v := "NULL"
			if !p.Null {
				v = "'" + short(p.Text, 100) + "'"
			}
			fmt.Fprintf(b, "--   $%d = %s\n", j+1, v)
		}
	}
	b.WriteString("```\n")
}

// whyBehind explains, with this run's numbers, a new-key start that serves
// less than the peer's: the database work each asks for, measured by
// pgbench replaying each side's captured SQL, and each server's CPU. Empty
// when valruns is not behind or the numbers are missing.
func (r *results) whyBehind() string {
	vr, ok1 := r.find("valruns", "start, new key", ratioClients)
	peer, ok2 := r.find("peer", "start, new key", ratioClients)
	own, ok3 := r.find("pgbench", pgbenchScenario(1), ratioClients)
	theirs, ok4 := r.find("pgbench", pgbenchPeerScenario, ratioClients)
	if !ok1 || !ok2 || !ok3 || !ok4 || vr.RPS >= peer.RPS || own.RPS == 0 || theirs.RPS == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n## Why a new-key start serves less than the peer's\n\n")
	fmt.Fprintf(&b, "pgbench replayed the SQL each side's new-key start sent (captured below), %d clients, no HTTP in the way: "+
		"PostgreSQL runs valruns' start at **%.0f tps** and the peer's at **%.0f tps**, so the peer's start asks it for %.2fx less work. ",
		ratioClients, own.RPS, theirs.RPS, theirs.RPS/own.RPS)
	fmt.Fprintf(&b, "valruns serves %.0f rps, %.2fx its SQL's limit; the peer %.0f rps, %.2fx its own. ",
		vr.RPS, vr.RPS/own.RPS, peer.RPS, peer.RPS/theirs.RPS)
	fmt.Fprintf(&b, "The servers' CPU per start: valruns %.3f ms, the peer %.3f ms.\n\n",
		float64(vr.CPUPerReq.Microseconds())/1000, float64(peer.CPUPerReq.Microseconds())/1000)
	if a := r.Capture.A; len(a.Stmts) > 0 {
		fmt.Fprintf(&b, "valruns' start is %d statements in %d round trips, in autocommit: one statement reads the key and takes its lock, "+
			"bills one of the organisation's usage slots, and writes the key with its answer and the run (the outbox that makes a run Redis lost still run), "+
			"so that the run and its key exist together or not at all; concurrent starts share that statement. ",
			len(a.Stmts), a.RoundTrips-a.PrepareRoundTrips)
	}
	if a := r.PeerCapture.A; len(a.Stmts) > 0 {
		fmt.Fprintf(&b, "The peer's is %s in %s: the run's `INSERT`, committed on its own; no quota, no audit trail, "+
			"and its key is written to Redis after the answer is sent, so a crash between the two lets a retry run again.",
			count(len(a.Stmts), "statement"), count(a.RoundTrips-a.PrepareRoundTrips, "round trip"))
	}
	b.WriteString("\n")
	return b.String()
}

// count is n with its noun, plural unless n is 1.
func count(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
