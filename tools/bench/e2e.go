package main

// End to end: a closed loop of new-key starts, then the runs' own
// timestamps say how many runs finished per second and how long a run
// took from created_at to finished_at. The start to final a waiting client
// feels, which the targets judge, runs from when the harness sent the
// request to the run's finished_at: the two sides stamp created_at at
// different points. The long poll (wait.go) is the same loop with each
// start's run read until it is final.

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

// e2eMode is what runs the runs: the rig's processes.
type e2eMode struct {
	Name  string
	Procs []string
}

var (
	modeInline   = e2eMode{"serve --worker", []string{"serve --worker"}}
	modeSeparate = e2eMode{"serve + worker", []string{"serve", "worker"}}
	peerInline   = e2eMode{"peer, one process", []string{"peer --worker"}}
	peerSeparate = e2eMode{"peer + worker.js", []string{"peer", "peer-worker"}}
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

// measureE2ECurve runs the loops: at each count, each valruns mode then
// the peer's matching mode, back to back.
func measureE2ECurve(ctx context.Context, e *env, p plan) []e2eResult {
	var out []e2eResult
	for _, n := range p.E2ELevels {
		for _, pair := range e2ePairs {
			for _, m := range pair {
				if ctx.Err() != nil {
					return out
				}
				r := e.measureE2E(ctx, m, n, p.E2E, p.E2E.Dur+30*time.Second)
				out = append(out, r)
				say("e2e %-18s c=%-3d %5.0f started/s %5.0f finished/s, start to final p50 / p99 %s ms, %d not final",
					r.Mode, r.Clients, r.StartedPerSec(), r.FinishedPerSec(), waitCell(r), r.WaitUnfinished)
			}
		}
	}
	return out
}

// measureE2E runs the closed loop of new-key starts of orgs[0] in mode m
// for t, then waits up to drainWait for the window's runs to end, and
// reads their times. extra are settings of the processes.
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
	poll  bool    // read each run until it is final before the next start
	run   sentRun // the run being read ("" ID: the next request is a start)
	done  []sentRun
	noRun int // 2xx answers naming no run, or not the run being read
}

// finalStatus: a run in one of these is final.
var finalStatus = map[string]bool{"passed": true, "failed": true, "error": true}

// follow is the load's Follow: a start's answer names its run; in the
// long poll a read's says whether the run is final. A run whose last
// answer (the start's, or the final read's) fell in the window is kept.
func (w *loopClient) follow(a answer) {
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
	if w.poll && !finalStatus[run.Status] {
		return
	}
	if a.InWindow {
		w.run.Answered = a.Answered
		w.done = append(w.done, w.run)
	}
	w.run = sentRun{}
}

// window is a closed loop's measured window: the load, its bounds on the
// database's clock (the runs' timestamps are read from it), the runs kept
// and the answers that named no run.
type window struct {
	load     loadResult
	from, to time.Time
	runs     []sentRun
	noRun    int
}

