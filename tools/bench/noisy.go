package main

// The noisy neighbour: organisation A floods the service while
// organisation B starts a run now and then. B's start latency and B's runs'
// start-to-final time, alone and next to A's flood and next to A's backlog
// of slow runs, and A's own throughput alone, for each set of settings of
// the run (ORG_START_RATE, ORG_RUN_SHARE ...), so that the limits and the
// fair queue are measured on and off in one run.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/valruns/valruns/config"
	"github.com/valruns/valruns/internal/workload"
)

const noisyHeading = "## Noisy neighbour"

// bEvery is B's pace: one start every half second, ~2 starts/s.
const bEvery = 500 * time.Millisecond

// noisySettings are the settings each variant names (set or default).
var noisySettings = []string{"ORG_START_RATE", "ORG_RUN_SHARE", "WORKER_CONCURRENCY"}

// defaultNoisyEnv are the variants measured unless -noisy-env says
// otherwise: no limit at all (a share so large it never binds: fairness
// off), the fair share with the rate unlimited, and the service's defaults.
// Each names both settings, an empty value for the service's default, so
// that what the harness gives every process otherwise does not apply.
var defaultNoisyEnv = [][]string{
	{"ORG_START_RATE=0", "ORG_RUN_SHARE=1000000"},
	{"ORG_START_RATE=0", "ORG_RUN_SHARE="},
	{"ORG_START_RATE=", "ORG_RUN_SHARE="},
}

// noisyLog is the noisy neighbour's results.
type noisyLog struct {
	Load        string // load average before and after
	ServerEnv   []string
	Clients     int           // A's flood
	Warm, Dur   time.Duration // B's window, and A alone's
	BacklogRuns int           // A's slow runs queued before B's
	BacklogB    int           // B's runs behind them
	Variants    []noisyVariant
}

// noisyVariant is every measurement under one set of settings.
type noisyVariant struct {
	Settings []string // NAME=value given to serve and worker
	// B's starts and runs: From the load generator (StartP50/P99, Answers,
	// Errors) and from the runs' timestamps (FinalP50/P99, Unfinished).
	Alone, Flood, Backlog e2eResult
	// A during the flood: 201s per second, and answers by status.
	AFloodRPS      float64
	AFloodStatuses map[int]int
	AFloodErrors   int // transport errors
	// AQueued is how many of A's runs were not final when B's first run
	// behind the backlog was started.
	AQueued int
	// A alone: its own throughput, end to end.
	AAlone e2eResult
	Failed []string
}

// setting is the value of the setting name the variant's processes run
// with: the variant's, else BENCH_SERVER_ENV's, else the service's default
// (dflt true).
func (v noisyVariant) setting(serverEnv []string, name string) (val string, dflt bool) {
	for _, kv := range append(slices.Clone(serverEnv), v.Settings...) { // the last wins, as in the children's env
		if n, x, _ := strings.Cut(kv, "="); n == name {
			val = x // "" is the service's default
		}
	}
	if val != "" {
		return val, false
	}
	for _, cv := range config.Vars {
		if cv.Name == name {
			return cv.Default, true
		}
	}
	return "", true
}

// effective is NAME=value of each noisySettings, "(default)" when the
// service's default applies.
func (v noisyVariant) effective(serverEnv []string) string {
	var out []string
	for _, name := range noisySettings {
		val, dflt := v.setting(serverEnv, name)
		if dflt {
			val += " (default)"
		}
		out = append(out, name+"="+val)
	}
	return strings.Join(out, ", ")
}

// label is the variant's settings as given ("NAME default" for an empty
// value, which the service reads as its default).
func (v noisyVariant) label() string {
	var out []string
	for _, kv := range v.Settings {
		if name, val, _ := strings.Cut(kv, "="); val == "" {
			out = append(out, name+" default")
		} else {
			out = append(out, kv)
		}
	}
	if len(out) == 0 {
		return "the harness's settings"
	}
	return strings.Join(out, " ")
}

