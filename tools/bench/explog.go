package main

// The experiment log (issue 15): PostgreSQL's work per run, end to end,
// the backlog drain, for the binary being measured ("now") beside a
// baseline built from a git ref in the same run, and the peer end to end.
// `make bench` writes it as a section of RESULTS.md; `make bench-e2e`
// (only these parts) replaces that section of the existing RESULTS.md.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
)

const expHeading = "## Experiment log"

type experimentLog struct {
	Date           time.Time
	Mode           string
	Now            string // git describe of the working tree
	Baseline       string // the ref as given
	BaselineCommit string // "" when there is no baseline
	BaselineErr    string
	// Clients: the count of the baseline, the checks and the horizontal
	// scale; Levels: every count of the end-to-end curve.
	Clients    int
	Levels     []int
	Warm, Dur  time.Duration
	PgWorkRuns int
	PgWork     []pgWorkResult
	E2E        []e2eResult
	Drain      []drainResult
	Scale      []e2eResult // horizontal scale (issue 17), of "now"
	// Profile: where a start's and a run's time goes (issue 30), of "now".
	Profile  *profileResult
	ScaleDur time.Duration
	Load     string // load average before and after
	Errors   []string
}

func (x *experimentLog) pgwork(side string) (pgWorkResult, bool) {
	for _, p := range x.PgWork {
		if p.Side == side && p.Failed == "" {
			return p, true
		}
	}
	return pgWorkResult{}, false
}

// e2e is the loop of side and mode at x.Clients, the count of the checks.
func (x *experimentLog) e2e(side, mode string) (e2eResult, bool) {
	if r := x.e2eAt(side, mode, x.Clients); e2eMeasured(r) {
		return *r, true
	}
	return e2eResult{}, false
}

// checks are issue 15's targets that this log measures.
func (x *experimentLog) checks() []check {
	var out []check
	c := check{Name: "WAL bytes per run (start + execution), now vs baseline", Target: "<= 0.5x"}
	now, ok1 := x.pgwork("now")
	base, ok2 := x.pgwork("baseline")
	if !ok1 || !ok2 {
		c.Measured = "no data"
	} else {
		a := walPerRun(now)
		b := walPerRun(base)
		if b > 0 {
			v := a / b
			c.Measured = fmt.Sprintf("%.2fx (%.0f / %.0f bytes)", v, a, b)
			c.Pass = v <= 0.5
		} else {
			c.Measured = "no data"
		}
	}
	out = append(out, c)
	for _, m := range []e2eMode{modeInline, modeSeparate} {
		c := check{Name: fmt.Sprintf("e2e %s: runs finished / runs started over the loop", m.Name), Target: ">= 0.95"}
		if r, ok := x.e2e("now", m.Name); ok {
			c.Measured = fmt.Sprintf("%.2f (%.0f / %.0f runs/s)", r.Ratio(), r.FinishedPerSec(), r.StartedPerSec())
			c.Pass = r.Ratio() >= 0.95
		} else {
			c.Measured = "no data"
		}
		out = append(out, c)
	}
	c = check{Name: "e2e runs finished/s vs the peer's (serve + worker vs peer + worker.js)", Target: ">= 1.5x"}
	r, ok1 := x.e2e("now", modeSeparate.Name)
	p, ok2 := x.e2e("peer", peerSeparate.Name)
	if ok1 && ok2 && p.FinishedPerSec() > 0 {
		v := r.FinishedPerSec() / p.FinishedPerSec()
		c.Measured = fmt.Sprintf("%.2fx (%.0f / %.0f runs/s)", v, r.FinishedPerSec(), p.FinishedPerSec())
		c.Pass = v >= 1.5
	} else {
		c.Measured = "no data"
	}
	out = append(out, c)
	c = check{Name: "e2e start-to-running p50, serve --worker under load", Target: "<= 50 ms"}
	if r, ok := x.e2e("now", modeInline.Name); ok && r.HasRunning {
		c.Measured = ms(r.RunningP50) + " ms"
		c.Pass = r.RunningP50 <= 50*time.Millisecond
	} else {
		c.Measured = "no data"
	}
	out = append(out, c)
	return out
}

func walPerRun(p pgWorkResult) float64 {
	return p.Start.per(p.Start.walBytes()) + p.Exec.per(p.Exec.walBytes())
}

