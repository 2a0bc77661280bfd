// Command bench is valruns' benchmark harness (`make bench`). It drives the
// real binary (`valruns serve`, `valruns worker`) with a closed-loop load
// generator, in the same run as the two things a user compares it with:
// the peer a team would otherwise pick (tools/bench/peer: Express +
// express-idempotency on Redis + pg) and the database's own limit (pgbench
// replaying the SQL a new-key start sends, captured from the server at run
// time, never retyped). It writes tools/bench/RESULTS.md with the machine, the
// table, the captured SQL and the ratios with their targets.
//
// It uses PostgreSQL at DATABASE_URL (databases valruns_bench_<pid>_*,
// dropped at the end), a private redis-server (or BENCH_REDIS_URL, which
// it flushes), and HTTP ports BENCH_PORT..BENCH_PORT+2 (default 18080).
//
// It is a module of its own (tools/bench/go.mod), not part of the
// service's, and runs from the repository's root, where its default paths
// start: scripts/bench.sh builds it into bin/valruns-bench and runs it there.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// plan is one run's choice of parts, client counts and durations.
type plan struct {
	Quick bool
	// Levels are the curve's client counts: starts without a key, with a
	// new key and replays, valruns beside the peer, and the pgbench limit.
	Levels []int
	// ExtraLevels: the other start scenarios (hot key, 100 organisations,
	// the quota organisation, serve + worker) run at those of Levels that
	// are in this list.
	ExtraLevels []int
	// Rounds: how many times each start scenario of the curve runs at a
	// count, on valruns and on the peer in turn (valruns, peer, valruns,
	// peer), and the tracing rows off and on in turn; their row is the
	// rounds' means (mergeRounds). One 6-second run per side moved a ratio
	// at 8 clients by more than its target's margin from run to run.
	Rounds      int
	HTTP, PG    timing
	CleanupKeys int
	Samples     int // start-to-running
	Orgs        int
	Only        map[string]bool
	// The experiment log (issue 15) and the end-to-end curve (issue 30):
	// E2ELevels are the loops' client counts.
	E2E        timing
	E2ELevels  []int
	PgWorkRuns int
	DrainRuns  int
	DrainConc  []int
	// The noisy neighbour (issue 16): its windows, A's flood clients, A's
	// slow runs queued ahead of B's, B's runs behind them, and the
	// settings of each variant.
	Noisy        timing
	NoisyClients int
	NoisyRuns    int
	NoisyB       int
	NoisyEnv     [][]string
	// Horizontal scale (issue 17): the topologies and each loop's window.
	Scale    []scaleTopology
	ScaleDur time.Duration
}

func (p plan) want(part string) bool { return len(p.Only) == 0 || p.Only[part] }

// extra says whether the other start scenarios run at clients.
func (p plan) extra(clients int) bool { return slices.Contains(p.ExtraLevels, clients) }

// e2eMain is the end-to-end count of the baseline, the horizontal scale
// and the experiment log's checks: ratioClients when the curve has it,
// else its largest count.
func (p plan) e2eMain() int { return mainLevel(p.E2ELevels) }

func mainLevel(levels []int) int {
	if len(levels) == 0 || slices.Contains(levels, ratioClients) {
		return ratioClients
	}
	return slices.Max(levels)
}

func makePlan(quick bool) plan {
	if quick {
		return plan{Quick: true, Levels: curveQuickLevels, ExtraLevels: []int{ratioClients}, Rounds: 1,
			HTTP: timing{Warm: 500 * time.Millisecond, Dur: 2 * time.Second},
			PG:   timing{Warm: time.Second, Dur: 2 * time.Second}, CleanupKeys: 100_000, Samples: 20, Orgs: 100,
			E2E: timing{Warm: time.Second, Dur: 5 * time.Second}, E2ELevels: curveQuickLevels, PgWorkRuns: 300, DrainRuns: 3_000, DrainConc: []int{10, 50},
			Noisy: timing{Warm: time.Second, Dur: 10 * time.Second}, NoisyClients: 64, NoisyRuns: 200, NoisyB: 10, NoisyEnv: defaultNoisyEnv,
			Scale: scaleQuick, ScaleDur: 5 * time.Second}
	}
	return plan{Levels: curveLevels, ExtraLevels: extraLevels, Rounds: 2, HTTP: timing{Warm: 2 * time.Second, Dur: 6 * time.Second},
		PG: timing{Warm: time.Second, Dur: 5 * time.Second}, CleanupKeys: 1_000_000, Samples: 100, Orgs: 100,
		E2E: timing{Warm: 2 * time.Second, Dur: 15 * time.Second}, E2ELevels: e2eLevels, PgWorkRuns: 2_000, DrainRuns: 100_000, DrainConc: []int{10, 20, 50, 100},
		Noisy: timing{Warm: 2 * time.Second, Dur: 60 * time.Second}, NoisyClients: 64, NoisyRuns: 1_000, NoisyB: 20, NoisyEnv: defaultNoisyEnv,
		Scale: scaleFull, ScaleDur: 20 * time.Second}
}

