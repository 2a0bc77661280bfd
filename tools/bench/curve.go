package main

// The start curve: starts without a key, with a new key and replays at
// every client count, valruns beside the peer (each on a fresh database,
// in rounds, in turn), and the database's limit at the same count
// (pgbench), one table per scenario with the targets at each count. A
// count that was not measured says so; it is never a PASS.

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// kind is what the load sends.
type kind int

const (
	noKey  kind = iota // starts without Idempotency-Key
	newKey             // a key never used before, per request
	replay             // each client re-sends its one finished key
)

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

const curveHeading = "## The curve: starts"

// row is one measured run: a start scenario at a count, or pgbench.
type row struct {
	Section  string // valruns, peer, pgbench
	Scenario string
	Clients  int
	RPS      float64
	P50      time.Duration
	P99      time.Duration
	P999     time.Duration
	Errors   int // transport errors
	Non2xx   int
	Unexpect int
	// CPUPerReq is the server process's CPU time per completed request.
	CPUPerReq time.Duration
	PeakRSSKB int64
	Notes     []string
	// CappedAt: pgbench ran with this many clients, fewer than Clients.
	CappedAt int
	Failed   string // the run could not be made
}

// timing is how long to warm up and measure.
type timing struct {
	Warm, Dur time.Duration
}

// mergeRounds is one row for a scenario's rounds at one count: rps,
// latencies and CPU are their means, peak RSS the largest, errors their
// sums, and the notes the first round's, after each round's rps. A round
// that failed fails the row: a mean never hides a failed run.
func mergeRounds(rs []row) row {
	if len(rs) == 1 {
		return rs[0]
	}
	m := rs[0]
	rps := make([]string, len(rs))
	var p50, p99, p999, cpu time.Duration
	m.RPS = 0
	for i, r := range rs {
		if r.Failed != "" {
			m.Failed = fmt.Sprintf("round %d of %d: %s", i+1, len(rs), r.Failed)
			return m
		}
		rps[i] = fmt.Sprintf("%.0f", r.RPS)
		m.RPS += r.RPS / float64(len(rs))
		p50, p99, p999, cpu = p50+r.P50, p99+r.P99, p999+r.P999, cpu+r.CPUPerReq
		if i > 0 {
			m.Errors, m.Non2xx, m.Unexpect = m.Errors+r.Errors, m.Non2xx+r.Non2xx, m.Unexpect+r.Unexpect
			m.PeakRSSKB = max(m.PeakRSSKB, r.PeakRSSKB)
		}
	}
	n := time.Duration(len(rs))
	m.P50, m.P99, m.P999, m.CPUPerReq = p50/n, p99/n, p999/n, cpu/n
	m.Notes = append([]string{fmt.Sprintf("mean of %d rounds: %s rps", len(rs), strings.Join(rps, ", "))}, rs[0].Notes...)
	return m
}

// startStep is one run of the curve, not yet made.
type startStep struct {
	Section, Scenario string
	run               func() row
}

// startSteps are the runs at one client count, in the order they run:
// each scenario on valruns then on the peer, p.Rounds times (valruns, peer,
// valruns, peer), and after the new-key starts the pgbench limit (the
// peer's INSERT) and valruns' start statement. Nothing runs until a step's
// run is called.
func startSteps(ctx context.Context, e *env, p plan, clients int) []startStep {
	var steps []startStep
	for _, sc := range startCurve {
		for range max(p.Rounds, 1) {
			for _, side := range []string{"valruns", "peer"} {
				if p.want(side) {
					steps = append(steps, startStep{side, sc.Name, func() row { return e.runHTTP(ctx, sc, side == "peer", clients, p.HTTP) }})
				}
			}
		}
		if sc.Kind == newKey && p.want("pgbench") {
			for _, s := range []sqlScript{peerSQL, startSQL} {
				steps = append(steps, startStep{"pgbench", s.Scenario, func() row { return e.runPgbench(ctx, s, clients, p.PG) }})
			}
		}
	}
	return steps
}

// measureCurve runs the curve's steps at each count and records one row
// per scenario and side: the merge of its rounds.
func measureCurve(ctx context.Context, e *env, p plan, res *results) error {
	for _, c := range p.Levels {
		var order []string
		rounds := map[string][]row{}
		for _, step := range startSteps(ctx, e, p, c) {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			r := step.run()
			progress(r)
			k := step.Section + "\x00" + step.Scenario
			if rounds[k] == nil {
				order = append(order, k)
			}
			rounds[k] = append(rounds[k], r)
		}
		for _, k := range order {
			res.Rows = append(res.Rows, mergeRounds(rounds[k]))
		}
	}
	return nil
}

func progress(r row) {
	if r.Failed != "" {
		say("%-8s %-16s c=%-3d FAILED: %s", r.Section, r.Scenario, r.Clients, short(r.Failed, 200))
		return
	}
	bad := ""
	if n := r.Errors + r.Non2xx + r.Unexpect; n > 0 {
		bad = fmt.Sprintf("  ERRORS %d/%d/%d", r.Errors, r.Non2xx, r.Unexpect)
	}
	say("%-8s %-16s c=%-3d %8.0f rps  p50 %6s  p99 %7s ms%s", r.Section, r.Scenario, r.Clients, r.RPS, ms(r.P50), ms(r.P99), bad)
}