// ratioCell is a / b with two decimals, or "-".
func ratioCell(a, b float64) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx", a/b)
}

func f1(v float64) string { return fmt.Sprintf("%.1f", v) }
func f2(v float64) string { return fmt.Sprintf("%.2f", v) }

// markdown is the section, starting with expHeading.
func (x *experimentLog) markdown() string {
	var b strings.Builder
	b.WriteString(expHeading + "\n\n")
	fmt.Fprintf(&b, "Written by `make bench-e2e` or `make bench` (tools/bench/explog.go) on %s, mode %s: valruns %s", x.Date.UTC().Format("2006-01-02 15:04 MST"), x.Mode, x.Now)
	switch {
	case x.BaselineCommit != "":
		fmt.Fprintf(&b, " (\"now\") beside the baseline %s = %s (\"baseline\", built from git by the harness and run on a schema its own `migrate up` made)", x.Baseline, x.BaselineCommit[:12])
	case x.BaselineErr != "":
		fmt.Fprintf(&b, "; baseline %s FAILED: %s", x.Baseline, short(x.BaselineErr, 300))
	}
	fmt.Fprintf(&b, ". Load average %s. The machine is shared: compare the columns of one run, not runs of different days.\n\n", x.Load)

	b.WriteString("| target | measured | goal | result |\n|---|---|---|---|\n")
	for _, c := range x.checks() {
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", c.Name, c.Measured, c.Target, c.result())
	}

	if len(x.PgWork) > 0 {
		x.writePgWork(&b)
	}
	if len(x.E2E) > 0 {
		x.writeE2E(&b)
	}
	if x.Profile != nil {
		x.writeProfile(&b)
	}
	for _, d := range x.Drain {
		x.writeDrain(&b, d)
	}
	if len(x.Scale) > 0 {
		x.writeScale(&b)
	}
	return b.String()
}