func main() {
	// Output piped into a reader that quits (| head) must not kill the
	// harness before it drops its databases and stops its processes.
	signal.Ignore(syscall.SIGPIPE)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// run is one run of the harness: plan it, measure each part the plan
// wants, in this order, then write and judge the results.
func run(ctx context.Context) error {
	p, o, err := parseFlags(flag.CommandLine, os.Args[1:])
	if err != nil {
		return err
	}
	h, err := setUp(ctx, p, o)
	if err != nil {
		return err
	}
	defer h.e.close()

	start, peerSQL := h.captureStarts(ctx)
	if err := h.runCurve(ctx, start, peerSQL); err != nil {
		return err
	}
	if err := h.runTracing(ctx); err != nil {
		return err
	}
	h.runExperimentLog(ctx)
	h.runNoisy(ctx)
	h.runCleanup(ctx)
	h.runLatency(ctx)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return h.finish()
}

// options are where a run reads and writes, beside its plan.
type options struct {
	Out      string // the results' Markdown; an existing file keeps what a partial run did not measure
	Bin      string // the valruns binary
	Scratch  string // logs, the pgbench scripts, baseline builds and results.json
	Baseline string // the git ref the experiment log measures beside Bin ("" or "none": no baseline)
	Port     int    // BENCH_PORT: the first of the harness's HTTP ports
}

func (o options) withBaseline() bool { return o.Baseline != "" && o.Baseline != "none" }

// parseFlags plans a run from its arguments (and QUICK, BENCH_BASELINE,
// BENCH_PORT): quick or full, then each flag given overrides its part of
// that plan.
func parseFlags(fs *flag.FlagSet, args []string) (plan, options, error) {
	quick := fs.Bool("quick", os.Getenv("QUICK") != "" && os.Getenv("QUICK") != "0", "short runs, clients 1, 8 and 32 only (also QUICK=1)")
	out := fs.String("out", "tools/bench/RESULTS.md", "where to write the results")
	bin := fs.String("bin", "bin/valruns", "the valruns binary")
	scratch := fs.String("scratch", "tools/bench/results", "logs, the pgbench script and results.json")
	var levels, e2eClients, drainConc intsFlag
	fs.Var(&levels, "clients", "comma-separated client counts of the start curve (default: 1,4,8,16,32,64,128; quick: 1,8,32); the other start scenarios run at those of 1,8,32,128 (quick: 32)")
	rounds := fs.Int("rounds", 0, "rounds of each curve scenario and of the tracing rows, valruns and the peer (or off and on) in turn (default 2; quick 1)")
	dur := fs.Duration("duration", 0, "measured time of each HTTP run (default 6s; quick 2s)")
	only := fs.String("only", "", "comma-separated parts to run: capture,valruns,peer,pgbench,tracing,cleanup,latency,pgwork,e2e,profile,drain,scale,noisy (default all; e2e includes the peer's)")
	baseline := fs.String("baseline", cmpOr(os.Getenv("BENCH_BASELINE"), defaultBaseline), "git ref the experiment log builds and measures beside this binary (also BENCH_BASELINE; \"none\": no baseline)")
	e2eDur := fs.Duration("e2e-duration", 0, "measured time of each end-to-end loop (default 15s; quick 5s)")
	fs.Var(&e2eClients, "e2e-clients", "comma-separated client counts of the end-to-end curve (default 1,8,32,128; quick 1,8,32); the baseline and the horizontal scale run at 32 (or the largest)")
	noisyDur := fs.Duration("noisy-duration", 0, "noisy neighbour: measured time of each window (default 60s; quick 10s)")
	pgworkRuns := fs.Int("pgwork-runs", 0, "runs started and executed to measure PostgreSQL's work per run (default 2000; quick 300)")
	drainRuns := fs.Int("drain-runs", 0, "runs queued for the backlog drain (default 100000; quick 3000)")
	fs.Var(&drainConc, "drain-concurrency", "WORKER_CONCURRENCY values the drain sweeps (default 10,20,50,100; quick 10,50)")
	cleanupKeys := fs.Int("cleanup-keys", 0, "expired keys the cleanup measurement deletes (default 1000000; quick 100000)")
	noisyRuns := fs.Int("noisy-runs", 0, "noisy neighbour: A's slow runs queued ahead of B's (default 1000; quick 200)")
	noisyClients := fs.Int("noisy-clients", 0, "noisy neighbour: clients of A's flood (default 64)")
	var noisyEnv settingsFlag
	fs.Var(&noisyEnv, "noisy-env", "noisy neighbour: one variant's settings for serve and worker, space-separated NAME=value (NAME=: the service's default); repeat for more variants "+
		"(default: \"ORG_START_RATE=0 ORG_RUN_SHARE=1000000\", \"ORG_START_RATE=0 ORG_RUN_SHARE=\", \"ORG_START_RATE= ORG_RUN_SHARE=\")")
	if err := fs.Parse(args); err != nil {
		return plan{}, options{}, err
	}

	p := makePlan(*quick)
	override(&p.HTTP.Dur, *dur)
	override(&p.Rounds, *rounds)
	override(&p.E2E.Dur, *e2eDur)
	override(&p.Noisy.Dur, *noisyDur)
	override(&p.PgWorkRuns, *pgworkRuns)
	override(&p.DrainRuns, *drainRuns)
	override(&p.CleanupKeys, *cleanupKeys)
	override(&p.NoisyRuns, *noisyRuns)
	override(&p.NoisyClients, *noisyClients)
	if levels != nil {
		p.Levels = levels
	}
	if e2eClients != nil {
		p.E2ELevels = e2eClients
	}
	if drainConc != nil {
		p.DrainConc = drainConc
	}
	if noisyEnv != nil {
		p.NoisyEnv = noisyEnv
	}
	if *only != "" {
		p.Only = map[string]bool{}
		for _, f := range strings.Split(*only, ",") {
			p.Only[strings.TrimSpace(f)] = true
		}
	}
	o := options{Out: *out, Bin: *bin, Scratch: *scratch, Baseline: *baseline, Port: 18080}
	if v := os.Getenv("BENCH_PORT"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return plan{}, options{}, fmt.Errorf("BENCH_PORT=%q: want a port number", v)
		}
		o.Port = n
	}
	return p, o, nil
}