// measureNoisy measures each variant in turn.
func measureNoisy(ctx context.Context, e *env, p plan) *noisyLog {
	x := &noisyLog{Load: loadavg(), ServerEnv: e.serverEnv, Clients: p.NoisyClients, Warm: p.Noisy.Warm, Dur: p.Noisy.Dur,
		BacklogRuns: p.NoisyRuns, BacklogB: p.NoisyB}
	for _, settings := range p.NoisyEnv {
		if ctx.Err() != nil {
			break
		}
		v := noisyVariant{Settings: settings}
		say("noisy [%s]: B alone, %d s at 2 starts/s", v.label(), int(x.Dur.Seconds()))
		v.Alone = e.noisyAlone(ctx, settings, x.Warm, x.Dur)
		sayB("alone", v.Alone)
		say("noisy [%s]: B while A floods at %d clients", v.label(), x.Clients)
		e.noisyFlood(ctx, &v, x.Clients, x.Warm, x.Dur)
		sayB("A floods", v.Flood)
		say("noisy [%s]: B's %d runs behind A's %d queued slow runs", v.label(), x.BacklogB, x.BacklogRuns)
		e.noisyBacklog(ctx, &v, x.BacklogRuns, x.BacklogB)
		sayB("A's backlog", v.Backlog)
		say("noisy [%s]: A alone at %d clients", v.label(), x.Clients)
		v.AAlone = e.measureE2E(ctx, modeSeparate, x.Clients, x.Warm, x.Dur, x.Dur+30*time.Second, settings...)
		if r := v.AAlone; r.Failed == "" {
			say("noisy A alone: %5.0f started/s %5.0f finished/s, %d answers 429", r.StartedPerSec(), r.FinishedPerSec(), r.Limited)
		}
		for _, r := range []e2eResult{v.Alone, v.Flood, v.Backlog, v.AAlone} {
			if r.Failed != "" {
				v.Failed = append(v.Failed, r.Mode+": "+r.Failed)
			}
		}
		x.Variants = append(x.Variants, v)
	}
	x.Load += " before, " + loadavg() + " after"
	return x
}

func sayB(what string, r e2eResult) {
	if r.Failed != "" {
		say("noisy B %s FAILED: %s", what, short(r.Failed, 300))
		return
	}
	say("noisy B %-12s %3d starts  start p50 %6s p99 %7s ms  start-to-final p50 %8s p99 %8s ms  %d unfinished, %d errors",
		what, r.Answers, ms(r.StartP50), ms(r.StartP99), ms(r.FinalP50), ms(r.FinalP99), r.Unfinished, r.Errors)
}

// rig is one measurement's system: a fresh database, `valruns serve` and
// (once started) `valruns worker`, with the variant's settings.
type rig struct {
	e        *env
	db       string
	conn     *pgx.Conn
	base     string
	settings []string
	srv, wrk *proc
}

func (e *env) newRig(ctx context.Context, settings []string, worker bool) (*rig, error) {
	r := &rig{e: e, settings: settings}
	var err error
	if r.db, err = e.fresh(ctx); err != nil {
		return nil, err
	}
	if r.srv, r.base, err = e.startServer(ctx, e.dbURL(r.db), false, settings...); err != nil {
		r.close(ctx)
		return nil, err
	}
	if worker {
		if err := r.startWorker(ctx); err != nil {
			r.close(ctx)
			return nil, err
		}
	}
	if r.conn, err = e.connect(ctx, r.db); err != nil {
		r.close(ctx)
		return nil, err
	}
	return r, nil
}

func (r *rig) startWorker(ctx context.Context) (err error) {
	r.wrk, err = r.e.startWorker(ctx, r.e.dbURL(r.db), r.settings...)
	return err
}

func (r *rig) close(ctx context.Context) {
	if r.conn != nil {
		_ = r.conn.Close(context.Background())
	}
	r.wrk.Stop(20 * time.Second)
	r.srv.Stop(20 * time.Second)
	_ = r.e.dropDB(ctx, r.db)
}

// paceB sends B's new-key starts, one every bEvery, for warm then dur, and
// returns their latency and the window [from, to) (the database's clock)
// that finishB reads B's runs of.
func (r *rig) paceB(ctx context.Context, mode string, warm, dur time.Duration) (res e2eResult, from, to time.Time) {
	b := r.e.orgs[1]
	res = e2eResult{Mode: mode, Clients: 1}
	url, body, run := r.base+b.startPath(), []byte(startBody), time.Now().UnixNano()
	// The first start leaves after the window has surely opened (warm 0).
	t0 := time.Now().Add(100 * time.Millisecond)
	next := func(c, i int) request {
		if d := time.Until(t0.Add(time.Duration(i) * bEvery)); d > 0 {
			time.Sleep(d)
		}
		return request{http.MethodPost, url, headerFor(b.Token, fmt.Sprintf("b-%d-%d", run, i)), body}
	}
	notReplayed := func(resp *http.Response) string {
		if resp.Header.Get("Idempotent-Replayed") == "true" {
			return "a new key was answered as a replay"
		}
		return ""
	}
	var clockErr error
	lr := runLoad(ctx, 1, warm, dur, next, notReplayed, nil, func(open bool) {
		if open {
			from = dbNow(ctx, r.conn, &clockErr)
		} else {
			to = dbNow(ctx, r.conn, &clockErr)
		}
	})
	if clockErr != nil {
		res.Failed = clockErr.Error()
		return res, from, to
	}
	res.Window, res.Answers = to.Sub(from), lr.Requests
	res.StartP50, res.StartP99 = lr.Percentile(.5), lr.Percentile(.99)
	res.Errors = lr.Errors + lr.Non2xx + lr.Unexpected
	res.Limited = lr.Statuses[http.StatusTooManyRequests]
	return res, from, to
}

