package main

// RESULTS.md: a section per part measured, with when and its targets. A full
// run writes it afresh; a partial run (-only) replaces only its own sections.

import (
	"fmt"
	"os"
	"strings"
	"time"
)

type results struct {
	Mode             string
	Commit           string // git describe of the working tree
	Date             time.Time
	Elapsed          time.Duration
	Machine          [][2]string
	Partial          bool // -only: the run replaces its sections of the results
	Timing, PgTiming timing
	// Rows are the start curve's runs, pgbench's included.
	Rows      []row
	E2E       []e2eResult
	E2ETiming timing
	// Wait is the long poll's rounds, valruns' and the peer's.
	Wait       []waitResult
	WaitTiming timing
	Profile    []profileResult // one per count
	Noisy      *noisyLog
	Cleanup    cleanups
}

// check is one target: what was measured against it.
type check struct {
	Name, Measured, Target string
	Pass                   bool
	Missing                bool // a run it compares was not measured (never a PASS)
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

// ratio is c measured as a / b against bound: at least bound, or at most
// when most; not measured when !ok or b is 0. figures say what a and b are.
func ratio(c check, ok bool, a, b, bound float64, most bool, figures string) check {
	if !ok || b == 0 {
		return notMeasured(c)
	}
	f := a / b
	c.Measured, c.Pass = fmt.Sprintf("%sx (%s)", ratioText(f, bound), figures), !most && f >= bound || most && f <= bound
	return c
}

// section is a part of RESULTS.md: its heading, its intro, its targets
// (written as a table after the intro) and the rest of its body.
type section struct {
	Heading, Intro string
	Checks         []check
	Body           string
}

// sections are the parts this run measured, in order.
func (r *results) sections() []section {
	var out []section
	add := func(ran bool, s func() section) {
		if ran {
			out = append(out, s())
		}
	}
	add(len(r.Rows) > 0, r.curveSection)
	add(len(r.E2E) > 0, r.e2eSection)
	add(len(r.Wait) > 0, r.waitSection)
	add(len(r.Profile) > 0, func() section { return profileSection(r.Profile) })
	add(r.Noisy != nil, r.Noisy.section)
	add(len(r.Cleanup) > 0, r.Cleanup.section)
	return out
}

const resultsTitle = "# valruns benchmark results\n\n" +
	"Written by `make bench` (scripts/bench.sh, the harness in tools/bench/; tools/bench/README.md says what each section measures). " +
	"Each section says when it was measured: a partial run (`-only`, `make bench-noisy`) replaces only its own.\n"

// markdown is the results written over old (the existing file): afresh for
// a full run; for a partial one, old with this run's sections replaced or added.
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
// targets by result, its intro, the table of its targets, the rest.
func (s section) text(r *results) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n\nMeasured %s at %s, mode %s.", s.Heading, r.Date.UTC().Format("2006-01-02 15:04 MST"), r.Commit, r.Mode)
	parts := []string{s.Intro}
	if len(s.Checks) > 0 {
		n, table := map[string]int{}, "| target | measured | goal | result |\n|---|---|---|---|\n"
		for _, c := range s.Checks {
			n[c.result()]++
			table += fmt.Sprintf("| %s | %s | %s | %s |\n", cell(c.Name), cell(c.Measured), cell(c.Target), c.result())
		}
		fmt.Fprintf(&b, " Targets: %d PASS, %d MISS, %d not measured.", n["PASS"], n["MISS"], n["not measured"])
		parts = append(parts, table)
	}
	for _, p := range append(parts, s.Body) {
		if p = strings.Trim(p, "\n"); p != "" {
			b.WriteString("\n\n" + p)
		}
	}
	return b.String() + "\n"
}

func (r *results) machineSection() section {
	var b strings.Builder
	b.WriteString("| | |\n|---|---|\n")
	for _, kv := range r.Machine {
		fmt.Fprintf(&b, "| %s | %s |\n", kv[0], cell(kv[1]))
	}
	fmt.Fprintf(&b, "| this run | %s |\n\nThe load generator, the servers, PostgreSQL and Redis share these cores: a client's CPU is the server's loss; "+
		"a load average well above 0 before the run means other work shared them.\n", r.Elapsed.Round(time.Second))
	return section{Heading: "## Machine", Body: b.String()}
}

// failures are what fails the run: a run not made, an answer not as expected.
func (r *results) failures() []string {
	var errs []string
	add := func(bad bool, format string, args ...any) {
		if bad {
			errs = append(errs, fmt.Sprintf(format, args...))
		}
	}
	for _, x := range r.Rows {
		add(x.Failed != "", "%s %s at %d failed: %s", x.Section, x.Scenario, x.Clients, short(x.Failed, 200))
		add(x.Failed == "" && x.Errors+x.Non2xx+x.Unexpect > 0, "%s %s at %d: %d transport errors, %d non-2xx, %d unexpected (%s)",
			x.Section, x.Scenario, x.Clients, x.Errors, x.Non2xx, x.Unexpect, strings.Join(x.Notes, "; "))
	}
	for _, x := range r.E2E {
		add(x.Failed != "", "e2e %s at %d failed", x.Mode, x.Clients)
		add(x.Failed == "" && x.Errors > 0, "e2e %s at %d: %d answers were errors", x.Mode, x.Clients, x.Errors)
	}
	for _, x := range r.Wait {
		add(x.Failed != "", "wait %s at %d, round %d failed", x.Side, x.Clients, x.Round)
	}
	for _, x := range r.Profile {
		add(x.Failed != "", "the profile at %s failed", clientsText(x.Clients))
	}
	if r.Noisy != nil {
		errs = append(errs, r.Noisy.failures()...)
	}
	for _, c := range r.Cleanup {
		add(c.Failed != "" || c.Without.Errors+c.Without.Non2xx+c.During.Errors+c.During.Non2xx > 0, "the cleanup of %d keys failed or its starts had errors", c.Keys)
	}
	return errs
}

// spliceSection replaces the section of doc that starts with heading (up
// to the next heading of its level, or the end) by section, or appends
// section when doc has none.
func spliceSection(doc, heading, section string) string {
	section = strings.TrimRight(section, "\n") + "\n"
	i := strings.Index(doc, "\n"+heading+"\n")
	if i < 0 {
		return strings.TrimRight(doc, "\n") + "\n\n" + section
	}
	rest := doc[i+1+len(heading):]
	if j := strings.Index(rest, "\n"+heading[:strings.IndexByte(heading, ' ')+1]); j >= 0 {
		return doc[:i+1] + section + rest[j:]
	}
	return doc[:i+1] + section
}

// ratioText writes v with two decimals, or three when two would round it
// onto its target (0.696 is not 0.70).
func ratioText(v, target float64) string {
	if s := fmt.Sprintf("%.2f", v); s != fmt.Sprintf("%.2f", target) || v == target {
		return s
	}
	return fmt.Sprintf("%.3f", v)
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

// failed is err's text, said on stderr as what's failure ("" for none).
func failed(what string, err error) string {
	if err == nil {
		return ""
	}
	fmt.Fprintf(os.Stderr, "bench: %s: %v\n", what, err)
	return err.Error()
}

// perSec is n over d, per second.
func perSec(n int, d time.Duration) float64 { return float64(n) / max(d.Seconds(), 1e-9) }

// find is the first of xs that is (nil: none).
func find[T any](xs []T, is func(T) bool) *T {
	for i := range xs {
		if is(xs[i]) {
			return &xs[i]
		}
	}
	return nil
}

// plural is n things: "1 client", "8 clients".
func plural(n int, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return fmt.Sprintf("%d %ss", n, thing)
}
