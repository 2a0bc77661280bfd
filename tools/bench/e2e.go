package main

// End to end: what a user of a validation service feels. A closed loop of
// new-key starts for a while, then the runs' own timestamps say how many
// runs were started and finished per second and how long a run took from
// its start (created_at) to its final state (finished_at), and to running
// (started_at). The start to final a waiting client feels, which the
// targets judge, runs from when the harness sent the request to the run's
// finished_at: the two sides stamp created_at at different points.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

const e2eHeading = "## The curve: end to end"

// e2eMode is what runs the runs: valruns or the peer, the worker in the
// API's process or apart.
type e2eMode struct {
	Name           string
	Peer, Separate bool
}

var (
	modeInline   = e2eMode{Name: "serve --worker"}
	modeSeparate = e2eMode{Name: "serve + worker", Separate: true}
	peerInline   = e2eMode{Name: "peer, one process", Peer: true}
	peerSeparate = e2eMode{Name: "peer + worker.js", Peer: true, Separate: true}
)

// e2ePair is a valruns mode and the peer's mode it is compared with.
type e2ePair struct{ Valruns, Peer e2eMode }

var e2ePairs = []e2ePair{{modeInline, peerInline}, {modeSeparate, peerSeparate}}

func (p e2ePair) label() string { return fmt.Sprintf("`%s` vs %s", p.Valruns.Name, p.Peer.Name) }

// e2eResult is one end-to-end loop (or the noisy neighbour's B).
type e2eResult struct {
	Mode    string
	Clients int
	Window  time.Duration
	// From the load generator: the 201s inside the window and their latency.
	Answers            int
	StartP50, StartP99 time.Duration
	Errors             int // transport errors, non-2xx and unexpected answers
	Limited            int // of Errors: 429 answers (an organisation's start rate)
	// From the database: runs created, and runs final, inside the window.
	Started, Finished int
	// Of the runs created inside the window, after the drain wait:
	Final, Unfinished  int
	FinalP50, FinalP99 time.Duration // created_at -> finished_at
	RunningP50         time.Duration // created_at -> started_at
	HasRunning         bool
	// From the request sent to finished_at, over the runs the window's
	// 201s named: what a waiting client feels. WaitFinal counts those final
	// after the drain wait (the percentiles are theirs), WaitUnfinished the
	// others.
	WaitFinal, WaitUnfinished int
	WaitP50, WaitP99          time.Duration
	Failed                    string
}

func (r e2eResult) StartedPerSec() float64  { return perSec(r.Started, r.Window) }
func (r e2eResult) FinishedPerSec() float64 { return perSec(r.Finished, r.Window) }

// Ratio is runs finished over runs started in the window (1 when the
// worker keeps up; below it, a backlog grows).
func (r e2eResult) Ratio() float64 {
	if r.Started == 0 {
		return 0
	}
	return float64(r.Finished) / float64(r.Started)
}