// finishB waits up to wait for B's runs of [from, to) to be final, and
// reads what they took.
func (r *rig) finishB(ctx context.Context, res *e2eResult, from, to time.Time, wait time.Duration) {
	if res.Failed != "" {
		return
	}
	b := r.e.orgs[1].ID
	err := waitWindowFinal(ctx, r.conn, from, to, b, wait)
	if err == nil {
		err = e2eTimes(ctx, r.conn, from, to, b, res)
	}
	if err != nil {
		res.Failed = err.Error()
	}
}

// noisyAlone: B alone, 2 starts/s, with serve + worker.
func (e *env) noisyAlone(ctx context.Context, settings []string, warm, dur time.Duration) e2eResult {
	r, err := e.newRig(ctx, settings, true)
	if err != nil {
		return e2eResult{Mode: "alone", Failed: err.Error()}
	}
	defer r.close(ctx)
	res, from, to := r.paceB(ctx, "alone", warm, dur)
	r.finishB(ctx, &res, from, to, 30*time.Second)
	return res
}

// noisyFlood: A floods (new-key starts, clients at once, closed loop)
// while B starts 2 runs a second; B's window opens once A's flood has
// warmed up.
func (e *env) noisyFlood(ctx context.Context, v *noisyVariant, clients int, warm, dur time.Duration) {
	r, err := e.newRig(ctx, v.Settings, true)
	if err != nil {
		v.Flood = e2eResult{Mode: "A floods", Failed: err.Error()}
		return
	}
	defer r.close(ctx)
	a := e.orgs[0]
	url, body, run := r.base+a.startPath(), []byte(startBody), time.Now().UnixNano()
	next := func(c, i int) request {
		return request{http.MethodPost, url, headerFor(a.Token, fmt.Sprintf("a-%d-%d-%d", run, c, i)), body}
	}
	stop := make(chan struct{})
	var ares loadResult
	var wg sync.WaitGroup
	wg.Go(func() { ares = runLoad(ctx, clients, warm, 24*time.Hour, next, nil, stop, nil) })
	select {
	case <-time.After(warm):
	case <-ctx.Done():
	}
	res, from, to := r.paceB(ctx, "A floods", time.Second, dur)
	close(stop)
	wg.Wait()
	v.AFloodRPS, v.AFloodStatuses, v.AFloodErrors = ares.RPS(), ares.Statuses, ares.Errors
	// B's runs queue behind A's flood: they may take as long as the
	// worker takes to drain it.
	r.finishB(ctx, &res, from, to, dur+2*time.Minute)
	v.Flood = res
}

// heavyWorkflow and heavyStart are A's slow-but-allowed runs: the fault
// suite's heavy workload (CEL scans over a large array). The submission
// lacks the warehouse the schema asks for, so the runs end failed; every
// scan runs all the same.
func heavyWorkflow() string {
	b, _ := json.Marshal(map[string]any{"name": "noisy heavy", "schema": workload.SlowSchema,
		"assertions": workload.Scans(workload.SlowChecks)})
	return string(b)
}

func heavyStart() []byte {
	b, _ := json.Marshal(map[string]any{"submission": workload.Items(workload.SlowItems), "metadata": map[string]string{"source": "bench"}})
	return b
}

