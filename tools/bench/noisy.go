package main

// The noisy neighbour: B's start latency and start-to-final alone, next to
// A's flood and behind A's slow runs, and A's throughput alone, for each
// set of settings: the limits and the fair queue on and off in one run.

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/valruns/valruns/internal/workload"
)

// bEvery is B's pace: one start every half second, ~2 starts/s.
const bEvery = 500 * time.Millisecond

// defaultNoisyEnv are the variants unless -noisy-env: no limit (a share that
// never binds), the fair share with no rate limit, the service's defaults
// (an empty value, so that the harness's own settings do not apply).
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
	// AQueued: A's runs not final when B's first run behind the backlog started.
	AQueued int
	// A alone: its own throughput, end to end.
	AAlone e2eResult
	Failed []string
}

// setting is the value of the setting name the variant's processes run
// with: the variant's, else BENCH_SERVER_ENV's ("": the service's default).
func (v noisyVariant) setting(serverEnv []string, name string) (val string) {
	for _, kv := range append(slices.Clone(serverEnv), v.Settings...) { // the last wins, as in the children's env
		if n, x, _ := strings.Cut(kv, "="); n == name {
			val = x
		}
	}
	return val
}

// label is the variant's settings as given ("NAME default" for an empty
// value, which the service reads as its default).
func (v noisyVariant) label() string {
	out := slices.Clone(v.Settings)
	for i, kv := range out {
		if name, val, _ := strings.Cut(kv, "="); val == "" {
			out[i] = name + " default"
		}
	}
	return cmp.Or(strings.Join(out, " "), "the harness's settings")
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
		say("noisy [%s]: B alone; B while A floods at %d clients; B behind A's %d slow runs; A alone", v.label(), x.Clients, x.BacklogRuns)
		v.Alone = e.noisyB(ctx, settings, "alone", modeSeparate.Procs, func(rg *rig) e2eResult { return e.paceB(ctx, rg, "alone", x.Warm, x.Dur, 30*time.Second) })
		v.Flood = e.noisyB(ctx, settings, "A floods", modeSeparate.Procs, func(rg *rig) e2eResult { return e.flood(ctx, rg, &v, x) })
		mode := fmt.Sprintf("behind A's %d slow runs", x.BacklogRuns)
		v.Backlog = e.noisyB(ctx, settings, mode, []string{"serve"}, func(rg *rig) e2eResult { return e.backlog(ctx, rg, &v, x, mode) })
		v.AAlone = e.measureE2E(ctx, modeSeparate, x.Clients, timing{x.Warm, x.Dur}, x.Dur+30*time.Second, settings...)
		for _, r := range []e2eResult{v.Alone, v.Flood, v.Backlog, v.AAlone} {
			if r.Failed != "" {
				v.Failed = append(v.Failed, r.Mode+": "+r.Failed)
			} else if r.Clients == 1 {
				say("noisy B %-26s %3d starts, start p99 %7s ms, start-to-final p99 %8s ms, %d unfinished, %d errors",
					r.Mode, r.Answers, ms(r.StartP99), ms(r.FinalP99), r.Unfinished, r.Errors)
			}
		}
		x.Variants = append(x.Variants, v)
	}
	x.Load += " before, " + loadavg() + " after"
	return x
}

// noisyB measures one of B's rows on a fresh rig running procs with settings.
func (e *env) noisyB(ctx context.Context, settings []string, mode string, procs []string, measure func(*rig) e2eResult) e2eResult {
	res := e2eResult{Mode: mode}
	err := e.onRig(ctx, procs, settings, func(rg *rig, _ []*proc) error {
		res = measure(rg)
		return nil
	})
	res.Failed = cmp.Or(res.Failed, failed("noisy B "+mode, err))
	return res
}

// paceB sends B's new-key starts, one every bEvery, for warm then dur, then
// waits up to wait for the window's runs to be final and reads their times.
func (e *env) paceB(ctx context.Context, rg *rig, mode string, warm, dur, wait time.Duration) e2eResult {
	b := e.orgs[1]
	res := e2eResult{Mode: mode, Clients: 1}
	// The first start leaves after the window has surely opened (warm 0).
	starts, t0 := newKeys(rg.base, b, b.Token), time.Now().Add(100*time.Millisecond)
	next := func(c, i int) request {
		time.Sleep(time.Until(t0.Add(time.Duration(i) * bEvery)))
		return starts(c, i)
	}
	clock := &dbClock{ctx: ctx, conn: rg.conn}
	lr := runLoad(ctx, 1, warm, dur, next, loadOptions{Check: replayCheck(false), OnWindow: clock.window})
	res.answered(lr, clock.to.Sub(clock.from))
	err := clock.err
	if err == nil {
		err = e2eTimes(ctx, rg.conn, clock.from, clock.to, b.ID, wait, &res)
	}
	res.Failed = failed("noisy B "+mode, err)
	return res
}