// override sets a part of the plan to a flag's value when the flag was
// given: 0, the flag's default, keeps the plan's (and so does a negative).
func override[T int | time.Duration](dst *T, v T) {
	if v > 0 {
		*dst = v
	}
}

// harness is one run under way: its plan, where it writes, the
// environment every part measures in, and the results so far.
type harness struct {
	p          plan
	o          options
	root       string // the repository's root: the working directory
	scratchDir string // o.Scratch, absolute
	began      time.Time
	e          *env
	res        *results
}

// setUp checks the binary, makes the scratch directory, says what the run
// will do and how long it should take, and opens the environment (the
// template database, Redis). The caller closes h.e.
func setUp(ctx context.Context, p plan, o options) (*harness, error) {
	root, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	binPath, err := filepath.Abs(o.Bin)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(binPath); err != nil {
		return nil, fmt.Errorf("%s: build it first (make build)", o.Bin)
	}
	scratchDir, err := filepath.Abs(o.Scratch)
	if err != nil {
		return nil, err
	}
	logDir := filepath.Join(scratchDir, "logs")
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return nil, err
	}

	began := time.Now()
	say("plan: %s", p.describe(o.withBaseline()))
	say("estimated time: about %s (from runs on 2 cores; more on a slower or busier machine)", p.estimate(o.withBaseline()).Round(time.Minute))
	say("setting up: template database with %d organisations, tokens and workflows", p.Orgs)
	e, err := openEnv(ctx, root, binPath, logDir, p.Orgs, o.Port)
	if err != nil {
		return nil, err
	}

	res := &results{Mode: "full", Date: began, Levels: p.Levels, Timing: p.HTTP, PgTiming: p.PG}
	if p.Quick {
		res.Mode = "quick"
	}
	res.Machine = e.machine(ctx, root)
	res.Redis = "private redis-server started by the harness"
	if e.redisProc == nil {
		res.Redis = "BENCH_REDIS_URL " + e.redisURL
	}
	return &harness{p: p, o: o, root: root, scratchDir: scratchDir, began: began, e: e, res: res}, nil
}

