package main

// The start curve: starts without a key, with a new key and replays at
// each client count, valruns beside the peer and the database's limit
// (pgbench). A count that was not measured is never a PASS.

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/valruns/valruns/models"
)

// The curve's scenarios, by the name of their rows, with their titles.
const (
	noKey  = "start, no key"
	newKey = "start, new key"
	replay = "replay" // each client re-sends its one finished key
)

var startCurve = [][2]string{{noKey, "Start without a key"}, {newKey, "Start with a new key"}, {replay, "Replay (each client re-sends its one finished key)"}}

// The curve's sides, by the section of their rows; the stricter peer of
// issue 48 runs with the peer's part, at strictCounts only.
const (
	valrunsSide = "valruns"
	peerSide    = "peer"
	strictSide  = "peer, no enqueue"
)

// sides are the sides of scenario measured at clients, in a round's order.
func (p plan) sides(scenario string, clients int) []string {
	var out []string
	if p.want(valrunsSide) {
		out = append(out, valrunsSide)
	}
	if p.want(peerSide) {
		out = append(out, peerSide)
		if scenario != replay && slices.Contains(strictCounts, clients) {
			out = append(out, strictSide)
		}
	}
	return out
}

// row is one measured run: a start scenario at a count, or pgbench.
type row struct {
	Section, Scenario        string // Section: valruns, peer, pgbench
	Clients                  int
	RPS                      float64
	P50, P99, P999           time.Duration
	Errors, Non2xx, Unexpect int           // transport errors, non-2xx, unexpected 2xx
	CPUPerReq                time.Duration // the server process's CPU time per request
	Notes                    []string      // what went wrong
	CappedAt                 int           // pgbench ran with this many clients, fewer than Clients
	Failed                   string        // the run could not be made
}

// timing is how long to warm up and measure.
type timing struct{ Warm, Dur time.Duration }

// mergeRounds is one row for a scenario's rounds at one count: rps,
// latencies and CPU are their means, errors and notes all rounds'. A round
// that failed fails the row: a mean never hides a failed run.
func mergeRounds(rs []row) row {
	m := rs[0]
	m.RPS, m.P50, m.P99, m.P999, m.CPUPerReq, m.Notes = 0, 0, 0, 0, 0, nil
	n := len(rs)
	for i, r := range rs {
		if r.Failed != "" {
			m.Failed = fmt.Sprintf("round %d of %d: %s", i+1, n, r.Failed)
			return m
		}
		m.RPS += r.RPS / float64(n)
		m.P50, m.P99, m.P999, m.CPUPerReq = m.P50+r.P50/time.Duration(n), m.P99+r.P99/time.Duration(n), m.P999+r.P999/time.Duration(n), m.CPUPerReq+r.CPUPerReq/time.Duration(n)
		if i > 0 {
			m.Errors, m.Non2xx, m.Unexpect = m.Errors+r.Errors, m.Non2xx+r.Non2xx, m.Unexpect+r.Unexpect
		}
		m.Notes = append(m.Notes, r.Notes...)
	}
	return m
}

// measureCurve runs the curve: at each count, each scenario on each side in
// turn, p.Rounds times (a row merges them); after the new-key starts, pgbench.
func measureCurve(ctx context.Context, e *env, p plan, res *results) error {
	add := func(r row) {
		say("%-16s %-28s c=%-3d %8.0f rps  p50 %6s  p99 %7s ms  %s", r.Section, r.Scenario, r.Clients, r.RPS, ms(r.P50), ms(r.P99), short(r.Failed, 200))
		res.Rows = append(res.Rows, r)
	}
	for _, c := range p.Levels {
		for _, sc := range startCurve {
			sides, rounds := p.sides(sc[0], c), map[string][]row{}
			for range max(p.Rounds, 1) {
				for _, side := range sides {
					if ctx.Err() != nil {
						return ctx.Err()
					}
					rounds[side] = append(rounds[side], e.runHTTP(ctx, sc[0], side, c, p.HTTP))
				}
			}
			for _, side := range sides {
				add(mergeRounds(rounds[side]))
			}
			if sc[0] == newKey && p.want("pgbench") {
				add(e.runPgbench(ctx, peerSQL, c, p.PG))
				add(e.runPgbench(ctx, startSQL, c, p.PG))
			}
		}
	}
	return ctx.Err()
}