// flood: A floods (new-key starts, x.Clients at once, closed loop) while B
// starts 2 runs a second; B's window opens once A's flood has warmed up.
func (e *env) flood(ctx context.Context, rg *rig, v *noisyVariant, x *noisyLog) e2eResult {
	next, stop := newKeys(rg.base, e.orgs[0], e.orgs[0].Token), make(chan struct{})
	var ares loadResult
	var wg sync.WaitGroup
	wg.Go(func() { ares = runLoad(ctx, x.Clients, x.Warm, 24*time.Hour, next, loadOptions{Stop: stop}) })
	sleep(ctx, x.Warm)
	// B's runs queue behind A's flood: they may take as long as the
	// worker takes to drain it.
	res := e.paceB(ctx, rg, "A floods", time.Second, x.Dur, x.Dur+2*time.Minute)
	close(stop)
	wg.Wait()
	v.AFloodRPS, v.AFloodStatuses, v.AFloodErrors = ares.RPS(), ares.Statuses, ares.Errors
	return res
}

// backlog: A queues slow runs of the fault suite's heavy workload (they end
// failed, every CEL scan run) with no worker running, then the worker
// starts and B starts its runs: their start to final, behind A's backlog.
func (e *env) backlog(ctx context.Context, rg *rig, v *noisyVariant, x *noisyLog, mode string) e2eResult {
	a := e.orgs[0]
	wfBody, _ := json.Marshal(map[string]any{"name": "noisy heavy", "schema": workload.SlowSchema, "assertions": workload.Scans(workload.SlowChecks)})
	heavy, _ := json.Marshal(map[string]any{"submission": workload.Items(workload.SlowItems), "metadata": map[string]string{"source": "bench"}})
	wf, err := createWorkflow(ctx, rg.base, a.Token, string(wfBody))
	for i := 0; err == nil && i < x.BacklogRuns; i++ {
		key := fmt.Sprintf("heavy-%d-%d", time.Now().UnixNano(), i)
		_, err = post(ctx, rg.base+"/api/workflows/"+wf+"/start/", heavy, headerFor(a.Token, key))
	}
	if err == nil {
		_, err = rg.start(ctx, "worker", v.Settings...)
	}
	if err == nil {
		err = rg.conn.QueryRow(ctx, `SELECT count(*) FROM validation_runs WHERE workflow_id = $1 AND finished_at IS NULL`, wf).Scan(&v.AQueued)
	}
	if err != nil {
		return e2eResult{Mode: mode, Failed: err.Error()}
	}
	// Without a fair queue B's runs wait for A's whole backlog: up to
	// about 0.3 s of the machine per slow run.
	wait := 2*time.Minute + time.Duration(x.BacklogRuns)*300*time.Millisecond
	return e.paceB(ctx, rg, mode, 0, time.Duration(x.BacklogB)*bEvery, wait)
}

