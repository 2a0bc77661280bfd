package main

// End to end: a closed loop of new-key starts; the runs' own timestamps give
// runs finished/s. The start to final the targets judge runs from the request
// sent to the run's finished_at (the sides stamp created_at at other points).

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// e2eMode is what runs the runs: a side's processes on the rig.
type e2eMode struct {
	Name, Side string
	Procs      []string
}

var (
	modeInline   = e2eMode{"serve --worker", valrunsSide, []string{"serve --worker"}}
	modeSeparate = e2eMode{"serve + worker", valrunsSide, []string{"serve", "worker"}}
	peerInline   = e2eMode{"peer, one process", peerSide, []string{"peer --worker"}}
	peerSeparate = e2eMode{"peer + worker.js", peerSide, []string{"peer", "peer-worker"}}
	// e2ePairs: each valruns mode beside the peer's matching mode.
	e2ePairs = [][2]e2eMode{{modeInline, peerInline}, {modeSeparate, peerSeparate}}
)

func pairLabel(p [2]e2eMode) string { return fmt.Sprintf("`%s` vs %s", p[0].Name, p[1].Name) }

// e2eResult is one end-to-end loop (or the noisy neighbour's B).
type e2eResult struct {
	Mode    string
	Clients int
	Window  time.Duration
	// The 201s inside the window, their latency, the other answers.
	Answers            int
	StartP50, StartP99 time.Duration
	Errors             int // transport errors, non-2xx and unexpected answers
	Limited            int // of Errors: 429 answers (an organisation's start rate)
	// Runs created, and final, inside the window; of those created, after
	// the drain wait: final or not, and their finished_at - created_at.
	Started, Finished  int
	Final, Unfinished  int
	FinalP50, FinalP99 time.Duration
	// What a waiting client feels: from the request sent to finished_at,
	// over the runs the window's 201s named, final or not.
	WaitFinal, WaitUnfinished int
	WaitP50, WaitP99          time.Duration
	Failed                    string
}

func (r e2eResult) StartedPerSec() float64  { return perSec(r.Started, r.Window) }
func (r e2eResult) FinishedPerSec() float64 { return perSec(r.Finished, r.Window) }

// Ratio is runs finished over runs started in the window (below 1: a backlog grows).
func (r e2eResult) Ratio() float64 {
	if r.Started == 0 {
		return 0
	}
	return float64(r.Finished) / float64(r.Started)
}

// answered sets r's window and the figures of its answers from the load.
func (r *e2eResult) answered(lr loadResult, window time.Duration) {
	r.Window, r.Answers = window, lr.Requests
	r.StartP50, r.StartP99 = lr.Percentile(.5), lr.Percentile(.99)
	r.Errors, r.Limited = lr.Errors+lr.Non2xx+lr.Unexpected, lr.Statuses[http.StatusTooManyRequests]
}

// measureE2ECurve runs the loops: at each count each valruns mode, then the peer's.
func measureE2ECurve(ctx context.Context, e *env, p plan) (out []e2eResult) {
	turns(ctx, p.E2ELevels, 1, slices.Concat(e2ePairs[0][:], e2ePairs[1][:]), func(m e2eMode, n, _ int) {
		r := e.measureE2E(ctx, m, n, p.E2E, p.E2E.Dur+30*time.Second)
		out = append(out, r)
		say("e2e %-18s c=%-3d %5.0f started/s %5.0f finished/s, start to final p50 / p99 %s ms, %d not final",
			r.Mode, r.Clients, r.StartedPerSec(), r.FinishedPerSec(), waitCell(r), r.WaitUnfinished)
	})
	return out
}

// turns calls f with each mode at each count, rounds times (from 1), until ctx ends.
func turns(ctx context.Context, counts []int, rounds int, modes []e2eMode, f func(m e2eMode, clients, round int)) {
	for _, n := range counts {
		for round := 1; round <= max(rounds, 1); round++ {
			for _, m := range modes {
				if ctx.Err() != nil {
					return
				}
				f(m, n, round)
			}
		}
	}
}