func perSec(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

// measureE2ECurve runs the loops: at each count, each valruns mode then
// the peer's matching mode, back to back.
func measureE2ECurve(ctx context.Context, e *env, p plan) []e2eResult {
	var out []e2eResult
	for _, n := range p.E2ELevels {
		for _, pair := range e2ePairs {
			for _, m := range []e2eMode{pair.Valruns, pair.Peer} {
				if ctx.Err() != nil {
					return out
				}
				r := e.measureE2E(ctx, m, n, p.E2E.Warm, p.E2E.Dur, p.E2E.Dur+30*time.Second)
				out = append(out, r)
				if r.Failed == "" {
					say("e2e %-18s c=%-3d %5.0f started/s %5.0f finished/s (%.2f)  start-to-final p50/p99 %s ms, %d unfinished",
						r.Mode, r.Clients, r.StartedPerSec(), r.FinishedPerSec(), r.Ratio(), waitCell(&r), r.WaitUnfinished)
				}
			}
		}
	}
	return out
}

// measureE2E runs the closed loop of new-key starts of orgs[0] in mode m
// for dur (after warm), then waits up to drainWait for the window's runs to
// end, and reads their times. extra are settings of valruns' processes.
func (e *env) measureE2E(ctx context.Context, m e2eMode, clients int, warm, dur, drainWait time.Duration, extra ...string) (r e2eResult) {
	r = e2eResult{Mode: m.Name, Clients: clients}
	fail := func(err error) e2eResult {
		r.Failed = err.Error()
		fmt.Fprintf(os.Stderr, "bench: e2e %s: %v\n", r.Mode, err)
		return r
	}
	db, err := e.fresh(ctx)
	if err != nil {
		return fail(err)
	}
	defer func() { _ = e.dropDB(ctx, db) }()
	var srv, worker *proc
	var base string
	if m.Peer {
		srv, base, err = e.startPeer(ctx, e.dbURL(db), !m.Separate)
	} else {
		srv, base, err = e.startServer(ctx, e.dbURL(db), !m.Separate, extra...)
	}
	if err != nil {
		return fail(err)
	}
	defer srv.Stop(20 * time.Second)
	if m.Separate {
		if m.Peer {
			worker, err = e.startPeerWorker(ctx, e.dbURL(db))
		} else {
			worker, err = e.startWorker(ctx, e.dbURL(db), extra...)
		}
		if err != nil {
			return fail(err)
		}
		defer worker.Stop(20 * time.Second)
	}
	conn, err := e.connect(ctx, db)
	if err != nil {
		return fail(err)
	}
	defer conn.Close(context.Background())

	org, token := e.orgs[0], e.orgs[0].Token
	if m.Peer {
		token = ""
	}
	url, body, run := base+org.startPath(), []byte(startBody), time.Now().UnixNano()
	next := func(c, i int) request {
		return request{http.MethodPost, url, headerFor(token, fmt.Sprintf("e2e-%d-%d-%d", run, c, i)), body}
	}
	var from, to time.Time
	var clockErr error
	var sent sentRuns
	res := runLoadWith(ctx, clients, warm, dur, next, loadOptions{Observe: sent.observe, OnWindow: func(open bool) {
		if open {
			from = dbNow(ctx, conn, &clockErr)
		} else {
			to = dbNow(ctx, conn, &clockErr)
		}
	}})
	if clockErr != nil {
		return fail(clockErr)
	}
	if srv.Exited() {
		return fail(fmt.Errorf("the server exited during the run: %v\n%s", srv.err, srv.Tail()))
	}
	r.Window, r.Answers = to.Sub(from), res.Requests
	r.StartP50, r.StartP99 = res.Percentile(.5), res.Percentile(.99)
	r.Errors, r.Limited = res.Errors+res.Non2xx+res.Unexpected, res.Statuses[http.StatusTooManyRequests]
	if err := conn.QueryRow(ctx, `SELECT
		count(*) FILTER (WHERE created_at >= $1 AND created_at < $2),
		count(*) FILTER (WHERE finished_at >= $1 AND finished_at < $2)
		FROM validation_runs`, from, to).Scan(&r.Started, &r.Finished); err != nil {
		return fail(err)
	}
	// The drain: the window's runs end after the load has stopped.
	if err := waitWindowFinal(ctx, conn, from, to, "", drainWait); err != nil {
		return fail(err)
	}
	if err := e2eTimes(ctx, conn, from, to, "", &r); err != nil {
		return fail(err)
	}
	if sent.noID > 0 {
		return fail(fmt.Errorf("%d of the window's 201s named no run id", sent.noID))
	}
	finished, err := finishedAt(ctx, conn, sent.ids())
	if err != nil {
		return fail(err)
	}
	waitTimes(sent.runs, finished, &r)
	return r
}

// sentRun is a run a 201 in the window named, and when its request was sent.
type sentRun struct {
	ID   string
	Sent time.Time
}

// sentRuns gathers the window's 201s from the load's clients.
type sentRuns struct {
	mu   sync.Mutex
	runs []sentRun
	noID int // 201s whose body had no "id"
}

// observe is the load's observer: it keeps a 201's run id and send time.
func (s *sentRuns) observe(a answer) {
	if a.Status != http.StatusCreated {
		return
	}
	var run struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal(a.Body, &run)
	s.mu.Lock()
	defer s.mu.Unlock()
	if run.ID == "" {
		s.noID++
		return
	}
	s.runs = append(s.runs, sentRun{ID: run.ID, Sent: a.Sent})
}

func (s *sentRuns) ids() []string {
	ids := make([]string, len(s.runs))
	for i, r := range s.runs {
		ids[i] = r.ID
	}
	return ids
}

// finishedAt reads the finished_at of those of the runs ids that are
// final; a run not final (or not found) is absent.
func finishedAt(ctx context.Context, conn *pgx.Conn, ids []string) (map[string]time.Time, error) {
	rows, err := conn.Query(ctx, `SELECT id::text, finished_at FROM validation_runs
		WHERE id = ANY($1::uuid[]) AND finished_at IS NOT NULL`, ids)
	if err != nil {
		return nil, err
	}
	out := map[string]time.Time{}
	var id string
	var at time.Time
	_, err = pgx.ForEachRow(rows, []any{&id, &at}, func() error {
		out[id] = at
		return nil
	})
	return out, err
}

// waitTimes sets r's client-felt start to final, from each run's request
// sent to its finished_at, over the runs final; the others are counted in
// WaitUnfinished. The harness, the servers and PostgreSQL share the
// machine's wall clock, so wall times are compared.
func waitTimes(runs []sentRun, finished map[string]time.Time, r *e2eResult) {
	var waits []time.Duration
	for _, s := range runs {
		if at, ok := finished[s.ID]; ok {
			waits = append(waits, at.Round(0).Sub(s.Sent.Round(0)))
		}
	}
	slices.Sort(waits)
	r.WaitFinal, r.WaitUnfinished = len(waits), len(runs)-len(waits)
	r.WaitP50, r.WaitP99 = percentile(waits, .5), percentile(waits, .99)
}

// dbNow is the database's clock (the runs' timestamps are read from it);
// a failure is kept in *errp.
func dbNow(ctx context.Context, conn *pgx.Conn, errp *error) time.Time {
	var ts time.Time
	if err := conn.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&ts); err != nil && *errp == nil {
		*errp = err
	}
	return ts
}