// noisyBacklog: A queues runs slow runs through the API with no worker
// running, then the worker starts and B starts bRuns runs, 2 a second:
// what B's runs take from start to final, behind A's backlog.
func (e *env) noisyBacklog(ctx context.Context, v *noisyVariant, runs, bRuns int) {
	mode := fmt.Sprintf("behind A's %d slow runs", runs)
	fail := func(err error) { v.Backlog = e2eResult{Mode: mode, Failed: err.Error()} }
	r, err := e.newRig(ctx, v.Settings, false)
	if err != nil {
		fail(err)
		return
	}
	defer r.close(ctx)
	a := e.orgs[0]
	hc := &http.Client{Timeout: 30 * time.Second}
	wf, err := createWorkflow(hc, r.base, a.Token, heavyWorkflow())
	if err != nil {
		fail(err)
		return
	}
	heavy := a
	heavy.Workflow = wf
	hs := make([]http.Header, runs)
	for i := range hs {
		hs[i] = headerFor(a.Token, fmt.Sprintf("heavy-%d-%d", time.Now().UnixNano(), i))
	}
	if err := sendAll(ctx, r.base+heavy.startPath(), heavyStart(), hs, 32); err != nil {
		fail(fmt.Errorf("queueing A's %d slow runs: %w", runs, err))
		return
	}
	if err := r.startWorker(ctx); err != nil {
		fail(err)
		return
	}
	if err := r.conn.QueryRow(ctx, `SELECT count(*) FROM validation_runs WHERE workflow_id = $1 AND finished_at IS NULL`, wf).Scan(&v.AQueued); err != nil {
		fail(err)
		return
	}
	// Without a fair queue B's runs wait for A's whole backlog: up to
	// about 0.3 s of the machine per slow run.
	wait := 2*time.Minute + time.Duration(runs)*300*time.Millisecond
	res, from, to := r.paceB(ctx, mode, 0, time.Duration(bRuns)*bEvery)
	r.finishB(ctx, &res, from, to, wait)
	v.Backlog = res
}

// noisyCheck is one of issue 16's targets this section measures.
func (x *noisyLog) checks() []check {
	var out []check
	for i, v := range x.Variants {
		c := check{Name: fmt.Sprintf("B's start p99 while A floods at %d clients / B alone [%s]", x.Clients, v.label()), Target: "<= 2x"}
		if v.Alone.Failed == "" && v.Flood.Failed == "" && v.Alone.StartP99 > 0 {
			r := float64(v.Flood.StartP99) / float64(v.Alone.StartP99)
			c.Measured = fmt.Sprintf("%.2fx (%s / %s ms)", r, ms(v.Flood.StartP99), ms(v.Alone.StartP99))
			c.Pass = r <= 2
		} else {
			c = notMeasured(c)
		}
		out = append(out, c)
		c = check{Name: fmt.Sprintf("B's start-to-final p99 behind A's %d queued slow runs [%s]", x.BacklogRuns, v.label()), Target: "<= 2 s"}
		if b := v.Backlog; b.Failed == "" && b.Final > 0 {
			c.Measured = fmt.Sprintf("%.2f s over %d runs", b.FinalP99.Seconds(), b.Final)
			if b.Unfinished > 0 {
				c.Measured += fmt.Sprintf(", %d not final when the harness stopped waiting", b.Unfinished)
			}
			c.Pass = b.FinalP99 <= 2*time.Second && b.Unfinished == 0
		} else {
			c = notMeasured(c)
		}
		out = append(out, c)
		if i == 0 {
			continue
		}
		// Fairness must cost A alone at most 5%: a variant is compared with
		// the first on A's throughput only when both let A start as fast as
		// it can equally (the same ORG_START_RATE). A rate limit throttles
		// A alone by design; its row shows that it does, not what the gate
		// costs.
		first := x.Variants[0]
		if !sameSetting(x.ServerEnv, v, first, "ORG_START_RATE") {
			continue
		}
		c = check{Name: fmt.Sprintf("A alone, runs finished/s [%s] / [%s]", v.label(), first.label()), Target: ">= 0.95x"}
		if v.AAlone.Failed == "" && first.AAlone.Failed == "" && first.AAlone.FinishedPerSec() > 0 {
			r := v.AAlone.FinishedPerSec() / first.AAlone.FinishedPerSec()
			c.Measured = fmt.Sprintf("%.2fx (%.0f / %.0f runs/s)", r, v.AAlone.FinishedPerSec(), first.AAlone.FinishedPerSec())
			c.Pass = r >= 0.95
		} else {
			c = notMeasured(c)
		}
		out = append(out, c)
	}
	return out
}

// sameSetting reports whether variants a and b run with the same value of
// the setting name.
func sameSetting(serverEnv []string, a, b noisyVariant, name string) bool {
	va, _ := a.setting(serverEnv, name)
	vb, _ := b.setting(serverEnv, name)
	return va == vb
}

// failures are what could not be measured or went wrong. A's 429s are
// the rate limit doing its work; anything else B or A got that is not a
// 2xx is an error.
func (x *noisyLog) failures() []string {
	var errs []string
	for _, v := range x.Variants {
		errs = append(errs, v.Failed...)
		for _, b := range []e2eResult{v.Alone, v.Flood, v.Backlog} {
			if b.Failed == "" && b.Errors > 0 {
				errs = append(errs, fmt.Sprintf("B %s: %d answers were errors (%d of them 429)", b.Mode, b.Errors, b.Limited))
			}
		}
		other := v.AFloodErrors
		for status, n := range v.AFloodStatuses {
			if status != http.StatusTooManyRequests {
				other += n
			}
		}
		if other > 0 {
			errs = append(errs, fmt.Sprintf("A's flood: %d answers were errors other than 429", other))
		}
		if a := v.AAlone; a.Failed == "" && a.Errors > a.Limited {
			errs = append(errs, fmt.Sprintf("A alone: %d answers were errors other than 429", a.Errors-a.Limited))
		}
	}
	return errs
}