// measureE2E runs the closed loop in mode m (extra: its settings), then
// waits up to drainWait for the window's runs to end, and reads their times.
func (e *env) measureE2E(ctx context.Context, m e2eMode, clients int, t timing, drainWait time.Duration, extra ...string) e2eResult {
	r := e2eResult{Mode: m.Name, Clients: clients}
	r.Failed = failed("e2e "+m.Name, e.loop(ctx, m, clients, t, false, extra, func(rg *rig, w window) error {
		r.answered(w.load, w.to.Sub(w.from))
		if w.noRun > 0 {
			return fmt.Errorf("%d of the 2xx answers named no run id", w.noRun)
		}
		err := rg.conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE created_at >= $1 AND created_at < $2),
			count(*) FILTER (WHERE finished_at >= $1 AND finished_at < $2) FROM validation_runs`, w.from, w.to).Scan(&r.Started, &r.Finished)
		// The drain: the window's runs end after the load has stopped.
		if err == nil {
			err = e2eTimes(ctx, rg.conn, w.from, w.to, "", drainWait, &r)
		}
		if err != nil {
			return err
		}
		finished, err := finishedAt(ctx, rg.conn, w.runs)
		waitTimes(w.runs, finished, &r)
		return err
	}))
	return r
}

// sentRun is a run the window's load named: when its start was sent, and
// in the long poll when its final answer was read and the reads it took.
type sentRun struct {
	ID             string
	Sent, Answered time.Time
	Reads          int
}

// loopClient is one load client's runs, touched only from its goroutine.
type loopClient struct {
	run   sentRun // the run being read ("" ID: the next request is a start)
	done  []sentRun
	noRun int // 2xx answers naming no run, or not the run being read
}

// finalStatus: a run in one of these is final.
var finalStatus = map[string]bool{"passed": true, "failed": true, "error": true}

// follow is the load's Follow: a start's answer names its run; with poll
// a read's says whether the run is final. A run whose last answer (the
// start's, or the final read's) fell in the window is kept.
func (w *loopClient) follow(a answer, poll bool) {
	var run struct{ ID, Status string }
	_ = json.Unmarshal(a.Body, &run)
	if run.ID == "" || (w.run.ID != "" && run.ID != w.run.ID) {
		w.noRun++
		return
	}
	if w.run.ID == "" {
		w.run = sentRun{ID: run.ID, Sent: a.Sent}
	} else {
		w.run.Reads++
	}
	if poll && !finalStatus[run.Status] {
		return
	}
	if a.InWindow {
		w.run.Answered = a.Answered
		w.done = append(w.done, w.run)
	}
	w.run = sentRun{}
}

// window is a closed loop's measured window: the load, its bounds on the
// database's clock (the runs' own), the runs kept and the answers naming no run.
type window struct {
	load     loadResult
	from, to time.Time
	runs     []sentRun
	noRun    int
}

// loop runs clients in a closed loop of new-key starts of orgs[0] (with
// poll, each run read with `Prefer: wait=10` until final) on a rig running
// m's processes (extra: their settings), and hands the window to read.
func (e *env) loop(ctx context.Context, m e2eMode, clients int, t timing, poll bool, extra []string, read func(*rig, window) error) error {
	return e.onRig(ctx, m.Procs, extra, func(rg *rig, _ []*proc) error {
		token := e.orgs[0].Token // none for the peer, which has no authentication
		if m.Side == peerSide {
			token = ""
		}
		starts, cs := newKeys(rg.base, e.orgs[0], token), make([]loopClient, clients)
		next := func(c, i int) request {
			if id := cs[c].run.ID; id != "" {
				h := headerFor(token, "")
				h.Set("Prefer", "wait=10")
				return request{http.MethodGet, rg.base + "/api/runs/" + id + "/", h, nil}
			}
			return starts(c, i)
		}
		clock := &dbClock{ctx: ctx, conn: rg.conn}
		w := window{load: runLoad(ctx, clients, t.Warm, t.Dur, next, loadOptions{OnWindow: clock.window, Follow: func(a answer) { cs[a.Client].follow(a, poll) }})}
		if err := cmp.Or(clock.err, rg.exited()); err != nil {
			return err // a process that ended spoils the window
		}
		for _, c := range cs {
			w.runs, w.noRun = append(w.runs, c.done...), w.noRun+c.noRun
		}
		w.from, w.to = clock.from, clock.to
		return read(rg, w)
	})
}

// dbClock is an OnWindow of runLoad that reads the database's clock when
// the window opens and when it closes; a failure is kept in err.
type dbClock struct {
	ctx      context.Context
	conn     *pgx.Conn
	from, to time.Time
	err      error
}

func (c *dbClock) window(open bool) {
	at := &c.to
	if open {
		at = &c.from
	}
	c.err = cmp.Or(c.err, c.conn.QueryRow(c.ctx, `SELECT clock_timestamp()`).Scan(at))
}

// finishedAt is the finished_at of each of runs that has one, by run id.
func finishedAt(ctx context.Context, conn *pgx.Conn, runs []sentRun) (map[string]time.Time, error) {
	ids := make([]string, len(runs))
	for i, x := range runs {
		ids[i] = x.ID
	}
	rows, _ := conn.Query(ctx, `SELECT id::text, finished_at FROM validation_runs WHERE id = ANY($1::uuid[]) AND finished_at IS NOT NULL`, ids)
	finished := map[string]time.Time{}
	var id string
	var at time.Time
	_, err := pgx.ForEachRow(rows, []any{&id, &at}, func() error {
		finished[id] = at
		return nil
	})
	return finished, err
}

// waitTimes sets r's client-felt start to final, from each request sent to
// its run's finished_at (one clock), over the runs final; the others counted.
func waitTimes(runs []sentRun, finished map[string]time.Time, r *e2eResult) {
	var waits []time.Duration
	for _, x := range runs {
		if at, ok := finished[x.ID]; ok {
			waits = append(waits, at.Sub(x.Sent))
		}
	}
	slices.Sort(waits)
	r.WaitFinal, r.WaitUnfinished = len(waits), len(runs)-len(waits)
	r.WaitP50, r.WaitP99 = percentile(waits, .5), percentile(waits, .99)
}

// e2eTimes waits up to wait for org's runs created in [from, to) ("": all)
// to be final, then reads how many are and their finished_at - created_at.
func e2eTimes(ctx context.Context, conn *pgx.Conn, from, to time.Time, org string, wait time.Duration, r *e2eResult) error {
	const window = ` FROM validation_runs WHERE created_at >= $1 AND created_at < $2 AND ($3 = '' OR org_id::text = $3)`
	for deadline := time.Now().Add(wait); ; time.Sleep(200 * time.Millisecond) {
		if err := conn.QueryRow(ctx, `SELECT count(*)`+window+` AND finished_at IS NULL`, from, to, org).Scan(&r.Unfinished); err != nil {
			return err
		}
		if r.Unfinished == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
	}
	var p50, p99 float64
	err := conn.QueryRow(ctx, `SELECT count(finished_at),
		coalesce(percentile_disc(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - created_at)), 0),
		coalesce(percentile_disc(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - created_at)), 0)`+window+` AND finished_at IS NOT NULL`,
		from, to, org).Scan(&r.Final, &p50, &p99)
	r.FinalP50, r.FinalP99 = time.Duration(p50*float64(time.Second)), time.Duration(p99*float64(time.Second))
	return err
}

// e2eAt is the measured loop of mode at clients (nil: not run, or failed).
func (r *results) e2eAt(mode string, clients int) *e2eResult {
	return find(r.E2E, func(x e2eResult) bool { return x.Mode == mode && x.Clients == clients && x.Failed == "" })
}

// e2eChecks are the end-to-end targets: runs finished/s at least 1.5x the
// peer's at 8 and 32 clients and valruns' finished at least 0.95x its
// started at every count; the client-felt start to final p50 at most the
// peer's and p99 at most 2x at 1, 8 and 32.
func (r *results) e2eChecks() []check {
	var out []check
	counts := curveCounts(makePlan(false).E2ELevels, r.E2E, func(x e2eResult) int { return x.Clients })
	for _, p := range e2ePairs {
		for _, n := range counts {
			v, peer := r.e2eAt(p[0].Name, n), r.e2eAt(p[1].Name, n)
			c := check{Name: fmt.Sprintf("e2e runs finished/s, %s, %s", pairLabel(p), clientsText(n)), Target: "finished >= 0.95x started"}
			if v == nil {
				out = append(out, notMeasured(c))
				continue
			}
			c.Measured, c.Pass = fmt.Sprintf("finished / started %.2f", v.Ratio()), v.Ratio() >= 0.95
			if n == 8 || n == 32 {
				c.Target = ">= 1.5x the peer, " + c.Target
				pf := 0.0
				if peer != nil {
					pf = peer.FinishedPerSec()
				}
				vs := ratio(c, peer != nil, v.FinishedPerSec(), pf, 1.5, false, fmt.Sprintf("%.0f / %.0f runs/s", v.FinishedPerSec(), pf))
				vs.Measured, vs.Pass = vs.Measured+", "+c.Measured, vs.Pass && c.Pass
				c = vs
			}
			out = append(out, c)
		}
	}
	for _, p99 := range []bool{false, true} {
		what, most := "p50", 1.0
		if p99 {
			what, most = "p99", 2.0
		}
		for _, p := range e2ePairs {
			for _, n := range counts {
				if n != 1 && n != 8 && n != 32 {
					continue
				}
				c := check{Name: fmt.Sprintf("e2e start-to-final %s, %s, %s", what, pairLabel(p), clientsText(n)), Target: "<= " + times(most) + " the peer's"}
				a, b := waitOf(r.e2eAt(p[0].Name, n), p99), waitOf(r.e2eAt(p[1].Name, n), p99)
				out = append(out, ratio(c, a > 0 && b > 0, float64(a), float64(b), most, true, fmt.Sprintf("%s / %s ms", ms(a), ms(b))))
			}
		}
	}
	return out
}

// waitOf is a loop's client-felt start to final, p50 or p99 (0: none or unmeasured).
func waitOf(r *e2eResult, p99 bool) time.Duration {
	switch {
	case r == nil || r.WaitFinal == 0:
		return 0
	case p99:
		return r.WaitP99
	}
	return r.WaitP50
}

// e2eSection is end to end: the targets, and one row per loop.
func (r *results) e2eSection() section {
	var b strings.Builder
	b.WriteString("| clients | mode | runs finished/s | finished / started | start to final p50 / p99 ms | timestamps p50 ms | not final |\n|---|---|---|---|---|---|---|\n")
	for _, x := range r.E2E {
		if x.Failed != "" {
			fmt.Fprintf(&b, "| %d | %s | FAILED: %s | | | | |\n", x.Clients, x.Mode, cell(short(x.Failed, 300)))
			continue
		}
		fmt.Fprintf(&b, "| %d | %s | %.0f | %.2f | %s | %s | %d |\n", x.Clients, x.Mode, x.FinishedPerSec(), x.Ratio(), waitCell(x), ms(x.FinalP50), x.WaitUnfinished)
	}
	intro := fmt.Sprintf("A closed loop of new-key starts (%s warm-up, %s measured, a fresh database each), each valruns mode beside the peer's matching mode, "+
		"back to back; then the harness waits for the window's runs to end. Runs finished/s come from the runs' own timestamps. "+
		"Start to final, which the targets judge, runs from the request sent to the run's finished_at: what a waiting client feels. "+
		"\"timestamps\" (finished_at - created_at) start at different points: the peer stamps created_at in its INSERT, after its middleware, "+
		"its idempotency library's Redis calls and its pool wait, valruns when it reads the request. Runs not final when the harness stopped waiting "+
		"are counted (then the p99 is a floor). The peer's worker (ajv, no CEL) writes status, times and findings in one statement.",
		r.E2ETiming.Warm, r.E2ETiming.Dur)
	return section{Heading: "## The curve: end to end", Intro: intro, Checks: r.e2eChecks(), Body: b.String()}
}

// waitCell is the client-felt start to final, p50 / p99, or "-".
func waitCell(r e2eResult) string {
	if r.WaitFinal == 0 {
		return "-"
	}
	return ms(r.WaitP50) + " / " + ms(r.WaitP99)
}

// The long poll: each client starts a run and reads it with `Prefer: wait=10`
// until final; the gap from finished_at to that answer says if it waited for a tick.

// waitResult is one round of one side at one count.
type waitResult struct {
	Side    string // valruns, peer
	Clients int
	Round   int // from 1
	Window  time.Duration
	// Runs whose final answer was read in the window; their start to answer
	// (the start sent to the final answer read), and their reads (GETs) per run.
	Runs        int
	P50, P99    time.Duration
	ReadsPerRun float64
	Errors      int // transport errors, non-2xx, answers naming no run
	// Within5 are the runs answered within 5 ms of their finished_at (a
	// run with none is not); the gap answer - finished_at, p50 and p99.9.
	Within5         int
	GapP50, GapP999 time.Duration
	Failed          string
}

func (w waitResult) RunsPerSec() float64 { return perSec(w.Runs, w.Window) }

// measureWait runs the long poll: at each count, rounds of valruns then the peer.
func measureWait(ctx context.Context, e *env, p plan) (out []waitResult) {
	turns(ctx, p.WaitLevels, p.WaitRounds, e2ePairs[1][:], func(m e2eMode, n, round int) {
		r := waitResult{Side: m.Side, Clients: n, Round: round}
		// No answer may be an error or name no run; then the runs' finished_at.
		r.Failed = failed("wait "+r.Side, e.loop(ctx, m, n, p.Wait, true, nil, func(rg *rig, w window) error {
			l := w.load
			r.Window, r.Errors = l.Duration, w.noRun+l.Errors+l.Non2xx+l.Unexpected
			if r.Errors > 0 {
				return fmt.Errorf("%d answers were errors or named no run (first error: %s, non-2xx: %v)", r.Errors, l.FirstError, l.Statuses)
			}
			finished, err := finishedAt(ctx, rg.conn, w.runs)
			r.tally(w.runs, finished)
			return err
		}))
		out = append(out, r)
		say("wait %-8s c=%-3d round %d: %5.0f runs/s, start to answer p50 / p99 %s / %s ms, %d of %d answered within 5 ms of finished_at",
			r.Side, n, round, r.RunsPerSec(), ms(r.P50), ms(r.P99), r.Within5, r.Runs)
	})
	return out
}

// tally sets r's figures from its runs and their finished_at (by run id):
// start to answer over every run, the gap over those with a finished_at.
func (r *waitResult) tally(runs []sentRun, finished map[string]time.Time) {
	var took, gaps []time.Duration
	reads := 0
	for _, x := range runs {
		took, reads = append(took, x.Answered.Sub(x.Sent)), reads+x.Reads
		if at, ok := finished[x.ID]; ok {
			gap := x.Answered.Sub(at)
			gaps = append(gaps, gap)
			if gap <= 5*time.Millisecond {
				r.Within5++
			}
		}
	}
	slices.Sort(took)
	slices.Sort(gaps)
	r.Runs = len(runs)
	r.P50, r.P99 = percentile(took, .5), percentile(took, .99)
	r.GapP50, r.GapP999 = percentile(gaps, .5), percentile(gaps, .999)
	if len(runs) > 0 {
		r.ReadsPerRun = float64(reads) / float64(len(runs))
	}
}

// waitAt are the rounds of side at clients, in order.
func (r *results) waitAt(side string, clients int) []waitResult {
	return slices.DeleteFunc(slices.Clone(r.Wait), func(x waitResult) bool { return x.Side != side || x.Clients != clients })
}

// waitChecks are the long poll's targets (issue 48) at 1 and 8 clients
// and any other count measured: valruns' answer within 5 ms of the run's
// finished_at for at least 99.9% of its runs, over its rounds; its start
// to answer p99 at most 1.5x the peer's, in every round.
func (r *results) waitChecks() []check {
	var out []check
	for _, n := range curveCounts(makePlan(false).WaitLevels, r.Wait, func(x waitResult) int { return x.Clients }) {
		vs, peers := r.waitAt("valruns", n), r.waitAt("peer", n)
		c := check{Name: "long-poll answer within 5 ms of the final commit, " + clientsText(n), Target: ">= 99.9% of runs"}
		within, runs := 0, 0
		for _, v := range vs {
			within, runs = within+v.Within5, runs+v.Runs
			if v.Failed != "" {
				runs = 0
				break
			}
		}
		share := 100 * float64(within) / float64(runs)
		c.Measured, c.Pass = fmt.Sprintf("%s%% of %d runs (%s)", ratioText(share, 99.9), runs, plural(len(vs), "round")), share >= 99.9
		if runs == 0 {
			c = notMeasured(c)
		}
		out = append(out, c, waitP99Check(n, vs, peers))
	}
	return out
}

// waitP99Check is the p99 target at n clients, each valruns round beside the
// peer's of the same number: not measured if one is missing or failed.
func waitP99Check(n int, vs, peers []waitResult) check {
	c := check{Name: "long-poll start-to-answer p99, valruns vs the peer, " + clientsText(n), Target: "<= 1.5x the peer's, every round"}
	if len(vs) == 0 || len(vs) != len(peers) {
		return notMeasured(c)
	}
	var each []string
	c.Pass = true
	for i, v := range vs {
		p := peers[i]
		ok := v.Failed == "" && p.Failed == "" && v.Runs > 0 && p.Runs > 0 && v.Round == p.Round
		one := ratio(check{}, ok, float64(v.P99), float64(p.P99), 1.5, true, fmt.Sprintf("%s / %s ms", ms(v.P99), ms(p.P99)))
		if one.Missing {
			return notMeasured(c)
		}
		c.Pass = c.Pass && one.Pass
		each = append(each, fmt.Sprintf("round %d %s", v.Round, one.Measured))
	}
	c.Measured = strings.Join(each, "; ")
	return c
}

// waitSection is the long poll: the targets, and one row per round and side.
func (r *results) waitSection() section {
	var b strings.Builder
	b.WriteString("| clients | round | side | runs/s | start to answer p50 / p99 ms | reads per run | answered within 5 ms of finished_at | gap p50 / p99.9 ms |\n|---|---|---|---|---|---|---|---|\n")
	for _, x := range r.Wait {
		if x.Failed != "" {
			fmt.Fprintf(&b, "| %d | %d | %s | FAILED: %s | | | | |\n", x.Clients, x.Round, x.Side, cell(short(x.Failed, 300)))
			continue
		}
		share := "-"
		if x.Runs > 0 {
			share = fmt.Sprintf("%.2f%% (%d of %d)", 100*float64(x.Within5)/float64(x.Runs), x.Within5, x.Runs)
		}
		fmt.Fprintf(&b, "| %d | %d | %s | %.0f | %s / %s | %.2f | %s | %s / %s |\n",
			x.Clients, x.Round, x.Side, x.RunsPerSec(), ms(x.P50), ms(x.P99), x.ReadsPerRun, share, ms(x.GapP50), ms(x.GapP999))
	}
	intro := fmt.Sprintf("Each client starts a run with a new key, reads it with `Prefer: wait=10` until it is final, then starts the next "+
		"(%s warm-up, %s measured, a fresh database each); valruns (`serve` + `worker`) beside the peer (server.js + worker.js, its read waiting "+
		"with BullMQ's QueueEvents and `job.waitUntilFinished`), in rounds, in turn. A run counts when its final answer was read in the window; "+
		"start to answer runs from the start sent to that answer. The gap is that answer less the run's finished_at (read from PostgreSQL "+
		"after the window): finished_at is the final transaction's now(), taken before its commit, so the gap slightly over-counts; "+
		"one clock on one machine. The 5 ms target pools valruns' rounds; the peer's gap is shown, not judged.",
		r.WaitTiming.Warm, r.WaitTiming.Dur)
	return section{Heading: "## Long poll: start to final answer", Intro: intro, Checks: r.waitChecks(), Body: b.String()}
}
