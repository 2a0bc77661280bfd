package main

// RESULTS.md: one section per part measured, each with when it was
// measured and its targets. A full run writes the file afresh; a partial
// run (-only) replaces its own sections and keeps the others.

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

type results struct {
	Mode     string
	Date     time.Time
	Elapsed  time.Duration
	Machine  machine
	Partial  bool // -only: the run replaces its sections of the results
	Levels   []int
	Timing   timing
	PgTiming timing
	// Rows are the start curve's runs, pgbench's included.
	Rows      []row
	E2E       []e2eResult
	E2ETiming timing
	Profile   *profileResult
	Noisy     *noisyLog
	Cleanup   *cleanupResult
}

// check is one target: what was measured against it.
type check struct {
	Name     string
	Measured string
	Target   string
	Pass     bool
	Missing  bool // a run it compares was not measured (never a PASS)
}

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

// section is a part of RESULTS.md: its heading, its text, its targets.
type section struct {
	Heading string
	Body    string
	Checks  []check
}

// sections are the parts this run measured, in order.
func (r *results) sections() []section {
	var out []section
	if len(r.curveRan()) > 0 || len(r.Rows) > 0 {
		out = append(out, r.curveSection())
	}
	if len(r.E2E) > 0 {
		out = append(out, r.e2eSection())
	}
	if r.Profile != nil {
		out = append(out, r.Profile.section())
	}
	if r.Noisy != nil {
		out = append(out, r.Noisy.section())
	}
	if r.Cleanup != nil {
		out = append(out, r.Cleanup.section())
	}
	if len(r.Rows) > 0 {
		out = append(out, r.runsSection())
	}
	return out
}

const resultsTitle = "# valruns benchmark results\n\n" +
	"Written by `make bench` (scripts/bench.sh, the harness in tools/bench/; tools/bench/README.md says what each section measures). " +
	"Each section says when it was measured: a partial run (`-only`, `make bench-noisy`) replaces only its own.\n"

// markdown is the results written over old (the existing file): afresh
// for a full run; for a partial one, old with this run's sections
// replaced (or added).
func (r *results) markdown(old string) string {
	doc := resultsTitle
	if r.Partial && strings.TrimSpace(old) != "" {
		doc = old
	}
	for _, s := range append([]section{r.machineSection()}, r.sections()...) {
		doc = spliceSection(doc, s.Heading, s.text(r))
	}
	return doc
}

// text is the section as written: heading, when, the count of its
// targets by result, its body.
func (s section) text(r *results) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n\nMeasured %s at %s, mode %s", s.Heading, r.Date.UTC().Format("2006-01-02 15:04 MST"), r.Machine.Commit, r.Mode)
	if r.Mode == "quick" {
		b.WriteString(" (short runs, to check the harness: do not quote these numbers)")
	}
	b.WriteString(".")
	if len(s.Checks) > 0 {
		n := map[string]int{}
		for _, c := range s.Checks {
			n[c.result()]++
		}
		fmt.Fprintf(&b, " Targets: %d PASS, %d MISS, %d not measured.", n["PASS"], n["MISS"], n["not measured"])
	}
	b.WriteString("\n\n" + strings.TrimLeft(s.Body, "\n"))
	return b.String()
}

// checkTable is checks as a Markdown table.
func checkTable(cs []check) string {
	var b strings.Builder
	b.WriteString("| target | measured | goal | result |\n|---|---|---|---|\n")
	for _, c := range cs {
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", cell(c.Name), cell(c.Measured), cell(c.Target), c.result())
	}
	return b.String()
}

func (r *results) machineSection() section {
	m := r.Machine
	var b strings.Builder
	b.WriteString("| | |\n|---|---|\n")
	fmt.Fprintf(&b, "| CPU | %s, %d cores |\n| RAM | %s |\n| kernel | %s |\n", m.CPU, m.Cores, m.RAM, m.Kernel)
	fmt.Fprintf(&b, "| load average (1 min) | %s before the run, %s after (well above 0 before: other work shared the CPU) |\n", m.LoadStart, m.LoadEnd)
	fmt.Fprintf(&b, "| PostgreSQL | %s, fsync=%s, synchronous_commit=%s, max_connections=%s, shared_buffers=%s |\n", m.Postgres, m.Fsync, m.SyncCommit, m.MaxConns, m.SharedBuffers)
	fmt.Fprintf(&b, "| Go | %s |\n| Node | %s |\n| pgbench | %s |\n| Redis | %s (%s) |\n", m.Go, m.Node, m.Pgbench, m.Redis, m.RedisWhere)
	fmt.Fprintf(&b, "| this run | %s |\n", r.Elapsed.Round(time.Second))
	b.WriteString("\nThe load generator, the servers, PostgreSQL and Redis share these cores: a client's CPU is the server's loss.\n")
	return section{Heading: "## Machine", Body: b.String()}
}