// section is the noisy neighbour's section of the results.
func (x *noisyLog) section() section {
	var b strings.Builder
	fmt.Fprintf(&b, "Load average %s (1 min). ", x.Load)
	b.WriteString("Organisation A floods, organisation B starts a run every 0.5 s (~2 starts/s, new keys, the bench invoice workflow), on `valruns serve` + `valruns worker` (a fresh database each). ")
	fmt.Fprintf(&b, "B's start latency is the 201's round trip; start-to-final is B's runs' `finished_at - created_at`. "+
		"\"alone\": B's %s window with nothing else; \"A floods\": the same while A sends new-key starts from %d clients, closed loop; "+
		"\"behind A's slow runs\": A first queues %d runs of the fault suite's heavy workflow (%d CEL scans of %d integers) with no worker running, then the worker starts and B starts %d runs. "+
		"\"A alone\": A's closed loop of %d clients for %s, its runs started and finished per second (end to end, as the curve's loops). "+
		"A p99 over fewer than 100 samples is nearly the maximum.\n\n",
		x.Dur, x.Clients, x.BacklogRuns, workload.SlowChecks, workload.SlowItems, x.BacklogB, x.Clients, x.Dur)
	if len(x.ServerEnv) > 0 {
		fmt.Fprintf(&b, "BENCH_SERVER_ENV for every process: `%s`.\n\n", strings.Join(x.ServerEnv, " "))
	}
	cs := x.checks()
	b.WriteString(checkTable(cs))
	for _, v := range x.Variants {
		fmt.Fprintf(&b, "\n### Settings: %s\n\n`%s`\n\n", v.label(), v.effective(x.ServerEnv))
		b.WriteString("| B | starts | start p50 ms | start p99 ms | start-to-final p50 ms | p99 ms | not final | errors | A meanwhile |\n|---|---|---|---|---|---|---|---|---|\n")
		for _, row := range []struct {
			r    e2eResult
			what string
		}{
			{v.Alone, "-"},
			{v.Flood, v.floodText(x.ServerEnv, x.Clients)},
			{v.Backlog, fmt.Sprintf("%d of A's slow runs not final when B began", v.AQueued)},
		} {
			r := row.r
			if r.Failed != "" {
				fmt.Fprintf(&b, "| %s | FAILED: %s ||||||||\n", r.Mode, cell(short(r.Failed, 300)))
				continue
			}
			fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s | %d | %d | %s |\n", r.Mode, r.Answers, ms(r.StartP50), ms(r.StartP99),
				ms(r.FinalP50), ms(r.FinalP99), r.Unfinished, r.Errors, row.what)
		}
		a := v.AAlone
		if a.Failed != "" {
			fmt.Fprintf(&b, "\nA alone: FAILED: %s\n", short(a.Failed, 300))
			continue
		}
		fmt.Fprintf(&b, "\nA alone, %d clients: **%.0f starts/s, %.0f runs finished/s** (%.2f), start-to-final p50 %s / p99 %s ms, start answer p50 %s / p99 %s ms, %d answers 429, %d other errors.\n",
			a.Clients, a.StartedPerSec(), a.FinishedPerSec(), a.Ratio(), ms(a.FinalP50), ms(a.FinalP99), ms(a.StartP50), ms(a.StartP99), a.Limited, a.Errors-a.Limited)
	}
	return section{Heading: noisyHeading, Body: b.String(), Checks: cs}
}

// floodText is what A did while B's window was open. A rate limit that
// answered no 429 to a flood well over the rate is not in this binary.
func (v noisyVariant) floodText(serverEnv []string, clients int) string {
	limited := v.AFloodStatuses[http.StatusTooManyRequests]
	s := fmt.Sprintf("%d clients: %.0f starts/s answered 201, %d answers 429", clients, v.AFloodRPS, limited)
	rate, _ := v.setting(serverEnv, "ORG_START_RATE")
	if n, err := strconv.Atoi(rate); err == nil && n > 0 && limited == 0 && v.AFloodRPS > 1.5*float64(n) {
		s += fmt.Sprintf(" (ORG_START_RATE=%d is not enforced by this binary)", n)
	}
	return s
}
