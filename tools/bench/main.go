// Command bench is valruns' benchmark harness (`make bench`). It drives the
// real binary (`valruns serve`, `valruns worker`) with a closed-loop load
// generator, beside the peer a team would otherwise pick (tools/bench/peer:
// Express + express-idempotency on Redis + pg) and the database's own limit
// (pgbench), and writes tools/bench/RESULTS.md: one section per part, each
// with its targets and PASS or MISS.
//
// It uses PostgreSQL at DATABASE_URL (databases valruns_bench_<pid>_*,
// dropped at the end), a private redis-server (or BENCH_REDIS_URL, which
// it flushes), and HTTP ports BENCH_PORT..BENCH_PORT+3 (default 18080).
// It runs from the repository's root: scripts/bench.sh builds it into
// bin/valruns-bench and runs it there.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// plan is one run's choice of parts, client counts and durations.
type plan struct {
	Quick bool
	// Levels are the start curve's client counts; Rounds how many times
	// each scenario runs at a count, valruns and the peer in turn (one
	// 6-second run per side moved a ratio by more than its target's margin).
	Levels   []int
	Rounds   int
	HTTP, PG timing
	// End to end: the loops' client counts and windows.
	E2ELevels []int
	E2E       timing
	// ProfileClients: the load of the profile.
	ProfileClients int
	// The noisy neighbour: its windows, A's flood clients, A's slow runs
	// queued ahead of B's, B's runs behind them, the settings of each variant.
	Noisy        timing
	NoisyClients int
	NoisyRuns    int
	NoisyB       int
	NoisyEnv     [][]string
	CleanupKeys  int
	Only         map[string]bool
}

// parts are what -only may name, in the order they run.
var parts = []string{"valruns", "peer", "pgbench", "e2e", "profile", "noisy", "cleanup"}

func (p plan) want(part string) bool { return len(p.Only) == 0 || p.Only[part] }