func (x *experimentLog) writePgWork(b *strings.Builder) {
	fmt.Fprintf(b, "\n### PostgreSQL work per run\n\n")
	fmt.Fprintf(b, "%d new-key starts (8 clients) with `valruns serve` alone, then `valruns worker` alone executing them (and the template's one queued run), each process behind the capture proxy and measured between two WAL positions on a database of its own. "+
		"WAL, records, full-page images, heap and index writes are this database's own WAL records (pg_walinspect: records on its relations and the rest of their transactions); cluster WAL is the plain difference of the flushed WAL position (pg_current_wal_flush_lsn()), every database of this shared server included (noise). "+
		"Rows are pg_stat_user_tables, read after the process exited. Statements and round trips include the process's background work in the phase (the worker's polls, enqueuer, sweeper), divided by the runs.\n\n", x.PgWorkRuns)
	var sides []pgWorkResult
	for _, p := range x.PgWork {
		if p.Failed != "" {
			fmt.Fprintf(b, "%s: FAILED: %s\n\n", p.Side, short(p.Failed, 400))
			continue
		}
		sides = append(sides, p)
	}
	if len(sides) == 0 {
		return
	}
	b.WriteString("| per run |")
	for _, s := range sides {
		fmt.Fprintf(b, " %s start | %s execution | %s total |", s.Side, s.Side, s.Side)
	}
	both := len(sides) == 2 && sides[0].Side == "now" && sides[1].Side == "baseline"
	if both {
		b.WriteString(" total now / baseline |")
	}
	b.WriteString("\n|---|")
	for range sides {
		b.WriteString("---|---|---|")
	}
	if both {
		b.WriteString("---|")
	}
	b.WriteString("\n")
	type metric struct {
		name string
		f    func(p phaseWork) float64
		dec  func(float64) string
	}
	wal := func(f func(walKind) int64, sel func(p phaseWork) walKind) func(p phaseWork) float64 {
		return func(p phaseWork) float64 { return p.per(f(sel(p))) }
	}
	all := func(p phaseWork) walKind { return p.all() }
	metrics := []metric{
		{"WAL bytes (this database)", func(p phaseWork) float64 { return p.per(p.walBytes()) }, func(v float64) string { return fmt.Sprintf("%.0f", v) }},
		{"WAL records", wal(func(k walKind) int64 { return k.Records }, all), f1},
		{"full-page images", wal(func(k walKind) int64 { return k.FPIs }, all), f2},
		{"full-page image bytes", wal(func(k walKind) int64 { return k.FPIBytes }, all), func(v float64) string { return fmt.Sprintf("%.0f", v) }},
		{"cluster WAL bytes (all databases)", func(p phaseWork) float64 { return p.per(p.ClusterWAL) }, func(v float64) string { return fmt.Sprintf("%.0f", v) }},
		{"commits", func(p phaseWork) float64 { return p.per(p.commits()) }, f2},
		{"heap tuples inserted", func(p phaseWork) float64 {
			return p.per(p.heap("INSERT", "INSERT+INIT", "MULTI_INSERT", "MULTI_INSERT+INIT"))
		}, f2},
		{"heap tuples updated (HOT included)", func(p phaseWork) float64 {
			return p.per(p.heap("UPDATE", "UPDATE+INIT", "HOT_UPDATE", "HOT_UPDATE+INIT"))
		}, f2},
		{"heap tuples deleted", func(p phaseWork) float64 { return p.per(p.heap("DELETE")) }, f2},
		{"heap tuples locked", func(p phaseWork) float64 { return p.per(p.heap("LOCK")) }, f2},
		{"index entries written (B-tree leaf inserts)", func(p phaseWork) float64 { return p.per(p.indexInserts()) }, f2},
		{"rows inserted (pg_stat)", func(p phaseWork) float64 { i, _, _, _ := p.rows(); return p.per(i) }, f2},
		{"rows updated (pg_stat)", func(p phaseWork) float64 { _, u, _, _ := p.rows(); return p.per(u) }, f2},
		{"... of them HOT", func(p phaseWork) float64 { _, _, h, _ := p.rows(); return p.per(h) }, f2},
		{"rows deleted (pg_stat)", func(p phaseWork) float64 { _, _, _, d := p.rows(); return p.per(d) }, f2},
		{"statements", func(p phaseWork) float64 { return p.per(int64(p.Stmts)) }, f2},
		{"round trips", func(p phaseWork) float64 { return p.per(int64(p.RoundTrips)) }, f2},
	}
	for _, m := range metrics {
		fmt.Fprintf(b, "| %s |", m.name)
		var totals []float64
		for _, s := range sides {
			st, ex := m.f(s.Start), m.f(s.Exec)
			fmt.Fprintf(b, " %s | %s | %s |", m.dec(st), m.dec(ex), m.dec(st+ex))
			totals = append(totals, st+ex)
		}
		if both {
			fmt.Fprintf(b, " %s |", ratioCell(totals[0], totals[1]))
		}
		b.WriteString("\n")
	}
	for _, s := range sides {
		fmt.Fprintf(b, "\n%s, rows per run by table (inserted / updated / deleted), start then execution (%d and %d runs, %.1f s and %.1f s): ",
			s.Side, s.Start.Runs, s.Exec.Runs, s.Start.Elapsed.Seconds(), s.Exec.Elapsed.Seconds())
		var parts []string
		for _, ph := range []phaseWork{s.Start, s.Exec} {
			var ts []string
			for _, t := range ph.Tables {
				ts = append(ts, fmt.Sprintf("%s %s/%s/%s", t.Table, f2(ph.per(t.Ins)), f2(ph.per(t.Upd)), f2(ph.per(t.Del))))
			}
			parts = append(parts, strings.Join(ts, ", "))
		}
		b.WriteString(strings.Join(parts, "; then ") + ".\n")
		for i, ph := range []phaseWork{s.Start, s.Exec} {
			if ph.WAL != nil {
				fmt.Fprintf(b, "\n%s %s, WAL per run by record type (records, bytes): %s.\n", s.Side, []string{"start", "execution"}[i], ph.walKinds())
			}
		}
		for i, ph := range []phaseWork{s.Start, s.Exec} {
			fmt.Fprintf(b, "\n%s %s, statements sent most (per run):\n\n", s.Side, []string{"start", "execution"}[i])
			for _, st := range ph.TopStmts {
				fmt.Fprintf(b, "- %s `%s`\n", f2(ph.per(int64(st.N))), strings.ReplaceAll(st.SQL, "`", "'"))
			}
		}
	}
}