// runsSection lists every run of the start curve with all its figures.
func (r *results) runsSection() section {
	var b strings.Builder
	b.WriteString("The start curve's runs. Closed loop: each client sends its next request when the previous answer has arrived, on a keep-alive connection. " +
		"rps counts expected answers inside the measured window; CPU ms/req is the server process's user+system time in the window (/proc/PID/stat) over its requests; " +
		"peak RSS is VmHWM. errors: transport errors; unexpected: a 2xx that was not what the scenario expects (a replay that executed, a new key answered as a replay). " +
		"pgbench rows: tps, and the latency of its transactions.\n\n")
	b.WriteString("| target | scenario | clients | rps | p50 ms | p99 ms | p99.9 ms | errors | non-2xx | unexpected | CPU ms/req | peak RSS MB | notes |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	rows := slices.Clone(r.Rows)
	order := map[string]int{"valruns": 0, "peer": 1, "pgbench": 2}
	slices.SortStableFunc(rows, func(a, b row) int {
		if d := order[a.Section] - order[b.Section]; d != 0 {
			return d
		}
		if a.Scenario != b.Scenario {
			return strings.Compare(a.Scenario, b.Scenario)
		}
		return a.Clients - b.Clients
	})
	for _, x := range rows {
		if x.Failed != "" {
			fmt.Fprintf(&b, "| %s | %s | %d | FAILED |||||||| %s |\n", x.Section, x.Scenario, x.Clients, cell(short(x.Failed, 300)))
			continue
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %.0f | %s | %s | %s | %d | %d | %d | %s | %s | %s |\n",
			x.Section, x.Scenario, x.Clients, x.RPS, ms(x.P50), ms(x.P99), ms(x.P999),
			x.Errors, x.Non2xx, x.Unexpect, ms3(x.CPUPerReq), mb(x.PeakRSSKB), cell(strings.Join(x.Notes, "; ")))
	}
	return section{Heading: "## All runs", Body: b.String()}
}

// failures are what makes the run fail: a run that could not be made, an
// answer that was not as expected.
func (r *results) failures() []string {
	var errs []string
	n := 0
	for _, x := range r.Rows {
		n += x.Errors + x.Non2xx + x.Unexpect
		if x.Failed != "" {
			errs = append(errs, fmt.Sprintf("%s %s at %d failed", x.Section, x.Scenario, x.Clients))
		}
	}
	if n > 0 {
		errs = append(errs, fmt.Sprintf("%d answers of the start curve were errors, non-2xx or unexpected (they must be 0)", n))
	}
	for _, x := range r.E2E {
		if x.Failed != "" {
			errs = append(errs, fmt.Sprintf("e2e %s at %d failed", x.Mode, x.Clients))
		} else if x.Errors > 0 {
			errs = append(errs, fmt.Sprintf("e2e %s at %d: %d answers were errors", x.Mode, x.Clients, x.Errors))
		}
	}
	if r.Profile != nil && r.Profile.Failed != "" {
		errs = append(errs, "the profile failed")
	}
	if r.Noisy != nil {
		errs = append(errs, r.Noisy.failures()...)
	}
	if c := r.Cleanup; c != nil && (c.Failed != "" || c.Without.Errors+c.Without.Non2xx+c.During.Errors+c.During.Non2xx > 0) {
		errs = append(errs, "the cleanup failed or its starts had errors")
	}
	return errs
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
		}
		if inFence {
			continue
		}
		if start < 0 && t == heading {
			start = i
		} else if start >= 0 && strings.HasPrefix(t, level) {
			end = i
			break
		}
	}
	if start < 0 {
		return strings.TrimRight(doc, "\n") + "\n\n" + section
	}
	rest := strings.Join(lines[end:], "")
	if rest != "" {
		section += "\n"
	}
	return strings.Join(lines[:start], "") + section + rest
}

// ratioText writes v with two decimals, or three when two would round it
// onto its target (0.696 is not 0.70).
func ratioText(v, target float64) string {
	if s := fmt.Sprintf("%.2f", v); s != fmt.Sprintf("%.2f", target) || v == target {
		return s
	}
	return fmt.Sprintf("%.3f", v)
}

func mb(kb int64) string {
	if kb == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f", float64(kb)/1024)
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d.Microseconds())/1000) }

// ms3 is d in milliseconds with three decimals (CPU time per request).
func ms3(d time.Duration) string { return fmt.Sprintf("%.3f", float64(d.Microseconds())/1000) }

func cell(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

// short is s cut to n bytes, with its newlines as spaces.
func short(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}