func makePlan(quick bool) plan {
	if quick {
		return plan{Quick: true, Levels: []int{1, 8, 32}, Rounds: 1,
			HTTP: timing{Warm: 500 * time.Millisecond, Dur: 2 * time.Second}, PG: timing{Warm: time.Second, Dur: 2 * time.Second},
			E2ELevels: []int{1, 8, 32}, E2E: timing{Warm: time.Second, Dur: 5 * time.Second}, ProfileClients: 8,
			Noisy: timing{Warm: time.Second, Dur: 10 * time.Second}, NoisyClients: 64, NoisyRuns: 200, NoisyB: 10, NoisyEnv: defaultNoisyEnv,
			CleanupKeys: 100_000}
	}
	return plan{Levels: []int{1, 4, 8, 16, 32, 64, 128}, Rounds: 2,
		HTTP: timing{Warm: 2 * time.Second, Dur: 6 * time.Second}, PG: timing{Warm: time.Second, Dur: 5 * time.Second},
		E2ELevels: []int{1, 8, 32, 128}, E2E: timing{Warm: 2 * time.Second, Dur: 15 * time.Second}, ProfileClients: 8,
		Noisy: timing{Warm: 2 * time.Second, Dur: 60 * time.Second}, NoisyClients: 64, NoisyRuns: 1_000, NoisyB: 20, NoisyEnv: defaultNoisyEnv,
		CleanupKeys: 1_000_000}
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

// options are where a run reads and writes, beside its plan.
type options struct {
	Out     string // the results' Markdown; a partial run replaces only its sections
	Bin     string // the valruns binary
	Scratch string // logs, the CPU profile and results.json
	Port    int    // BENCH_PORT: the first of the harness's HTTP ports
}

// parseFlags plans a run from its arguments (and QUICK, BENCH_PORT): quick
// or full, then each flag given overrides its part of that plan.
func parseFlags(fs *flag.FlagSet, args []string) (plan, options, error) {
	quick := fs.Bool("quick", os.Getenv("QUICK") != "" && os.Getenv("QUICK") != "0", "short runs, clients 1, 8 and 32 only (also QUICK=1)")
	out := fs.String("out", "tools/bench/RESULTS.md", "where to write the results")
	bin := fs.String("bin", "bin/valruns", "the valruns binary")
	scratch := fs.String("scratch", "tools/bench/results", "logs, the CPU profile and results.json")
	var levels, e2eClients intsFlag
	fs.Var(&levels, "clients", "comma-separated client counts of the start curve (default 1,4,8,16,32,64,128; quick 1,8,32)")
	rounds := fs.Int("rounds", 0, "rounds of each start scenario, valruns and the peer in turn (default 2; quick 1)")
	dur := fs.Duration("duration", 0, "measured time of each start run and pgbench run (default 6s and 5s; quick 2s)")
	only := fs.String("only", "", "comma-separated parts to run: "+strings.Join(parts, ",")+" (default all)")
	fs.Var(&e2eClients, "e2e-clients", "comma-separated client counts of end to end (default 1,8,32,128; quick 1,8,32)")
	e2eDur := fs.Duration("e2e-duration", 0, "measured time of each end-to-end loop (default 15s; quick 5s)")
	profileClients := fs.Int("profile-clients", 0, "clients of the profile (default 8)")
	noisyDur := fs.Duration("noisy-duration", 0, "noisy neighbour: measured time of each window (default 60s; quick 10s)")
	noisyRuns := fs.Int("noisy-runs", 0, "noisy neighbour: A's slow runs queued ahead of B's (default 1000; quick 200)")
	noisyClients := fs.Int("noisy-clients", 0, "noisy neighbour: clients of A's flood (default 64)")
	var noisyEnv settingsFlag
	fs.Var(&noisyEnv, "noisy-env", "noisy neighbour: one variant's settings for serve and worker, space-separated NAME=value (NAME=: the service's default); repeat for more variants "+
		"(default: \"ORG_START_RATE=0 ORG_RUN_SHARE=1000000\", \"ORG_START_RATE=0 ORG_RUN_SHARE=\", \"ORG_START_RATE= ORG_RUN_SHARE=\")")
	cleanupKeys := fs.Int("cleanup-keys", 0, "expired keys the cleanup deletes (default 1000000; quick 100000)")
	if err := fs.Parse(args); err != nil {
		return plan{}, options{}, err
	}

	p := makePlan(*quick)
	override(&p.HTTP.Dur, *dur)
	override(&p.PG.Dur, *dur)
	override(&p.Rounds, *rounds)
	override(&p.E2E.Dur, *e2eDur)
	override(&p.ProfileClients, *profileClients)
	override(&p.Noisy.Dur, *noisyDur)
	override(&p.NoisyRuns, *noisyRuns)
	override(&p.NoisyClients, *noisyClients)
	override(&p.CleanupKeys, *cleanupKeys)
	if levels != nil {
		p.Levels = levels
	}
	if e2eClients != nil {
		p.E2ELevels = e2eClients
	}
	if noisyEnv != nil {
		p.NoisyEnv = noisyEnv
	}
	if *only != "" {
		p.Only = map[string]bool{}
		for _, f := range strings.Split(*only, ",") {
			f = strings.TrimSpace(f)
			if !strings.Contains(","+strings.Join(parts, ",")+",", ","+f+",") {
				return plan{}, options{}, fmt.Errorf("-only %q: want some of %s", f, strings.Join(parts, ","))
			}
			p.Only[f] = true
		}
	}
	o := options{Out: *out, Bin: *bin, Scratch: *scratch, Port: 18080}
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

// run is one run of the harness: measure each part the plan wants, in
// order, then write and judge the results.
func run(ctx context.Context) error {
	p, o, err := parseFlags(flag.CommandLine, os.Args[1:])
	if err != nil {
		return err
	}
	binPath, err := filepath.Abs(o.Bin)
	if err != nil {
		return err
	}
	if _, err := os.Stat(binPath); err != nil {
		return fmt.Errorf("%s: build it first (make build)", o.Bin)
	}
	root, err := os.Getwd()
	if err != nil {
		return err
	}
	scratch, err := filepath.Abs(o.Scratch)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(scratch, "logs"), 0o755); err != nil {
		return err
	}
	began := time.Now()
	say("setting up: template database, Redis")
	e, err := openEnv(ctx, root, binPath, filepath.Join(scratch, "logs"), o.Port)
	if err != nil {
		return err
	}
	defer e.close()
	res := &results{Mode: "full", Date: began, Levels: p.Levels, Timing: p.HTTP, PgTiming: p.PG, Machine: e.machine(ctx, root), Partial: len(p.Only) > 0}
	if p.Quick {
		res.Mode = "quick"
	}

	if err := measureCurve(ctx, e, p, res); err != nil {
		return err
	}
	if p.want("e2e") {
		res.E2E, res.E2ETiming = measureE2ECurve(ctx, e, p), p.E2E
	}
	if p.want("profile") && ctx.Err() == nil {
		say("profile: where the time goes, %d clients", p.ProfileClients)
		r := e.measureProfile(ctx, p.ProfileClients, p.E2E.Warm, p.E2E.Dur, scratch)
		res.Profile = &r
	}
	if p.want("noisy") && ctx.Err() == nil {
		res.Noisy = measureNoisy(ctx, e, p)
	}
	if p.want("cleanup") && ctx.Err() == nil {
		say("cleanup: %d expired keys", p.CleanupKeys)
		c := e.measureCleanup(ctx, p.CleanupKeys, cleanupClients, p.HTTP)
		res.Cleanup = &c
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	res.Elapsed = time.Since(began)
	res.Machine.LoadEnd = loadavg()
	return finish(res, o, scratch)
}

// finish writes the results (Markdown and results.json), prints every
// target, and returns an error when an answer was wrong or a run failed.
func finish(res *results, o options, scratch string) error {
	old, err := os.ReadFile(o.Out)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	if err := os.WriteFile(o.Out, []byte(res.markdown(string(old))), 0o644); err != nil {
		return err
	}
	raw, _ := json.MarshalIndent(res, "", "  ")
	_ = os.WriteFile(filepath.Join(scratch, "results.json"), raw, 0o644)
	fmt.Println()
	for _, s := range res.sections() {
		for _, c := range s.Checks {
			fmt.Printf("  %-12s %-70s %s (target %s)\n", c.result(), c.Name, c.Measured, c.Target)
		}
	}
	fmt.Printf("\nwrote %s in %s\n", o.Out, res.Elapsed.Round(time.Second))
	if errs := res.failures(); len(errs) > 0 {
		return fmt.Errorf("%s: see %s", strings.Join(errs, "; "), o.Out)
	}
	return nil
}

// intsFlag is a flag of comma-separated positive numbers (nil: not given).
type intsFlag []int

func (f *intsFlag) String() string { return fmt.Sprint([]int(*f)) }

func (f *intsFlag) Set(v string) error {
	*f = nil
	for _, s := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return fmt.Errorf("%q: want positive numbers such as 1,8,32", v)
		}
		*f = append(*f, n)
	}
	return nil
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