func (x *experimentLog) writeE2E(b *strings.Builder) {
	fmt.Fprintf(b, "\n### End to end\n\n")
	fmt.Fprintf(b, "A closed loop of new-key starts at %s clients (the baseline at %d only), %s warm-up then %s measured, each on a fresh database; then the harness waits for the window's runs to end. "+
		"From the runs' own timestamps: started/s counts runs created in the window, finished/s runs whose finished_at is in it (any run); start-to-final is finished_at - created_at, start-to-running started_at - created_at, over the runs created in the window. "+
		"sent-to-final is from the harness sending the request to the run's finished_at, over the runs the window's 201s named: what a waiting client feels, and what the curve's targets judge (the two sides stamp created_at at different points). "+
		"\"unfinished\" counts the window's runs still not final when the harness stopped waiting (then the p99 is a floor); \"drained\" is the last of them finishing, after the load stopped. CPU is per run started. The peer's start enqueues a BullMQ job after its INSERT; its worker (ajv, no CEL) writes status, times and findings in one statement.\n\n",
		levelsText(x.Levels, x.Clients), x.Clients, x.Warm, x.Dur)
	b.WriteString("| side | mode | clients | started/s | finished/s | finished / started | start-to-final p50 ms | p99 ms | sent-to-final p50 / p99 ms | start-to-running p50 ms | unfinished | drained after s | start answer p50 / p99 ms | server CPU ms/run | worker CPU ms/run | server peak RSS MB | errors |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range x.E2E {
		if r.Failed != "" {
			fmt.Fprintf(b, "| %s | %s | %d | FAILED: %s ||||||||||||||\n", r.Side, r.Mode, r.Clients, cell(short(r.Failed, 300)))
			continue
		}
		running := "-"
		if r.HasRunning {
			running = ms(r.RunningP50)
		}
		wcpu := "(in server)"
		if r.WorkerCPU > 0 {
			wcpu = ms3(r.WorkerCPU)
		}
		fmt.Fprintf(b, "| %s | %s | %d | %.0f | %.0f | %.2f | %s | %s | %s | %s | %d | %.1f | %s / %s | %s | %s | %s | %d |\n",
			r.Side, r.Mode, r.Clients, r.StartedPerSec(), r.FinishedPerSec(), r.Ratio(), ms(r.FinalP50), ms(r.FinalP99), waitCell(&r), running,
			r.Unfinished, r.DrainedAfter.Seconds(), ms(r.StartP50), ms(r.StartP99), ms3(r.ServerCPU), wcpu, mb(r.PeakRSSKB), r.Errors)
	}
	var ratios []string
	for _, m := range []e2eMode{modeInline, modeSeparate} {
		n, ok1 := x.e2e("now", m.Name)
		bl, ok2 := x.e2e("baseline", m.Name)
		if ok1 && ok2 {
			ratios = append(ratios, fmt.Sprintf("| %s | %s | %s | %s | %s |", m.Name, ratioCell(n.StartedPerSec(), bl.StartedPerSec()),
				ratioCell(n.FinishedPerSec(), bl.FinishedPerSec()), ratioCell(float64(n.FinalP50), float64(bl.FinalP50)), ratioCell(float64(n.FinalP99), float64(bl.FinalP99))))
		}
	}
	if len(ratios) > 0 {
		fmt.Fprintf(b, "\nNow vs baseline, same run, %d clients:\n\n", x.Clients)
		b.WriteString("| mode | started/s | finished/s | start-to-final p50 | p99 |\n|---|---|---|---|---|\n")
		b.WriteString(strings.Join(ratios, "\n") + "\n")
	}
}

func (x *experimentLog) writeDrain(b *strings.Builder, d drainResult) {
	fmt.Fprintf(b, "\n### Backlog drain (%s)\n\n", d.Side)
	if d.Failed != "" && len(d.Points) == 0 {
		fmt.Fprintf(b, "FAILED: %s\n", short(d.Failed, 400))
		return
	}
	fmt.Fprintf(b, "%d runs queued through the API with no worker (%.1f s, 32 clients), then `valruns worker` alone drains a copy of that queue (database cloned, Redis restored) at each WORKER_CONCURRENCY. "+
		"runs/s: runs over the time from the worker's start to the last finished_at. CPU per run: the worker process, and PostgreSQL's backends serving it (/proc).\n\n", d.Queued, d.Build.Seconds())
	b.WriteString("| WORKER_CONCURRENCY | runs | seconds | runs/s | worker CPU ms/run | PostgreSQL CPU ms/run |\n|---|---|---|---|---|---|\n")
	for _, p := range d.Points {
		if p.Failed != "" {
			fmt.Fprintf(b, "| %d | FAILED: %s |||||\n", p.Concurrency, cell(short(p.Failed, 300)))
			continue
		}
		fmt.Fprintf(b, "| %d | %d | %.1f | %.0f | %s | %s |\n", p.Concurrency, p.Runs, p.Elapsed.Seconds(), p.RunsPerSec(), ms3(p.WorkerCPU), ms3(p.PGCPU))
	}
}