// headerFor is the header of a request with token and key ("" for none).
func headerFor(token, key string) http.Header {
	h := http.Header{"Content-Type": {"application/json"}}
	if token != "" {
		h.Set("Authorization", "Bearer "+token)
	}
	if key != "" {
		h.Set("Idempotency-Key", key)
	}
	return h
}

// runHTTP measures one scenario of valruns (or the peer) at one
// concurrency on a fresh database.
func (e *env) runHTTP(ctx context.Context, sc curveScenario, peer bool, clients int, t timing) row {
	r := row{Section: "valruns", Scenario: sc.Name, Clients: clients}
	if peer {
		r.Section = "peer"
	}
	fail := func(err error) row {
		r.Failed = err.Error()
		fmt.Fprintf(os.Stderr, "bench: %s %s c=%d: %v\n", r.Section, sc.Name, clients, err)
		return r
	}
	db, err := e.fresh(ctx)
	if err != nil {
		return fail(err)
	}
	defer func() { _ = e.dropDB(ctx, db) }()
	var srv *proc
	var base string
	if peer {
		srv, base, err = e.startPeer(ctx, e.dbURL(db), false)
	} else {
		srv, base, err = e.startServer(ctx, e.dbURL(db), false)
	}
	if err != nil {
		return fail(err)
	}
	defer srv.Stop(20 * time.Second)
	next, check, err := e.requests(ctx, sc.Kind, peer, base, clients)
	if err != nil {
		return fail(err)
	}
	m := &usageMeter{pid: srv.Pid()}
	res := runLoad(ctx, clients, t.Warm, t.Dur, next, check, nil, m.window)
	if srv.Exited() {
		return fail(fmt.Errorf("the server exited during the run: %v\n%s", srv.err, srv.Tail()))
	}
	r.fill(res, m)
	return r
}

// fill sets the row's figures from a window, and the server's CPU per
// request and peak memory from m, measured over the same window.
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
	if m != nil && res.Requests > 0 {
		r.CPUPerReq = m.usage.CPU / time.Duration(res.Requests)
		r.PeakRSSKB = m.usage.PeakRSS
	}
}

// requests builds what each client sends in a scenario, and sends the
// first request of the keys a replay re-sends.
func (e *env) requests(ctx context.Context, k kind, peer bool, base string, clients int) (requestFunc, checkFunc, error) {
	org := e.orgs[0]
	token := org.Token
	if peer {
		token = "" // the peer has no authentication
	}
	body := []byte(startBody)
	url := base + org.startPath()
	run := time.Now().UnixNano()
	check := func(replayed bool) checkFunc {
		if peer {
			return nil // express-idempotency marks no replay; its status is all there is to check
		}
		return func(resp *http.Response) string {
			switch got := resp.Header.Get("Idempotent-Replayed") == "true"; {
			case got && !replayed:
				return "a new key was answered as a replay"
			case !got && replayed:
				return "a finished key was executed again (no Idempotent-Replayed: true)"
			}
			return ""
		}
	}
	switch k {
	case noKey:
		h := headerFor(token, "")
		return func(c, i int) request { return request{http.MethodPost, url, h, body} }, check(false), nil
	case newKey:
		return func(c, i int) request {
			return request{http.MethodPost, url, headerFor(token, fmt.Sprintf("new-%d-%d-%d", run, c, i)), body}
		}, check(false), nil
	}
	hs := make([]http.Header, clients)
	for c := range clients {
		hs[c] = headerFor(token, fmt.Sprintf("replay-%d-%d", run, c))
	}
	if err := sendAll(ctx, url, body, hs, 8); err != nil {
		return nil, nil, err
	}
	return func(c, i int) request { return request{http.MethodPost, url, hs[c], body} }, check(true), nil
}