// waitWindowFinal waits up to wait for the runs created in [from, to) (of
// organisation org, "" for all) to be final.
func waitWindowFinal(ctx context.Context, conn *pgx.Conn, from, to time.Time, org string, wait time.Duration) error {
	for deadline := time.Now().Add(wait); ; time.Sleep(200 * time.Millisecond) {
		var left int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM validation_runs
			WHERE created_at >= $1 AND created_at < $2 AND finished_at IS NULL AND ($3 = '' OR org_id::text = $3)`,
			from, to, org).Scan(&left); err != nil {
			return err
		}
		if left == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			return nil
		}
	}
}

// e2eTimes reads the start-to-final and start-to-running times of the runs
// created in [from, to) (of organisation org, "" for all) from their own
// timestamps.
func e2eTimes(ctx context.Context, conn *pgx.Conn, from, to time.Time, org string, r *e2eResult) error {
	var p50, p99, run50 *float64
	err := conn.QueryRow(ctx, `SELECT
		count(*) FILTER (WHERE finished_at IS NOT NULL),
		count(*) FILTER (WHERE finished_at IS NULL),
		percentile_disc(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - created_at)) FILTER (WHERE finished_at IS NOT NULL),
		percentile_disc(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - created_at)) FILTER (WHERE finished_at IS NOT NULL),
		percentile_disc(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - created_at)) FILTER (WHERE started_at IS NOT NULL)
		FROM validation_runs WHERE created_at >= $1 AND created_at < $2 AND ($3 = '' OR org_id::text = $3)`, from, to, org).
		Scan(&r.Final, &r.Unfinished, &p50, &p99, &run50)
	if err != nil {
		return err
	}
	r.FinalP50, r.FinalP99 = secs(p50), secs(p99)
	r.RunningP50, r.HasRunning = secs(run50), run50 != nil
	return nil
}

func secs(f *float64) time.Duration {
	if f == nil {
		return 0
	}
	return time.Duration(*f * float64(time.Second))
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

// e2eFinishedCheck: runs finished/s at least 1.5x the peer's at 8 and 32
// clients, and valruns' finished at least 0.95x its started at every count.
func e2eFinishedCheck(p e2ePair, clients int, v, peer *e2eResult) check {
	ratio := clients == 8 || clients == 32
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

// e2eLatencyCheck: valruns' client-felt start to final (p50 or p99) at
// most most times the peer's, at 1, 8 and 32 clients; false at other counts.
func e2eLatencyCheck(p e2ePair, clients int, v, peer *e2eResult, p99 bool) (check, bool) {
	if clients != 1 && clients != 8 && clients != 32 {
		return check{}, false
	}
	what, most := "p50", 1.0
	if p99 {
		what, most = "p99", 2.0
	}
	c := check{Name: fmt.Sprintf("e2e start-to-final %s, %s, %s", what, p.label(), clientsText(clients)), Target: "<= " + times(most) + " the peer's"}
	a, okV := waitOf(v, p99)
	b, okP := waitOf(peer, p99)
	if !okV || !okP || b == 0 {
		return notMeasured(c), true
	}
	f := float64(a) / float64(b)
	c.Measured = fmt.Sprintf("%sx (%s / %s ms)", ratioText(f, most), ms(a), ms(b))
	c.Pass = f <= most
	return c, true
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

// e2eCounts are the counts of the end-to-end tables: the full plan's, and
// any other count measured.
func (r *results) e2eCounts() []int {
	var ns []int
	for _, x := range r.E2E {
		ns = append(ns, x.Clients)
	}
	return curveCounts(makePlan(false).E2ELevels, ns...)
}

// e2eChecks are the end-to-end targets.
func (r *results) e2eChecks() []check {
	var out []check
	for _, p := range e2ePairs {
		for _, n := range r.e2eCounts() {
			out = append(out, e2eFinishedCheck(p, n, r.e2eAt(p.Valruns.Name, n), r.e2eAt(p.Peer.Name, n)))
		}
	}
	for _, p99 := range []bool{false, true} {
		for _, p := range e2ePairs {
			for _, n := range r.e2eCounts() {
				if c, ok := e2eLatencyCheck(p, n, r.e2eAt(p.Valruns.Name, n), r.e2eAt(p.Peer.Name, n), p99); ok {
					out = append(out, c)
				}
			}
		}
	}
	return out
}

// e2eSection is the end-to-end curve: runs finished/s, start-to-final p50
// and p99, one table each, both modes at every count. The limit is the
// start curve's pgbench of the peer's INSERT at the same count, when this
// run measured it.
func (r *results) e2eSection() section {
	var b strings.Builder
	fmt.Fprintf(&b, "A closed loop of new-key starts (%s warm-up, %s measured, a fresh database each) at each client count, "+
		"valruns in each mode beside the peer in its matching mode, back to back; then the harness waits for the window's runs to end. "+
		"Runs started/finished per second come from the runs' own timestamps. Start to final, which the targets judge, runs from the moment the harness sent the request to the run's finished_at: "+
		"what a waiting client feels. The runs' own finished_at - created_at is shown beside it but does not start at the same point on both sides: "+
		"the peer stamps created_at in its INSERT, after its middleware, its idempotency library's Redis calls and its pool wait, valruns when it reads the request. "+
		"Runs a 201 named that were still not final when the harness stopped waiting are counted (then the p99 is a floor). "+
		"The peer's start enqueues a BullMQ job after its INSERT; its worker (ajv, no CEL) writes status, times and findings in one statement.\n",
		r.E2ETiming.Warm, r.E2ETiming.Dur)
	type table struct {
		title, head string
		line        func(p e2ePair, n int, v, peer *e2eResult) string
	}
	pair := func(v, peer *e2eResult, f func(*e2eResult) string) string {
		return e2eCell(v, f) + " / " + e2eCell(peer, f)
	}
	latency := func(p99 bool) func(p e2ePair, n int, v, peer *e2eResult) string {
		return func(p e2ePair, n int, v, peer *e2eResult) string {
			a, okV := waitOf(v, p99)
			bb, okP := waitOf(peer, p99)
			cellOf := func(x *e2eResult) string {
				if d, ok := waitOf(x, p99); ok {
					return ms(d)
				}
				return "-"
			}
			own := func(x *e2eResult) string {
				if p99 {
					return ms(x.FinalP99)
				}
				return ms(x.FinalP50)
			}
			c, has := e2eLatencyCheck(p, n, v, peer, p99)
			return fmt.Sprintf("%s | %s | %s | %s | %s | %s", cellOf(v), cellOf(peer), fraction(float64(a), float64(bb), okV && okP),
				pair(v, peer, own), pair(v, peer, func(x *e2eResult) string { return fmt.Sprint(x.WaitUnfinished) }),
				verdictCells(c, has, v != nil || peer != nil))
		}
	}
	tables := []table{
		{"Runs finished/s", "| clients | modes | valruns finished/s | peer finished/s | valruns / peer | limit: pgbench of the peer's INSERT, tps | valruns / limit | finished / started, valruns / peer | start-to-running p50 ms, valruns / peer | target | result |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
			func(p e2ePair, n int, v, peer *e2eResult) string {
				lim := r.limitAt(n)
				return fmt.Sprintf("%s | %s | %s | %s | %s | %s | %s | %s", e2eRate(v), e2eRate(peer),
					fraction(fin(v), fin(peer), e2eMeasured(v) && e2eMeasured(peer)), limitCell(lim),
					fraction(fin(v), rpsOf(lim), e2eMeasured(v) && measured(lim)),
					pair(v, peer, func(x *e2eResult) string { return fmt.Sprintf("%.2f", x.Ratio()) }), pair(v, peer, runningCell),
					verdictCells(e2eFinishedCheck(p, n, v, peer), true, v != nil || peer != nil))
			}},
		{"Start to final, p50", "| clients | modes | valruns p50 ms, request sent to final | peer | valruns / peer | timestamps p50 ms (finished_at - created_at), valruns / peer | not final when the harness stopped waiting, valruns / peer | target | result |\n|---|---|---|---|---|---|---|---|---|\n", latency(false)},
		{"Start to final, p99", "| clients | modes | valruns p99 ms, request sent to final | peer | valruns / peer | timestamps p99 ms (finished_at - created_at), valruns / peer | not final when the harness stopped waiting, valruns / peer | target | result |\n|---|---|---|---|---|---|---|---|---|\n", latency(true)},
	}
	for _, t := range tables {
		fmt.Fprintf(&b, "\n### %s\n\n%s", t.title, t.head)
		for _, n := range r.e2eCounts() {
			for _, p := range e2ePairs {
				fmt.Fprintf(&b, "| %d | %s | %s |\n", n, p.label(), t.line(p, n, r.e2eAt(p.Valruns.Name, n), r.e2eAt(p.Peer.Name, n)))
			}
		}
	}
	return section{Heading: e2eHeading, Body: b.String(), Checks: r.e2eChecks()}
}

func e2eRate(r *e2eResult) string {
	switch {
	case r == nil:
		return "not measured"
	case r.Failed != "":
		return "FAILED"
	}
	return fmt.Sprintf("%.0f", r.FinishedPerSec())
}

// e2eCell is f of a measured loop, else "-".
func e2eCell(r *e2eResult, f func(*e2eResult) string) string {
	if !e2eMeasured(r) {
		return "-"
	}
	return f(r)
}

func fin(r *e2eResult) float64 {
	if r == nil {
		return 0
	}
	return r.FinishedPerSec()
}

// waitCell is the client-felt start to final, p50 / p99, or "-".
func waitCell(r *e2eResult) string {
	if r.WaitFinal == 0 {
		return "-"
	}
	return ms(r.WaitP50) + " / " + ms(r.WaitP99)
}

func runningCell(r *e2eResult) string {
	if !r.HasRunning {
		return "-"
	}
	return ms(r.RunningP50)
}