// spliceSection replaces the section of doc that starts with heading (up
// to the next heading of the same level, or the end) by section, or
// appends section when doc has none.
func spliceSection(doc, heading, section string) string {
	section = strings.TrimRight(section, "\n") + "\n"
	lines := strings.SplitAfter(doc, "\n")
	level := heading[:strings.IndexByte(heading, ' ')+1] // "## "
	start, end := -1, len(lines)
	inFence := false
	for i, l := range lines {
		t := strings.TrimRight(l, "\n")
		if strings.HasPrefix(t, "```") {
			inFence = !inFence
			continue
		}
		if inFence {
			continue
		}
		if start < 0 && t == heading {
			start = i
			continue
		}
		if start >= 0 && strings.HasPrefix(t, level) {
			end = i
			break
		}
	}
	if start < 0 {
		if doc != "" && !strings.HasSuffix(doc, "\n") {
			doc += "\n"
		}
		if doc != "" {
			doc += "\n"
		}
		return doc + section
	}
	rest := strings.Join(lines[end:], "")
	if rest != "" {
		section += "\n"
	}
	return strings.Join(lines[:start], "") + section + rest
}

// spliceSectionBefore is spliceSection, but a section doc does not have
// yet goes before the heading next (when doc has it), not at the end.
func spliceSectionBefore(doc, heading, section, next string) string {
	if hasHeading(doc, heading) || !hasHeading(doc, next) {
		return spliceSection(doc, heading, section)
	}
	i := strings.Index(doc, "\n"+next+"\n") + 1
	return doc[:i] + strings.TrimRight(section, "\n") + "\n\n" + doc[i:]
}

// hasHeading says whether doc has the line heading.
func hasHeading(doc, heading string) bool {
	return strings.HasPrefix(doc, heading+"\n") || strings.Contains(doc, "\n"+heading+"\n")
}