// noisyCheck is one of issue 16's targets this section measures.
func (x *noisyLog) checks() []check {
	var out []check
	for i, v := range x.Variants {
		out = append(out, ratio(check{Name: fmt.Sprintf("B's start p99 while A floods at %d clients / B alone [%s]", x.Clients, v.label()), Target: "<= 2x"},
			v.Alone.Failed == "" && v.Flood.Failed == "", float64(v.Flood.StartP99), float64(v.Alone.StartP99), 2, true,
			fmt.Sprintf("%s / %s ms", ms(v.Flood.StartP99), ms(v.Alone.StartP99))))
		c := check{Name: fmt.Sprintf("B's start-to-final p99 behind A's %d queued slow runs [%s]", x.BacklogRuns, v.label()), Target: "<= 2 s"}
		if b := v.Backlog; b.Failed == "" && b.Final > 0 {
			c.Measured, c.Pass = fmt.Sprintf("%.2f s over %d runs", b.FinalP99.Seconds(), b.Final), b.FinalP99 <= 2*time.Second && b.Unfinished == 0
			if b.Unfinished > 0 {
				c.Measured += fmt.Sprintf(", %d not final when the harness stopped waiting", b.Unfinished)
			}
		} else {
			c = notMeasured(c)
		}
		out = append(out, c)
		// Fairness must cost A alone at most 5%: compared with the first
		// variant when both let A start as fast as it can (the same
		// ORG_START_RATE; a rate limit throttles A alone by design).
		if first := x.Variants[0]; i > 0 && v.setting(x.ServerEnv, "ORG_START_RATE") == first.setting(x.ServerEnv, "ORG_START_RATE") {
			out = append(out, ratio(check{Name: fmt.Sprintf("A alone, runs finished/s [%s] / [%s]", v.label(), first.label()), Target: ">= 0.95x"},
				v.AAlone.Failed == "" && first.AAlone.Failed == "", v.AAlone.FinishedPerSec(), first.AAlone.FinishedPerSec(), 0.95, false,
				fmt.Sprintf("%.0f / %.0f runs/s", v.AAlone.FinishedPerSec(), first.AAlone.FinishedPerSec())))
		}
	}
	return out
}

// failures are what could not be measured or went wrong: anything B or A got
// that is not a 2xx, but A's 429s (the rate limit doing its work).
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
	intro := fmt.Sprintf("Load average %s (1 min). Organisation A floods, organisation B starts a run every 0.5 s (new keys, the bench invoice), "+
		"on `valruns serve` + `valruns worker` (a fresh database each). B's start latency is the 201's round trip; start-to-final is B's runs' "+
		"`finished_at - created_at`. \"alone\": B's %s window with nothing else; \"A floods\": the same while A sends new-key starts from %d clients; "+
		"\"behind A's slow runs\": A first queues %d runs of the fault suite's heavy workflow (%d CEL scans of %d integers) with no worker running, "+
		"then the worker starts and B starts %d runs. \"A alone\": A's closed loop of %d clients for %s, end to end. "+
		"A p99 over fewer than 100 samples is nearly the maximum.",
		x.Load, x.Dur, x.Clients, x.BacklogRuns, workload.SlowChecks, workload.SlowItems, x.BacklogB, x.Clients, x.Dur)
	if len(x.ServerEnv) > 0 {
		intro += fmt.Sprintf("\n\nBENCH_SERVER_ENV for every process: `%s`.", strings.Join(x.ServerEnv, " "))
	}
	var b strings.Builder
	for _, v := range x.Variants {
		fmt.Fprintf(&b, "\n### Settings: %s\n\n", v.label())
		b.WriteString("| B | starts | start p50 ms | start p99 ms | start-to-final p50 ms | p99 ms | not final | errors | A meanwhile |\n|---|---|---|---|---|---|---|---|---|\n")
		meanwhile := []string{"-", fmt.Sprintf("%d clients: %.0f starts/s answered 201, %d answers 429", x.Clients, v.AFloodRPS, v.AFloodStatuses[http.StatusTooManyRequests]),
			fmt.Sprintf("%d of A's slow runs not final when B began", v.AQueued)}
		for i, r := range []e2eResult{v.Alone, v.Flood, v.Backlog} {
			if r.Failed != "" {
				fmt.Fprintf(&b, "| %s | FAILED: %s ||||||||\n", r.Mode, cell(short(r.Failed, 300)))
				continue
			}
			fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s | %d | %d | %s |\n", r.Mode, r.Answers, ms(r.StartP50), ms(r.StartP99),
				ms(r.FinalP50), ms(r.FinalP99), r.Unfinished, r.Errors, meanwhile[i])
		}
		a := v.AAlone
		if a.Failed != "" {
			fmt.Fprintf(&b, "\nA alone: FAILED: %s\n", short(a.Failed, 300))
			continue
		}
		fmt.Fprintf(&b, "\nA alone, %d clients: **%.0f starts/s, %.0f runs finished/s** (%.2f), start-to-final p50 %s / p99 %s ms, start answer p50 %s / p99 %s ms, %d answers 429, %d other errors.\n",
			a.Clients, a.StartedPerSec(), a.FinishedPerSec(), a.Ratio(), ms(a.FinalP50), ms(a.FinalP99), ms(a.StartP50), ms(a.StartP99), a.Limited, a.Errors-a.Limited)
	}
	return section{Heading: "## Noisy neighbour", Intro: intro, Checks: x.checks(), Body: b.String()}
}