// runHTTP measures one scenario of a side at one count on a fresh database.
func (e *env) runHTTP(ctx context.Context, scenario, side string, clients int, t timing) row {
	r := row{Section: side, Scenario: scenario, Clients: clients}
	what, extra := "serve", []string(nil)
	switch side {
	case peerSide:
		what = "peer"
	case strictSide:
		what, extra = "peer", []string{"PEER_ENQUEUE=0"}
	}
	err := e.onRig(ctx, []string{what}, extra, func(rg *rig, ps []*proc) error {
		next, check, err := e.requests(ctx, scenario, side != valrunsSide, rg.base, clients)
		if err != nil {
			return err
		}
		m := &usageMeter{pid: ps[0].cmd.Process.Pid}
		r.fill(runLoad(ctx, clients, t.Warm, t.Dur, next, loadOptions{Check: check, OnWindow: m.window}), m)
		return nil
	})
	r.Failed = failed(fmt.Sprintf("%s %s c=%d", r.Section, scenario, clients), err)
	return r
}

// fill sets the row's figures from a window, and its CPU per request from
// m, the server's over the same window.
func (r *row) fill(res loadResult, m *usageMeter) {
	r.RPS = res.RPS()
	r.P50, r.P99, r.P999 = res.Percentile(0.50), res.Percentile(0.99), res.Percentile(0.999)
	r.Errors, r.Non2xx, r.Unexpect = res.Errors, res.Non2xx, res.Unexpected
	if len(res.Statuses) > 0 {
		r.Notes = append(r.Notes, fmt.Sprintf("non-2xx by status: %v", res.Statuses))
	}
	if res.FirstError != "" {
		r.Notes = append(r.Notes, "first error: "+short(res.FirstError, 160))
	}
	if res.Requests > 0 {
		r.CPUPerReq = m.CPU / time.Duration(res.Requests)
	}
}

// requests builds what each client sends in a scenario, and sends the
// first request of the keys a replay re-sends.
func (e *env) requests(ctx context.Context, scenario string, peer bool, base string, clients int) (requestFunc, checkFunc, error) {
	token, url, body, run := e.orgs[0].Token, base+e.orgs[0].startPath(), []byte(startBody), time.Now().UnixNano()
	check := replayCheck(scenario == replay)
	if peer {
		// No authentication; express-idempotency marks no replay: its
		// status is all there is to check.
		token, check = "", nil
	}
	key := func(c, i int) string {
		switch scenario {
		case newKey:
			return fmt.Sprintf("new-%d-%d-%d", run, c, i)
		case replay:
			return fmt.Sprintf("replay-%d-%d", run, c)
		}
		return ""
	}
	next := func(c, i int) request { return request{http.MethodPost, url, headerFor(token, key(c, i)), body} }
	if scenario == replay {
		for c := range clients {
			if _, err := post(ctx, url, body, next(c, 0).Header); err != nil {
				return nil, nil, err
			}
		}
	}
	return next, check, nil
}

// startGoal is the curve's target at clients (issue 30): at least ratio
// times the peer's rps, and at 1 client a p50 at most the peer's; replays
// at least 5x everywhere.
func startGoal(scenario string, clients int) (ratio float64, p50 bool) {
	if scenario == replay {
		return 5, false
	}
	return map[int]float64{1: 1.0, 8: 1.3, 32: 1.75, 128: 2.5}[clients], clients == 1
}

// times is a target factor as written in the issue: 1.0x, 1.3x, 1.75x.
func times(f float64) string {
	if f == float64(int(f)) {
		return fmt.Sprintf("%.1fx", f)
	}
	return strconv.FormatFloat(f, 'f', -1, 64) + "x"
}

func clientsText(n int) string { return plural(n, "client") }

// startCheck is the target of a scenario at clients, from its runs (nil:
// not run); false when the count has none.
func startCheck(scenario string, clients int, v, p *row) (check, bool) {
	bound, p50 := startGoal(scenario, clients)
	c := check{Name: fmt.Sprintf("%s, %s: valruns vs the peer", scenario, clientsText(clients)), Target: ">= " + times(bound) + " the peer"}
	var noHigher func(a, b time.Duration) bool
	if p50 {
		c.Target += ", p50 <= the peer's"
		noHigher = func(a, b time.Duration) bool { return a <= b }
	}
	return versus(c, bound, v, p, noHigher), bound > 0
}

// versus is c measured as v against p: at least bound times p's rps and,
// when p50 is set, p50(v's p50, p's).
func versus(c check, bound float64, v, p *row, p50 func(a, b time.Duration) bool) check {
	ok := measured(v) && measured(p)
	c = ratio(c, ok, rpsOf(v), rpsOf(p), bound, false, fmt.Sprintf("%.0f / %.0f rps", rpsOf(v), rpsOf(p)))
	if p50 != nil && ok {
		c.Measured += fmt.Sprintf(", p50 %s / %s ms", ms(v.P50), ms(p.P50))
		c.Pass = c.Pass && p50(v.P50, p.P50)
	}
	return c
}