// runExperiments measures the experiment log's parts that p wants: the
// sides' PostgreSQL work per run, the end-to-end loops (interleaved: each
// mode on now, baseline, then the peer, so that the runs a ratio compares
// are close in time) and the drain of the binary being measured.
func runExperiments(ctx context.Context, e *env, p plan, baseline, root, scratch string) *experimentLog {
	x := &experimentLog{Date: time.Now(), Mode: "full", Now: firstLine("git", "-C", root, "describe", "--always", "--dirty"),
		Clients: p.e2eMain(), Levels: p.E2ELevels, Warm: p.E2E.Warm, Dur: p.E2E.Dur, PgWorkRuns: p.PgWorkRuns, Load: loadavg()}
	if p.Quick {
		x.Mode = "quick"
	}
	say("experiment log: template of this binary (now)")
	now, err := e.makeSide(ctx, "now", "", e.bin)
	if err != nil {
		x.Errors = append(x.Errors, "now: "+err.Error())
		say("experiment log: %v", err)
		return x
	}
	sides := []*side{now}
	if baseline != "" && baseline != "none" {
		x.Baseline = baseline
		say("experiment log: building the baseline %s", baseline)
		bin, commit, err := buildBaseline(ctx, root, scratch, baseline)
		var bs *side
		if err == nil {
			bs, err = e.makeSide(ctx, "baseline", commit, bin)
		}
		if err != nil {
			x.BaselineErr = err.Error()
			x.Errors = append(x.Errors, "baseline: "+err.Error())
			say("experiment log: baseline: %v", err)
		} else {
			x.BaselineCommit = commit
			sides = append(sides, bs)
		}
	}
	if p.want("pgwork") {
		for _, s := range sides {
			if ctx.Err() != nil {
				return x
			}
			say("pgwork %s: %d starts, then their execution", s.Name, p.PgWorkRuns)
			r := e.measurePgWork(ctx, s, p.PgWorkRuns, 8)
			x.PgWork = append(x.PgWork, r)
			if r.Failed == "" {
				st, ex := r.Start, r.Exec
				say("pgwork %s: WAL %.0f + %.0f bytes/run, %.2f + %.2f statements/run, %.2f + %.2f round trips/run (start + execution)", s.Name,
					st.per(st.walBytes()), ex.per(ex.walBytes()), st.per(int64(st.Stmts)), ex.per(int64(ex.Stmts)), st.per(int64(st.RoundTrips)), ex.per(int64(ex.RoundTrips)))
			}
		}
	}
	if p.want("e2e") {
		// The curve: at each count, each mode on this binary, then on the
		// baseline (at the checks' count only), then the peer's matching
		// mode, back to back.
		drainWait := p.E2E.Dur + 30*time.Second
		for _, n := range p.E2ELevels {
			for _, pair := range e2ePairs {
				targets := []e2eTarget{}
				for _, s := range sides {
					if s == now || n == x.Clients {
						targets = append(targets, e2eTarget{side: s, mode: pair.Valruns})
					}
				}
				targets = append(targets, e2eTarget{peer: true, mode: pair.Peer})
				for _, t := range targets {
					if ctx.Err() != nil {
						return x
					}
					r := e.measureE2E(ctx, t, n, p.E2E.Warm, p.E2E.Dur, drainWait)
					x.E2E = append(x.E2E, r)
					if r.Failed == "" {
						say("e2e %-8s %-18s c=%-3d %5.0f started/s %5.0f finished/s (%.2f)  start-to-final p50 %s p99 %s ms, sent-to-final %s ms, %d unfinished",
							r.Side, r.Mode, r.Clients, r.StartedPerSec(), r.FinishedPerSec(), r.Ratio(), ms(r.FinalP50), ms(r.FinalP99), waitCell(&r), r.Unfinished)
					}
				}
			}
		}
	}
	if p.want("profile") && ctx.Err() == nil {
		say("profile: where the time goes, %d clients", profileClients)
		r := e.measureProfile(ctx, now, profileClients, p.E2E.Warm, p.E2E.Dur, scratch)
		x.Profile = &r
	}
	if p.want("drain") && ctx.Err() == nil {
		say("drain now: %d runs, WORKER_CONCURRENCY %v", p.DrainRuns, p.DrainConc)
		x.Drain = append(x.Drain, e.measureDrain(ctx, now, p.DrainRuns, p.DrainConc))
	}
	if p.want("scale") && ctx.Err() == nil {
		x.ScaleDur = p.ScaleDur
		x.Scale = e.measureScale(ctx, now, p.Scale, x.Clients, p.E2E.Warm, p.ScaleDur)
	}
	x.Load += " before, " + loadavg() + " after"
	return x
}

// failure says what of the log could not be measured (nil: all of it).
func (x *experimentLog) failure() error {
	errs := slices.Clone(x.Errors)
	for _, p := range x.PgWork {
		if p.Failed != "" {
			errs = append(errs, "pgwork "+p.Side)
		}
	}
	for _, r := range x.E2E {
		if r.Failed != "" {
			errs = append(errs, fmt.Sprintf("e2e %s %s at %d", r.Side, r.Mode, r.Clients))
		} else if r.Errors > 0 {
			errs = append(errs, fmt.Sprintf("e2e %s %s at %d: %d answers were errors", r.Side, r.Mode, r.Clients, r.Errors))
		}
	}
	for _, d := range x.Drain {
		if d.Failed != "" {
			errs = append(errs, "drain "+d.Side)
		}
		for _, p := range d.Points {
			if p.Failed != "" {
				errs = append(errs, fmt.Sprintf("drain %s at %d", d.Side, p.Concurrency))
			}
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("the experiment log is incomplete (%s)", strings.Join(errs, "; "))
}

// onlySections: the run measured the experiment log or the noisy
// neighbour (sections of their own) and nothing of the start table.
func (r *results) onlySections() bool {
	return (r.Exp != nil || r.Noisy != nil) && len(r.Rows) == 0 && r.Cleanup == nil && r.Latency == nil && r.Capture.Script == nil && r.Capture.Err == nil
}