// sendAll sends one start with each header, clients at once, each
// answered 201 (sendOnce).
func sendAll(ctx context.Context, url string, body []byte, hs []http.Header, clients int) error {
	hc := newHTTPClient(clients)
	defer hc.CloseIdleConnections()
	var (
		wg    sync.WaitGroup
		next  atomic.Int64
		mu    sync.Mutex
		first error
	)
	for range min(clients, len(hs)) {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < len(hs); i = int(next.Add(1) - 1) {
				if err := sendOnce(ctx, hc, url, body, hs[i]); err != nil {
					mu.Lock()
					first = cmp.Or(first, err)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	return first
}

// sendOnce sends a start until it is answered 201: a 503 (the box too busy
// to hand out a connection in time), a 409 (its own retry still in flight)
// or a 429 (the organisation's start rate, which stores nothing) is retried
// with the same key after Retry-After (at most 2 s; else 200 ms), as a
// client would.
func sendOnce(ctx context.Context, hc *http.Client, url string, body []byte, h http.Header) error {
	for try := 1; ; try++ {
		r, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
		if err != nil {
			return err
		}
		r.Header = h.Clone()
		resp, err := hc.Do(r)
		if err != nil {
			return err
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusCreated:
			return nil
		case http.StatusServiceUnavailable, http.StatusConflict, http.StatusTooManyRequests:
			if try < 20 {
				wait := 200 * time.Millisecond
				if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
					wait = min(time.Duration(s)*time.Second, 2*time.Second)
				}
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(wait):
				}
				continue
			}
		}
		return fmt.Errorf("first request of a key: %d %s", resp.StatusCode, short(string(b), 200))
	}
}

// goal is one of the curve's targets at one client count.
type goal struct {
	Ratio float64 // valruns over the peer, at least (0: no target)
	P50   bool    // and valruns' p50 at most the peer's
}

// startGoal is the target of a start scenario at clients (issue 30).
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

func clientsText(n int) string {
	if n == 1 {
		return "1 client"
	}
	return fmt.Sprintf("%d clients", n)
}

// startCheck is the target of scenario sc at clients, from the runs found
// (nil: not measured); false when the count has no target.
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

// limitAt is the pgbench limit at clients: the peer's INSERT.
func (r *results) limitAt(clients int) *row { return r.rowAt("pgbench", pgbenchPeerScenario, clients) }

// curveCounts are the counts a table lists: the full curve's, and any
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

// curveRan are the counts at which a start run ran (failed or not).
func (r *results) curveRan() []int {
	var ns []int
	for _, x := range r.Rows {
		if x.Section != "pgbench" {
			ns = append(ns, x.Clients)
		}
	}
	return ns
}

// fullCurve is the full plan's counts: the tables list each of them.
var fullCurve = makePlan(false).Levels

// curveChecks are the curve's targets at every count that has one, and
// new-key starts beside no-key starts at 32 clients.
func (r *results) curveChecks() []check {
	var out []check
	for _, sc := range startCurve {
		for _, n := range curveCounts(fullCurve, r.curveRan()...) {
			if c, ok := startCheck(sc, n, r.rowAt("valruns", sc.Name, n), r.rowAt("peer", sc.Name, n)); ok {
				out = append(out, c)
			}
		}
	}
	c := check{Name: "start, new key vs start, no key, 32 clients (valruns)", Target: ">= 0.8x"}
	none, keyed := r.rowAt("valruns", startCurve[0].Name, 32), r.rowAt("valruns", startCurve[1].Name, 32)
	if !measured(none) || !measured(keyed) || none.RPS == 0 {
		return append(out, notMeasured(c))
	}
	c.Measured = fmt.Sprintf("%sx (%.0f / %.0f rps)", ratioText(keyed.RPS/none.RPS, 0.8), keyed.RPS, none.RPS)
	c.Pass = keyed.RPS/none.RPS >= 0.8
	return append(out, c)
}

// curveSection is the start curve: one table per scenario.
func (r *results) curveSection() section {
	var b strings.Builder
	fmt.Fprintf(&b, "Each scenario at every client count, `valruns serve` beside the peer, back to back at each count "+
		"(%s warm-up, %s measured, a fresh database each; in rounds, valruns and the peer in turn: a row is the rounds' mean), "+
		"and the database's limit at the same count: pgbench of the peer's one `INSERT` (`%s`), %s measured; "+
		"\"own SQL\" is pgbench of valruns' start statements (`%s`, 1 organisation). pgbench runs with `-M prepared`, its connections capped by "+
		"`max_connections` and, for valruns' statements, by the organisation's usage slots (shown when they were).\n",
		r.Timing.Warm, r.Timing.Dur, peerScript, r.PgTiming.Dur, startScript)
	counts := curveCounts(fullCurve, r.curveRan()...)
	for _, sc := range startCurve {
		fmt.Fprintf(&b, "\n### %s\n\n", sc.Title)
		b.WriteString("| clients | valruns rps | peer rps | valruns / peer | limit: pgbench of the peer's INSERT, tps | valruns / limit | own SQL, tps | valruns p50 / p99 ms | peer p50 / p99 ms | target | result |\n")
		b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, n := range counts {
			v, p, lim := r.rowAt("valruns", sc.Name, n), r.rowAt("peer", sc.Name, n), r.limitAt(n)
			c, has := startCheck(sc, n, v, p)
			fmt.Fprintf(&b, "| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", n, rpsCell(v), rpsCell(p),
				fraction(rpsOf(v), rpsOf(p), measured(v) && measured(p)), limitCell(lim),
				fraction(rpsOf(v), rpsOf(lim), measured(v) && measured(lim)), limitCell(r.rowAt("pgbench", pgbenchStartScenario, n)),
				latCell(v), latCell(p), verdictCells(c, has, v != nil || p != nil))
		}
	}
	return section{Heading: curveHeading, Body: b.String(), Checks: r.curveChecks()}
}

// rpsCell is a run's rate, "not measured" (not run) or "FAILED".
func rpsCell(x *row) string {
	switch {
	case x == nil:
		return "not measured"
	case x.Failed != "":
		return "FAILED"
	}
	return fmt.Sprintf("%.0f", x.RPS)
}

func rpsOf(x *row) float64 {
	if x == nil {
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

// limitCell is a pgbench run's tps, with its connections when capped.
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