// captureStarts captures the SQL of a new-key start of valruns and, when
// the curve needs its limit, of the peer's, and returns the pgbench
// scripts made from them (without a Path when not captured).
func (h *harness) captureStarts(ctx context.Context) (start, peerSQL sqlScript) {
	start = sqlScript{Scenario: pgbenchScenario(1), UsageSlots: true}
	peerSQL = sqlScript{Scenario: pgbenchPeerScenario}
	if !h.p.want("capture") && !h.p.want("pgbench") {
		return start, peerSQL
	}
	capture := func(what string, cp *captured, sc *sqlScript, run func(context.Context, string) captured) {
		say("capturing the SQL of %s", what)
		*cp = run(ctx, h.scratchDir)
		if cp.Err != nil {
			say("capture failed: %v", cp.Err)
			return
		}
		say("captured %d statements in %d round trips", len(cp.A.Stmts), cp.Script.RoundTrips)
		if err := h.e.checkScript(ctx, cp.Path, cp.Script.MaxOrgs); err != nil {
			cp.Err = err
			say("%v", err)
			return
		}
		sc.Path = cp.Path
	}
	capture("a new-key start", &h.res.Capture, &start, h.e.captureStart)
	// The peer's start is the curve's limit: pgbench of its INSERT.
	if h.p.want("peer") || h.p.want("pgbench") {
		capture("the peer's new-key start", &h.res.PeerCapture, &peerSQL, h.e.capturePeer)
	}
	return start, peerSQL
}

// runCurve measures the curve, interleaved per client count: at each
// count valruns and the peer run back to back, scenario by scenario, then
// the pgbench limit, so that the runs a ratio compares are close in time
// on a machine whose load drifts.
func (h *harness) runCurve(ctx context.Context, start, peerSQL sqlScript) error {
	for _, c := range h.p.Levels {
		if err := h.runSteps(ctx, startSteps(ctx, h.e, h.p, c, start, peerSQL)); err != nil {
			return err
		}
	}
	return nil
}

// runSteps runs steps in order and records one row per scenario: a
// scenario that ran in rounds (several steps) is their merge.
func (h *harness) runSteps(ctx context.Context, steps []startStep) error {
	var order []string
	rounds := map[string][]row{}
	for _, step := range steps {
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
		h.res.Rows = append(h.res.Rows, mergeRounds(rounds[k]))
	}
	return nil
}

// runTracing measures the cost of tracing at 32 clients: off and on in
// turn, p.Rounds times (tracingSteps), a row each for off and for on.
func (h *harness) runTracing(ctx context.Context) error {
	if !h.p.want("tracing") {
		return nil
	}
	return h.runSteps(ctx, tracingSteps(ctx, h.e, h.p))
}

// runExperimentLog measures the experiment log's parts: PostgreSQL's work
// per run, end to end beside the baseline, the profile, the backlog drain
// and the horizontal scale.
func (h *harness) runExperimentLog(ctx context.Context) {
	if (h.p.want("pgwork") || h.p.want("e2e") || h.p.want("profile") || h.p.want("drain") || h.p.want("scale")) && ctx.Err() == nil {
		h.res.Exp = runExperiments(ctx, h.e, h.p, h.o.Baseline, h.root, h.scratchDir)
	}
}

// runNoisy measures the noisy neighbour: a quiet organisation beside one
// that floods, per set of settings.
func (h *harness) runNoisy(ctx context.Context) {
	if h.p.want("noisy") && ctx.Err() == nil {
		h.res.Noisy = measureNoisy(ctx, h.e, h.p, h.root)
	}
}

// runCleanup measures the deletion of expired keys, alone and under starts.
func (h *harness) runCleanup(ctx context.Context) {
	if !h.p.want("cleanup") || ctx.Err() != nil {
		return
	}
	say("cleanup: %d expired keys", h.p.CleanupKeys)
	c := h.e.measureCleanup(ctx, h.p.CleanupKeys, ratioClients, h.p.HTTP)
	h.res.Cleanup = &c
	if c.Failed != "" {
		say("cleanup failed: %s", c.Failed)
	} else {
		say("cleanup: %.0f keys/s alone; p99 %s ms without, %s ms during", c.KeysPerSec(), ms(c.Baseline.P99), ms(c.During.P99))
	}
}

// runLatency measures start-to-running with one client.
func (h *harness) runLatency(ctx context.Context) {
	if !h.p.want("latency") || ctx.Err() != nil {
		return
	}
	say("start-to-running latency, %d runs", h.p.Samples)
	l := h.e.measureStartToRunning(ctx, h.p.Samples)
	h.res.Latency = &l
	if l.Failed != "" {
		say("latency failed: %s", l.Failed)
	} else {
		say("start-to-running p50 %s ms, p99 %s ms", ms(percentile(l.Observed, .5)), ms(percentile(l.Observed, .99)))
	}
}

