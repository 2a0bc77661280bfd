package main

// End to end: what a user of a validation service feels. A closed loop of
// new-key starts for a while, then the runs' own timestamps in the
// database say how many runs were started and finished per second and how
// long a run took from its start (created_at) to its final state
// (finished_at), and to running (started_at). The start to final a waiting
// client feels runs from when the harness sent the request to the run's
// finished_at: the two sides stamp created_at at different points.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// e2eMode is how the runs are executed.
type e2eMode struct {
	Name     string
	Separate bool // a separate worker process beside the API
}

var (
	modeInline   = e2eMode{Name: "serve --worker"}
	modeSeparate = e2eMode{Name: "serve + worker", Separate: true}
	peerInline   = e2eMode{Name: "peer, one process"}
	peerSeparate = e2eMode{Name: "peer + worker.js", Separate: true}
)

// e2eResult is one end-to-end loop.
type e2eResult struct {
	Side    string // now, baseline, peer
	Mode    string
	Clients int
	// APIs and Workers: the processes of each kind (Workers 0: in the API).
	APIs, Workers int
	Window        time.Duration
	// From the load generator: the 201s inside the window and their latency.
	Answers            int
	StartP50, StartP99 time.Duration
	Errors             int // transport errors, non-2xx and unexpected answers
	Limited            int // of Errors: 429 answers (an organisation's start rate)
	// From the database.
	Started  int // runs created inside the window
	Finished int // runs that reached a final state inside the window (any run)
	// Of the runs created inside the window, after the drain wait:
	Final, Unfinished    int
	FinalP50, FinalP99   time.Duration // created_at -> finished_at
	RunningP50           time.Duration // created_at -> started_at (0 when not recorded)
	HasRunning           bool
	DrainedAfter         time.Duration // from the window's end to the last run's finished_at
	ServerCPU, WorkerCPU time.Duration // per run started
	PeakRSSKB            int64         // the largest API process's
	DBConns              int           // the most connections the database saw
	Failed               string

	// From the request sent to finished_at, over the runs the window's
	// 201s named: what a waiting client feels. WaitFinal counts those final
	// after the drain wait (the percentiles are theirs), WaitUnfinished the
	// others; both 0: not measured (a loop from before this figure).
	WaitFinal, WaitUnfinished int
	WaitP50, WaitP99          time.Duration
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

// e2eTarget is what a loop runs against.
type e2eTarget struct {
	side *side // nil for the peer
	peer bool
	mode e2eMode
	// apis and workers: how many API processes (the load spread over them
	// by client) and, in a separate mode, worker processes (0: one each).
	apis, workers int
}

// counts is the target's API and worker processes.
func (t e2eTarget) counts() (apis, workers int) {
	apis, workers = max(t.apis, 1), 0
	if t.mode.Separate {
		workers = max(t.workers, 1)
	}
	return apis, workers
}

// measureE2E runs the closed loop of new-key starts against t for dur
// (after warm), then waits up to drainWait for the window's runs to end,
// and reads their times.
func (e *env) measureE2E(ctx context.Context, t e2eTarget, clients int, warm, dur, drainWait time.Duration, extra ...string) (r e2eResult) {
	r = e2eResult{Mode: t.mode.Name, Clients: clients}
	r.APIs, r.Workers = t.counts()
	tmpl, org := e.tmpl, e.orgs[0]
	if t.peer {
		r.Side = "peer"
	} else {
		r.Side = t.side.Name
		tmpl, org = t.side.tmpl, t.side.org
	}
	fail := func(err error) e2eResult {
		r.Failed = err.Error()
		fmt.Fprintf(os.Stderr, "bench: e2e %s %s: %v\n", r.Side, r.Mode, err)
		return r
	}
	db, err := e.freshFrom(ctx, tmpl)
	if err != nil {
		return fail(err)
	}
	defer func() { _ = e.dropDB(ctx, db) }()
	if err := e.flushRedis(ctx); err != nil {
		return fail(err)
	}
	var srvs, workers []*proc
	var bases []string
	defer func() {
		for _, p := range append(srvs, workers...) {
			p.Stop(20 * time.Second)
		}
	}()
	for i := range r.APIs {
		var srv *proc
		var base string
		switch {
		case t.peer:
			srv, base, err = e.startPeerOpts(ctx, e.dbURL(db), org, !t.mode.Separate)
		default:
			srv, base, err = e.startServerAt(ctx, t.side.bin, e.dbURL(db), !t.mode.Separate, e.apiPort(i), extra...)
		}
		if err != nil {
			return fail(err)
		}
		srvs, bases = append(srvs, srv), append(bases, base)
	}
	for j := range r.Workers {
		var worker *proc
		if t.peer {
			worker, err = e.startPeerWorker(ctx, e.dbURL(db))
		} else {
			worker, err = e.startWorkerAt(ctx, t.side.bin, e.dbURL(db), e.workerPort(j), extra...)
		}
		if err != nil {
			return fail(err)
		}
		workers = append(workers, worker)
	}
	conn, err := e.connect(ctx, db)
	if err != nil {
		return fail(err)
	}
	defer conn.Close(context.Background())

	token := org.Token
	if t.peer {
		token = ""
	}
	body := []byte(startBody)
	run := time.Now().UnixNano()
	next := func(c, i int) request {
		return request{"POST", bases[c%len(bases)] + org.startPath(), headerFor(token, fmt.Sprintf("e2e-%d-%d-%d", run, c, i)), body}
	}
	sm, wm := meters(srvs), meters(workers)
	var conns *connsSampler
	var from, to time.Time
	var clockErr error
	var sent sentRuns
	res := runLoadWith(ctx, clients, warm, dur, next, loadOptions{Observe: sent.observe, OnWindow: func(open bool) {
		if open {
			from = dbNow(ctx, conn, &clockErr)
			sm.open()
			wm.open()
			conns = e.sampleConns(ctx, db)
			return
		}
		to = dbNow(ctx, conn, &clockErr)
		sm.close()
		wm.close()
		conns.finish()
	}})
	if clockErr != nil {
		return fail(clockErr)
	}
	for _, srv := range srvs {
		if srv.Exited() {
			return fail(fmt.Errorf("the server exited during the run: %v\n%s", srv.err, srv.Tail()))
		}
	}
	r.Window = to.Sub(from)
	r.Answers = res.Requests
	r.StartP50, r.StartP99 = res.Percentile(.5), res.Percentile(.99)
	r.Errors = res.Errors + res.Non2xx + res.Unexpected
	r.Limited = res.Statuses[http.StatusTooManyRequests]
	r.PeakRSSKB = sm.peakRSS()
	r.DBConns = conns.max

	if err := conn.QueryRow(ctx, `SELECT
		count(*) FILTER (WHERE created_at >= $1 AND created_at < $2),
		count(*) FILTER (WHERE finished_at >= $1 AND finished_at < $2)
		FROM validation_runs`, from, to).Scan(&r.Started, &r.Finished); err != nil {
		return fail(err)
	}
	if r.Started > 0 {
		r.ServerCPU = sm.cpu() / time.Duration(r.Started)
		if len(workers) > 0 {
			r.WorkerCPU = wm.cpu() / time.Duration(r.Started)
		}
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
	unfinished := 0
	for _, s := range runs {
		at, ok := finished[s.ID]
		if !ok {
			unfinished++
			continue
		}
		waits = append(waits, at.Round(0).Sub(s.Sent.Round(0)))
	}
	slices.Sort(waits)
	r.WaitFinal, r.WaitUnfinished = len(waits), unfinished
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
	deadline := time.Now().Add(wait)
	for {
		var left int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM validation_runs
			WHERE created_at >= $1 AND created_at < $2 AND finished_at IS NULL AND ($3 = '' OR org_id::text = $3)`,
			from, to, org).Scan(&left); err != nil {
			return err
		}
		if left == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// e2eTimes reads the start-to-final and start-to-running times of the runs
// created in [from, to) (of organisation org, "" for all) from their own
// timestamps.
func e2eTimes(ctx context.Context, conn *pgx.Conn, from, to time.Time, org string, r *e2eResult) error {
	var p50, p99, run50, last *float64
	err := conn.QueryRow(ctx, `SELECT
		count(*) FILTER (WHERE finished_at IS NOT NULL),
		count(*) FILTER (WHERE finished_at IS NULL),
		percentile_disc(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - created_at)) FILTER (WHERE finished_at IS NOT NULL),
		percentile_disc(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - created_at)) FILTER (WHERE finished_at IS NOT NULL),
		percentile_disc(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - created_at)) FILTER (WHERE started_at IS NOT NULL),
		extract(epoch FROM max(finished_at) - $2::timestamptz)
		FROM validation_runs WHERE created_at >= $1 AND created_at < $2 AND ($3 = '' OR org_id::text = $3)`, from, to, org).
		Scan(&r.Final, &r.Unfinished, &p50, &p99, &run50, &last)
	if err != nil {
		return err
	}
	r.FinalP50, r.FinalP99 = secs(p50), secs(p99)
	r.RunningP50, r.HasRunning = secs(run50), run50 != nil
	r.DrainedAfter = max(0, secs(last))
	return nil
}

func secs(f *float64) time.Duration {
	if f == nil {
		return 0
	}
	return time.Duration(*f * float64(time.Second))
}

// maxAPIs and maxWorkers are the most processes of each kind a loop runs
// (the scale table's): their ports are checked free at the start.
const maxAPIs, maxWorkers = 4, 2

// apiPort is the port of API process i: e.port for the first, e.port+10+i
// for the others.
func (e *env) apiPort(i int) int {
	if i == 0 {
		return e.port
	}
	return e.port + 10 + i
}

// workerPort is the metrics port of worker j: e.port+2 for the first,
// e.port+20+j for the others.
func (e *env) workerPort(j int) int {
	if j == 0 {
		return e.port + 2
	}
	return e.port + 20 + j
}

// meterSet measures several processes over one window.
type meterSet []*usageMeter

func meters(ps []*proc) meterSet {
	var m meterSet
	for _, p := range ps {
		m = append(m, &usageMeter{pid: p.Pid()})
	}
	return m
}

func (m meterSet) open() {
	for _, u := range m {
		u.open()
	}
}

func (m meterSet) close() {
	for _, u := range m {
		u.close()
	}
}

// cpu is the processes' CPU time over the window, together.
func (m meterSet) cpu() (d time.Duration) {
	for _, u := range m {
		d += u.usage.CPU
	}
	return d
}

// peakRSS is the largest process's peak resident memory.
func (m meterSet) peakRSS() (kb int64) {
	for _, u := range m {
		kb = max(kb, u.usage.PeakRSS)
	}
	return kb
}