func measured(x *row) bool { return x != nil && x.Failed == "" }

// rowAt is the run of section and scenario at clients (nil: not run).
func (r *results) rowAt(section, scenario string, clients int) *row {
	return find(r.Rows, func(x row) bool { return x.Section == section && x.Scenario == scenario && x.Clients == clients })
}

// curveCounts are the counts a table lists: the full plan's, and any measured.
func curveCounts[T any](own []int, runs []T, clients func(T) int) []int {
	out := slices.Clone(own)
	for _, x := range runs {
		if n := clients(x); !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

func (r *results) curveCounts() []int {
	return curveCounts(makePlan(false).Levels, r.Rows, func(x row) int { return x.Clients })
}

// curveChecks are the curve's targets at every count that has one, and
// new-key starts beside no-key starts at 32 clients.
func (r *results) curveChecks() []check {
	var out []check
	for _, sc := range startCurve {
		for _, n := range r.curveCounts() {
			if c, ok := startCheck(sc[0], n, r.rowAt("valruns", sc[0], n), r.rowAt("peer", sc[0], n)); ok {
				out = append(out, c)
			}
		}
	}
	out = append(out, r.strictChecks()...)
	none, keyed := rpsOf(r.rowAt("valruns", noKey, 32)), rpsOf(r.rowAt("valruns", newKey, 32))
	return append(out, ratio(check{Name: "start, new key vs start, no key, 32 clients (valruns)", Target: ">= 0.8x"}, keyed > 0, keyed, none, 0.8, false,
		fmt.Sprintf("%.0f / %.0f rps", keyed, none)))
}

// curveSection is the start curve: its targets, a table per scenario, issue 48's.
func (r *results) curveSection() section {
	var b strings.Builder
	for _, sc := range startCurve {
		fmt.Fprintf(&b, "\n### %s\n\n", sc[1])
		b.WriteString("| clients | valruns rps | peer rps | valruns / peer | limit: pgbench of the peer's INSERT, tps | valruns / limit | own SQL, tps | valruns p50 / p99 ms | peer p50 / p99 ms |\n")
		b.WriteString("|---|---|---|---|---|---|---|---|---|\n")
		for _, n := range r.curveCounts() {
			v, p, lim := r.rowAt("valruns", sc[0], n), r.rowAt("peer", sc[0], n), r.rowAt("pgbench", pgbenchPeerScenario, n)
			fmt.Fprintf(&b, "| %d | %s | %s | %s | %s | %s | %s | %s | %s |\n", n, rpsCell(v), rpsCell(p), fraction(rpsOf(v), rpsOf(p)),
				rpsCell(lim), fraction(rpsOf(v), rpsOf(lim)), rpsCell(r.rowAt("pgbench", pgbenchStartScenario, n)), latCell(v), latCell(p))
		}
	}
	b.WriteString("\n### Issue 48: against the stricter peer\n\n" +
		"The peer without its enqueue (`PEER_ENQUEUE=0`: one `INSERT`, no BullMQ job) in the same rounds, at 1 and 8 clients; the limit is pgbench of that `INSERT`.\n\n")
	b.WriteString("| scenario | clients | valruns rps | stricter peer rps | valruns / it | valruns p50 / p99 ms | its p50 / p99 ms | valruns / limit |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|\n")
	r.strictRows(func(sc string, n int, v, p, lim *row) {
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s | %s | %s |\n", sc, n, rpsCell(v), rpsCell(p), fraction(rpsOf(v), rpsOf(p)),
			latCell(v), latCell(p), fraction(rpsOf(v), rpsOf(lim)))
	})
	intro := fmt.Sprintf("Valruns (`serve`) beside the peer at each count, %s warm-up, %s measured, a fresh database each; "+
		"a row is the mean of the rounds, the two sides in turn. The limit: pgbench of the peer's `INSERT` (`%s`), %s measured; "+
		"own SQL: pgbench of valruns' start statements (`%s`). pgbench runs with `-M prepared`, its connections capped by `max_connections` "+
		"and for valruns' statements by the organisation's usage slots (shown when they were).",
		r.Timing.Warm, r.Timing.Dur, peerSQL.Path, r.PgTiming.Dur, startSQL.Path)
	return section{Heading: "## The curve: starts", Intro: intro, Checks: r.curveChecks(), Body: b.String()}
}

// rpsCell is a run's rate (with pgbench's connections when capped), "not
// measured" (not run) or "FAILED".
func rpsCell(x *row) string {
	switch {
	case x == nil:
		return "not measured"
	case x.Failed != "":
		return "FAILED"
	case x.CappedAt > 0:
		return fmt.Sprintf("%.0f (%d conns)", x.RPS, x.CappedAt)
	}
	return fmt.Sprintf("%.0f", x.RPS)
}

func rpsOf(x *row) float64 {
	if !measured(x) {
		return 0
	}
	return x.RPS
}

// latCell is a run's p50 / p99, or "-".
func latCell(x *row) string {
	if !measured(x) {
		return "-"
	}
	return ms(x.P50) + " / " + ms(x.P99)
}

// fraction is a / b as "0.42x", or "-" when either is 0 (not measured).
func fraction(a, b float64) string {
	if a == 0 || b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx", a/b)
}

// strictCounts are the counts of issue 48's stricter peer: the peer
// without its BullMQ enqueue (express-idempotency and one INSERT).
var strictCounts = []int{1, 8}

// strictGoal is issue 48's target at clients: at least ratio times the
// stricter peer's rps, at 1 client a p50 below its, and at least limit
// times pgbench of the peer's INSERT (0: no target).
func strictGoal(clients int) (ratio float64, p50 bool, limit float64) {
	return map[int]float64{1: 1.2, 8: 1.5}[clients], clients == 1, map[int]float64{1: 0.6}[clients]
}

// strictCheck is issue 48's target of scenario at clients beside the
// stricter peer p, and when there is one, beside the limit lim.
func strictCheck(scenario string, clients int, v, p, lim *row) (peer check, limit *check) {
	bound, p50, atLeast := strictGoal(clients)
	what := fmt.Sprintf("%s, %s: valruns vs ", scenario, clientsText(clients))
	peer = check{Name: what + "the peer without its enqueue (issue 48)", Target: ">= " + times(bound) + " it"}
	var below func(a, b time.Duration) bool
	if p50 {
		peer.Target += ", p50 < its"
		below = func(a, b time.Duration) bool { return a < b }
	}
	peer = versus(peer, bound, v, p, below)
	if atLeast > 0 {
		c := ratio(check{Name: what + "the limit of the peer's INSERT (issue 48)", Target: ">= " + times(atLeast) + " the limit"},
			measured(v) && measured(lim), rpsOf(v), rpsOf(lim), atLeast, false, fmt.Sprintf("%.0f rps / %.0f tps", rpsOf(v), rpsOf(lim)))
		limit = &c
	}
	return peer, limit
}

// strictRows are the starts issue 48 names, at each of its counts.
func (r *results) strictRows(each func(scenario string, clients int, v, p, lim *row)) {
	for _, sc := range []string{noKey, newKey} {
		for _, n := range strictCounts {
			each(sc, n, r.rowAt(valrunsSide, sc, n), r.rowAt(strictSide, sc, n), r.rowAt("pgbench", pgbenchPeerScenario, n))
		}
	}
}

// strictChecks are issue 48's targets of starts.
func (r *results) strictChecks() []check {
	var out []check
	r.strictRows(func(sc string, n int, v, p, lim *row) {
		peer, limit := strictCheck(sc, n, v, p, lim)
		if out = append(out, peer); limit != nil {
			out = append(out, *limit)
		}
	})
	return out
}

// The database's limit: pgbench running a start's statements, written by
// hand in tools/bench/sql/, with -M prepared as the drivers' caches do.

// sqlScript is a hand-written pgbench script and the scenario of its rows.
type sqlScript struct {
	Scenario string
	Path     string // from the repository's root
	// Slots: the script is valruns' start, which claims a usage slot (SKIP LOCKED).
	Slots bool
}

const (
	pgbenchPeerScenario  = "the peer's INSERT"
	pgbenchStartScenario = "valruns' start statements"
)

var (
	peerSQL  = sqlScript{Scenario: pgbenchPeerScenario, Path: "tools/bench/sql/peer_insert.sql"}
	startSQL = sqlScript{Scenario: pgbenchStartScenario, Path: "tools/bench/sql/valruns_start.sql", Slots: true}
)

var (
	tpsRe    = regexp.MustCompile(`(?m)^tps = ([0-9.]+) \(without initial connection time\)`)
	failedRe = regexp.MustCompile(`(?m)^number of failed transactions: ([0-9]+)`)
)

// pgbench runs the script on database db, the organisation's ids as its
// variables: its tps and failed transactions, or the errors if aborted.
func (e *env) pgbench(ctx context.Context, db, script string, clients int, args ...string) (tps float64, failed int, err error) {
	o := e.orgs[0]
	a := []string{"-n", "-M", "prepared", "-f", filepath.Join(e.root, script),
		"-D", "org=" + o.ID, "-D", "wf=" + o.Workflow, "-D", "token=" + o.TokenID, "-D", "quota=" + strconv.FormatInt(o.Quota, 10),
		"-c", strconv.Itoa(clients), "-j", strconv.Itoa(max(1, min(clients, runtime.NumCPU())))}
	// The database's URL in place of its name: libpq reads it whole.
	out, err := exec.CommandContext(ctx, "pgbench", append(append(a, args...), e.dbURL(db))...).CombinedOutput()
	tps, failed, aborted := parsePgbench(string(out))
	if err != nil || aborted {
		err = fmt.Errorf("pgbench %s: %s", script, pgbenchErrors(string(out)))
	}
	return tps, failed, err
}

// parsePgbench reads pgbench's summary.
func parsePgbench(out string) (tps float64, failed int, aborted bool) {
	if m := tpsRe.FindStringSubmatch(out); m != nil {
		tps, _ = strconv.ParseFloat(m[1], 64)
	}
	if m := failedRe.FindStringSubmatch(out); m != nil {
		failed, _ = strconv.Atoi(m[1])
	}
	return tps, failed, strings.Contains(out, "aborted")
}

// checkScript runs the script for a few transactions: an error if PostgreSQL
// refuses it or they did not each write a run (as on valruns' slow path).
func (e *env) checkScript(ctx context.Context, conn *pgx.Conn, db string, s sqlScript) error {
	var before, after int
	_ = conn.QueryRow(ctx, `SELECT count(*) FROM validation_runs`).Scan(&before)
	if _, failed, err := e.pgbench(ctx, db, s.Path, 2, "-t", "5"); err != nil || failed > 0 {
		return cmp.Or(err, fmt.Errorf("pgbench %s: %d transactions failed", s.Path, failed))
	}
	_ = conn.QueryRow(ctx, `SELECT count(*) FROM validation_runs`).Scan(&after)
	if after-before != 10 {
		return fmt.Errorf("%s: 10 transactions wrote %d runs, want 10", s.Path, after-before)
	}
	return nil
}

// availableConns is how many more connections the server accepts, less a margin.
func (e *env) availableConns(ctx context.Context) int {
	var maxc, reserved, used int
	err := e.admin.QueryRow(ctx, `SELECT current_setting('max_connections')::int,
		current_setting('superuser_reserved_connections')::int, (SELECT count(*) FROM pg_stat_activity)`).Scan(&maxc, &reserved, &used)
	if err != nil {
		return 1 << 20
	}
	return max(1, maxc-reserved-used-10)
}

// runPgbench checks, then measures the script at one count on a fresh database.
func (e *env) runPgbench(ctx context.Context, s sqlScript, clients int, t timing) row {
	r := row{Section: "pgbench", Scenario: s.Scenario, Clients: clients}
	r.Failed = failed(fmt.Sprintf("pgbench %s c=%d", s.Path, clients), e.onRig(ctx, nil, nil, func(rg *rig, _ []*proc) (err error) {
		if err := e.checkScript(ctx, rg.conn, rg.db, s); err != nil {
			return err
		}
		c := min(clients, e.availableConns(ctx))
		// Beyond the organisation's usage slots the server's start would wait
		// for one (its slow path); the script's goes slow and writes nothing.
		if s.Slots {
			c = min(c, models.UsageSlots)
		}
		if c != clients {
			r.CappedAt = c
		}
		secs := func(d time.Duration) string { return strconv.Itoa(max(1, int(d.Round(time.Second).Seconds()))) }
		_, _, _ = e.pgbench(ctx, rg.db, s.Path, c, "-T", secs(t.Warm))
		r.RPS, r.Errors, err = e.pgbench(ctx, rg.db, s.Path, c, "-T", secs(t.Dur))
		return err
	}))
	return r
}

// pgbenchErrors is pgbench's first error lines, or its last lines if none.
func pgbenchErrors(s string) string {
	var errs []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, "error:") && len(errs) < 3 {
			errs = append(errs, strings.TrimSpace(l))
		}
	}
	if len(errs) == 0 {
		lines := strings.Split(strings.TrimSpace(s), "\n")
		errs = lines[max(0, len(lines)-4):]
	}
	return strings.Join(errs, " | ")
}