// finish writes the results (Markdown and results.json), prints the
// checks, and returns an error when an answer was wrong, a run failed, or
// a check of the experiment log or the noisy neighbour failed.
func (h *harness) finish() error {
	res := h.res
	res.Elapsed = time.Since(h.began)
	res.Machine.LoadEnd = loadavg()
	if err := h.write(); err != nil {
		return err
	}

	fmt.Println()
	if !res.onlySections() { // else the start table was not measured: its checks would all say "no data"
		if len(res.curveRan()) > 0 {
			printChecks(res.curveStartChecks())
		}
		printChecks(res.checks())
	}
	if res.Exp != nil {
		if len(res.Exp.E2E) > 0 {
			printChecks(res.Exp.curveChecks())
		}
		printChecks(res.Exp.checks())
	}
	out := h.o.Out
	fmt.Printf("\nwrote %s in %s\n", out, res.Elapsed.Round(time.Second))
	if n := res.totalErrors(); n > 0 {
		return fmt.Errorf("%d answers were errors, non-2xx or unexpected (they must be 0): see %s", n, out)
	}
	for _, r := range res.Rows {
		if r.Failed != "" {
			return fmt.Errorf("some runs failed: see %s", out)
		}
	}
	if res.Noisy != nil {
		printChecks(res.Noisy.checks())
	}
	if res.Exp != nil {
		if err := res.Exp.failure(); err != nil {
			return fmt.Errorf("%v: see %s", err, out)
		}
	}
	if res.Noisy != nil {
		if err := res.Noisy.failure(); err != nil {
			return fmt.Errorf("%v: see %s", err, out)
		}
	}
	return nil
}

// write writes the results' Markdown to o.Out and the raw numbers to
// results.json in the scratch directory. When only the experiment log or
// the noisy neighbour ran, it replaces their sections of the existing
// results and keeps the rest as it was measured.
func (h *harness) write() error {
	res := h.res
	md := res.markdown()
	if res.onlySections() {
		old, err := os.ReadFile(h.o.Out)
		if err != nil && !os.IsNotExist(err) {
			return err
		}
		md = string(old)
		if res.Exp != nil {
			if e2e := res.e2eCurveMarkdown(); e2e != "" {
				md = spliceSectionBefore(md, e2eCurveHeading, e2e, expHeading)
			}
			md = spliceSection(md, expHeading, res.Exp.markdown())
		}
		if res.Noisy != nil {
			md = spliceSection(md, noisyHeading, res.Noisy.markdown())
		}
	}
	if err := os.WriteFile(h.o.Out, []byte(md), 0o644); err != nil {
		return err
	}
	raw, _ := json.MarshalIndent(res, "", "  ")
	_ = os.WriteFile(filepath.Join(h.scratchDir, "results.json"), raw, 0o644)
	return nil
}

// intsFlag is a flag of comma-separated positive numbers (nil: not given).
type intsFlag []int

func (f *intsFlag) String() string { return fmt.Sprint([]int(*f)) }

func (f *intsFlag) Set(v string) error {
	ns, err := parseInts(v)
	*f = ns
	return err
}

// settingsFlag is a repeatable flag: each use is one list of NAME=value.
type settingsFlag [][]string

func (f *settingsFlag) String() string { return fmt.Sprint([][]string(*f)) }

func (f *settingsFlag) Set(v string) error {
	kvs := strings.Fields(v)
	for _, kv := range kvs {
		if name, _, ok := strings.Cut(kv, "="); !ok || name == "" {
			return fmt.Errorf("%q: want NAME=value settings separated by spaces", kv)
		}
	}
	*f = append(*f, kvs)
	return nil
}

func say(format string, args ...any) {
	fmt.Printf("bench: "+format+"\n", args...)
}

func progress(r row) {
	if r.Failed != "" {
		say("%-8s %-28s c=%-3d FAILED: %s", r.Section, r.Scenario, r.Clients, short(r.Failed, 200))
		return
	}
	bad := ""
	if n := r.Errors + r.Non2xx + r.Unexpect; n > 0 {
		bad = fmt.Sprintf("  ERRORS %d/%d/%d", r.Errors, r.Non2xx, r.Unexpect)
	}
	say("%-8s %-28s c=%-3d %8.0f rps  p50 %6s  p99 %7s ms%s", r.Section, r.Scenario, r.Clients, r.RPS, ms(r.P50), ms(r.P99), bad)
}

// parseInts reads a comma-separated list of positive numbers.
func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q: want positive numbers such as 10,20,50", s)
		}
		out = append(out, n)
	}
	return out, nil
}