// loop runs clients in a closed loop of new-key starts of orgs[0] (with
// poll, each followed by reads of its run with `Prefer: wait=10` until it
// is final) on a rig running m's processes (extra: their settings), then
// hands the window to read while the rig still runs.
func (e *env) loop(ctx context.Context, m e2eMode, clients int, t timing, poll bool, extra []string, read func(*rig, window) error) error {
	rg, err := e.newRig(ctx)
	if err != nil {
		return err
	}
	defer rg.close()
	for _, what := range m.Procs {
		if _, err := rg.start(ctx, what, extra...); err != nil {
			return err
		}
	}
	token := e.orgs[0].Token // none for the peer, which has no authentication
	if strings.HasPrefix(m.Procs[0], "peer") {
		token = ""
	}
	start, body, run := rg.base+e.orgs[0].startPath(), []byte(startBody), time.Now().UnixNano()
	cs := make([]loopClient, clients)
	next := func(c, i int) request {
		if id := cs[c].run.ID; id != "" {
			h := headerFor(token, "")
			h.Set("Prefer", "wait=10")
			return request{http.MethodGet, rg.base + "/api/runs/" + id + "/", h, nil}
		}
		return request{http.MethodPost, start, headerFor(token, fmt.Sprintf("loop-%d-%d-%d", run, c, i)), body}
	}
	for c := range cs {
		cs[c].poll = poll
	}
	clock := &dbClock{ctx: ctx, conn: rg.conn}
	w := window{load: runLoad(ctx, clients, t.Warm, t.Dur, next, loadOptions{OnWindow: clock.window, Follow: func(a answer) { cs[a.Client].follow(a) }})}
	if err := cmp.Or(clock.err, rg.exited()); err != nil {
		return err
	}
	for _, c := range cs {
		w.runs, w.noRun = append(w.runs, c.done...), w.noRun+c.noRun
	}
	w.from, w.to = clock.from, clock.to
	return read(rg, w)
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

// waitTimes sets r's client-felt start to final, from each run's request
// sent to its finished_at (the harness, the servers and PostgreSQL share
// the machine's clock), over the runs final; the others are counted.
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

// e2eTimes waits up to wait for the runs created in [from, to) (of
// organisation org, "" for all) to be final, then reads how many are and
// their finished_at - created_at.
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

// e2eAt is the loop of mode at clients, failed or not (nil: not run).
func (r *results) e2eAt(mode string, clients int) *e2eResult {
	for i := range r.E2E {
		if x := &r.E2E[i]; x.Mode == mode && x.Clients == clients {
			return x
		}
	}
	return nil
}

func e2eMeasured(r *e2eResult) bool { return r != nil && r.Failed == "" }

// e2eChecks are the end-to-end targets: runs finished/s at least 1.5x the
// peer's at 8 and 32 clients and valruns' finished at least 0.95x its
// started at every count; the client-felt start to final p50 at most the
// peer's and p99 at most 2x at 1, 8 and 32.
func (r *results) e2eChecks() []check {
	var out []check
	counts := curveCounts(makePlan(false).E2ELevels, r.e2eRan()...)
	for _, p := range e2ePairs {
		for _, n := range counts {
			v, peer := r.e2eAt(p[0].Name, n), r.e2eAt(p[1].Name, n)
			c := check{Name: fmt.Sprintf("e2e runs finished/s, %s, %s", pairLabel(p), clientsText(n)), Target: "finished >= 0.95x started"}
			if n == 8 || n == 32 {
				c.Target = ">= 1.5x the peer, " + c.Target
			}
			if !e2eMeasured(v) {
				out = append(out, notMeasured(c))
				continue
			}
			own := fmt.Sprintf("finished / started %.2f", v.Ratio())
			if n == 8 || n == 32 {
				c = ratio(c, e2eMeasured(peer), v.FinishedPerSec(), fin(peer), 1.5, false, fmt.Sprintf("%.0f / %.0f runs/s", v.FinishedPerSec(), fin(peer)))
				c.Measured += ", " + own
			} else {
				c.Measured, c.Pass = own, true
			}
			c.Pass = c.Pass && v.Ratio() >= 0.95
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
				a, okV := waitOf(r.e2eAt(p[0].Name, n), p99)
				b, okP := waitOf(r.e2eAt(p[1].Name, n), p99)
				out = append(out, ratio(c, okV && okP, float64(a), float64(b), most, true, fmt.Sprintf("%s / %s ms", ms(a), ms(b))))
			}
		}
	}
	return out
}

// waitOf is a measured loop's client-felt start to final, p50 or p99.
func waitOf(r *e2eResult, p99 bool) (time.Duration, bool) {
	if !e2eMeasured(r) || r.WaitFinal == 0 {
		return 0, false
	}
	if p99 {
		return r.WaitP99, true
	}
	return r.WaitP50, true
}

func (r *results) e2eRan() []int {
	var ns []int
	for _, x := range r.E2E {
		ns = append(ns, x.Clients)
	}
	return ns
}

// e2eSection is end to end: the targets, and one row per loop.
func (r *results) e2eSection() section {
	var b strings.Builder
	fmt.Fprintf(&b, "A closed loop of new-key starts (%s warm-up, %s measured, a fresh database each) at each client count, "+
		"valruns in each mode beside the peer in its matching mode, back to back; then the harness waits for the window's runs to end. "+
		"Runs finished per second come from the runs' own timestamps. Start to final, which the targets judge, runs from the moment the harness sent the request to the run's finished_at: "+
		"what a waiting client feels. The runs' own finished_at - created_at (\"timestamps\") does not start at the same point on both sides: "+
		"the peer stamps created_at in its INSERT, after its middleware, its idempotency library's Redis calls and its pool wait, valruns when it reads the request. "+
		"Runs a 201 named that were not final when the harness stopped waiting are counted (then the p99 is a floor). "+
		"The peer's start enqueues a BullMQ job after its INSERT; its worker (ajv, no CEL) writes status, times and findings in one statement.\n\n",
		r.E2ETiming.Warm, r.E2ETiming.Dur)
	cs := r.e2eChecks()
	b.WriteString(checkTable(cs))
	b.WriteString("\n| clients | mode | runs finished/s | finished / started | start to final p50 / p99 ms | timestamps p50 ms | not final |\n|---|---|---|---|---|---|---|\n")
	for _, x := range r.E2E {
		if x.Failed != "" {
			fmt.Fprintf(&b, "| %d | %s | FAILED: %s | | | | |\n", x.Clients, x.Mode, cell(short(x.Failed, 300)))
			continue
		}
		fmt.Fprintf(&b, "| %d | %s | %.0f | %.2f | %s | %s | %d |\n", x.Clients, x.Mode, x.FinishedPerSec(), x.Ratio(), waitCell(x), ms(x.FinalP50), x.WaitUnfinished)
	}
	return section{Heading: "## The curve: end to end", Body: b.String(), Checks: cs}
}

// fin is a measured loop's runs finished per second, else 0.
func fin(x *e2eResult) float64 {
	if !e2eMeasured(x) {
		return 0
	}
	return x.FinishedPerSec()
}

// waitCell is the client-felt start to final, p50 / p99, or "-".
func waitCell(r e2eResult) string {
	if r.WaitFinal == 0 {
		return "-"
	}
	return ms(r.WaitP50) + " / " + ms(r.WaitP99)
}
