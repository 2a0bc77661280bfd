// Command bench is valruns' benchmark harness (`make bench`, from the
// repository's root): the real binary beside the peer and pgbench's limit,
// written to tools/bench/RESULTS.md with each part's targets (README.md).
package main

import (
	"cmp"
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
	// Levels are the start curve's client counts; Rounds how many times each
	// scenario runs at a count, the sides in turn (one run is too noisy).
	Levels   []int
	Rounds   int
	HTTP, PG timing
	// End to end: the loops' client counts and windows.
	E2ELevels []int
	E2E       timing
	// The long poll: its client counts, its rounds (sides in turn), its windows.
	WaitLevels []int
	WaitRounds int
	Wait       timing
	// ProfileClients: the loads of the profile, one run each.
	ProfileClients []int
	// The noisy neighbour: its windows, A's flood clients, A's slow runs
	// queued ahead of B's, B's runs behind them, the settings of each variant.
	Noisy                           timing
	NoisyClients, NoisyRuns, NoisyB int
	NoisyEnv                        [][]string
	CleanupKeys                     []int
	Only                            map[string]bool
	// The results' Markdown, the valruns binary, the scratch directory (logs,
	// the CPU profile, results.json); BENCH_PORT, the first of its ports.
	Out, Bin, Scratch string
	Port              int
}

// parts are what -only may name, in the order they run.
var parts = []string{"valruns", "peer", "pgbench", "e2e", "wait", "profile", "noisy", "cleanup"}

func (p plan) want(part string) bool { return len(p.Only) == 0 || p.Only[part] }

func makePlan(quick bool) plan {
	if quick {
		return plan{Quick: true, Levels: []int{1, 8, 32}, Rounds: 1,
			HTTP: timing{Warm: 500 * time.Millisecond, Dur: 2 * time.Second}, PG: timing{Warm: time.Second, Dur: 2 * time.Second},
			E2ELevels: []int{1, 8, 32}, E2E: timing{Warm: time.Second, Dur: 5 * time.Second},
			WaitLevels: []int{1, 8}, WaitRounds: 1, Wait: timing{Warm: time.Second, Dur: 5 * time.Second}, ProfileClients: []int{1, 8},
			Noisy: timing{Warm: time.Second, Dur: 10 * time.Second}, NoisyClients: 64, NoisyRuns: 200, NoisyB: 10, NoisyEnv: defaultNoisyEnv,
			CleanupKeys: []int{100_000}}
	}
	return plan{Levels: []int{1, 4, 8, 16, 32, 64, 128}, Rounds: 2,
		HTTP: timing{Warm: 2 * time.Second, Dur: 6 * time.Second}, PG: timing{Warm: time.Second, Dur: 5 * time.Second},
		E2ELevels: []int{1, 8, 32, 128}, E2E: timing{Warm: 2 * time.Second, Dur: 15 * time.Second},
		WaitLevels: []int{1, 8}, WaitRounds: 3, Wait: timing{Warm: 2 * time.Second, Dur: 15 * time.Second}, ProfileClients: []int{1, 8},
		Noisy: timing{Warm: 2 * time.Second, Dur: 60 * time.Second}, NoisyClients: 64, NoisyRuns: 1_000, NoisyB: 20, NoisyEnv: defaultNoisyEnv,
		CleanupKeys: []int{1_000_000, 10_000_000}}
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

// parseFlags plans a run from its arguments (and QUICK, BENCH_PORT): quick
// or full, then each flag given overrides its part of that plan.
func parseFlags(fs *flag.FlagSet, args []string) (plan, error) {
	quick := os.Getenv("QUICK") != "" && os.Getenv("QUICK") != "0" || slices.Contains(args, "-quick") || slices.Contains(args, "--quick")
	p := makePlan(quick)
	fs.Bool("quick", quick, "short runs, clients 1, 8 and 32 only (also QUICK=1)")
	fs.StringVar(&p.Out, "out", "tools/bench/RESULTS.md", "where to write the results")
	fs.StringVar(&p.Bin, "bin", "bin/valruns", "the valruns binary")
	fs.StringVar(&p.Scratch, "scratch", "tools/bench/results", "logs, the CPU profile and results.json")
	only := fs.String("only", "", "comma-separated parts to run: "+strings.Join(parts, ",")+" (default all)")
	fs.Var((*intsFlag)(&p.Levels), "clients", "comma-separated client counts of the start curve")
	fs.IntVar(&p.Rounds, "rounds", p.Rounds, "rounds of each start scenario, valruns and the peer in turn")
	fs.DurationVar(&p.HTTP.Dur, "duration", p.HTTP.Dur, "measured time of each start run (and pgbench run)")
	fs.Var((*intsFlag)(&p.E2ELevels), "e2e-clients", "comma-separated client counts of end to end")
	fs.DurationVar(&p.E2E.Dur, "e2e-duration", p.E2E.Dur, "measured time of each end-to-end loop")
	fs.Var((*intsFlag)(&p.WaitLevels), "wait-clients", "comma-separated client counts of the long poll")
	fs.IntVar(&p.WaitRounds, "wait-rounds", p.WaitRounds, "rounds of the long poll, valruns and the peer in turn")
	fs.DurationVar(&p.Wait.Dur, "wait-duration", p.Wait.Dur, "measured time of each long-poll round")
	fs.Var((*intsFlag)(&p.ProfileClients), "profile-clients", "comma-separated client counts of the profile, one run each")
	fs.DurationVar(&p.Noisy.Dur, "noisy-duration", p.Noisy.Dur, "noisy neighbour: measured time of each window")
	fs.IntVar(&p.NoisyRuns, "noisy-runs", p.NoisyRuns, "noisy neighbour: A's slow runs queued ahead of B's")
	fs.IntVar(&p.NoisyClients, "noisy-clients", p.NoisyClients, "noisy neighbour: clients of A's flood")
	var noisyEnv settingsFlag
	fs.Var(&noisyEnv, "noisy-env", "noisy neighbour: one variant's settings for serve and worker, space-separated NAME=value "+
		"(NAME=: the service's default); repeat for more variants (default: the three of defaultNoisyEnv)")
	fs.Var((*intsFlag)(&p.CleanupKeys), "cleanup-keys", "comma-separated counts of expired keys the cleanup deletes, one measurement each")
	if err := fs.Parse(args); err != nil {
		return plan{}, err
	}
	if fs.Lookup("duration").Value.String() != fs.Lookup("duration").DefValue {
		p.PG.Dur = p.HTTP.Dur
	}
	if noisyEnv != nil {
		p.NoisyEnv = noisyEnv
	}
	if *only != "" {
		p.Only = map[string]bool{}
		for _, f := range strings.Split(*only, ",") {
			if f = strings.TrimSpace(f); !slices.Contains(parts, f) {
				return plan{}, fmt.Errorf("-only %q: want some of %s", f, strings.Join(parts, ","))
			}
			p.Only[f] = true
		}
	}
	var err error
	if p.Port, err = strconv.Atoi(cmp.Or(os.Getenv("BENCH_PORT"), "18080")); err != nil {
		return plan{}, fmt.Errorf("BENCH_PORT=%q: want a port number", os.Getenv("BENCH_PORT"))
	}
	return p, nil
}

// run is one run of the harness: each part the plan wants, then the results.
func run(ctx context.Context) error {
	p, err := parseFlags(flag.CommandLine, os.Args[1:])
	if err != nil {
		return err
	}
	root, _ := os.Getwd()
	bin, _ := filepath.Abs(p.Bin)
	scratch, _ := filepath.Abs(p.Scratch)
	if _, err := os.Stat(bin); err != nil {
		return fmt.Errorf("%s: build it first (make build)", p.Bin)
	}
	if err := os.MkdirAll(filepath.Join(scratch, "logs"), 0o755); err != nil {
		return err
	}
	began := time.Now()
	say("setting up: the template database")
	e, err := openEnv(ctx, root, bin, filepath.Join(scratch, "logs"), p.Port)
	if err != nil {
		return err
	}
	defer e.close()
	res := &results{Mode: "full", Date: began, Timing: p.HTTP, PgTiming: p.PG, Machine: e.machine(), Commit: firstLine("git", "-C", root, "describe", "--always", "--dirty"), Partial: len(p.Only) > 0}
	if p.Quick {
		res.Mode = "quick (short runs, to check the harness: do not quote these numbers)"
	}
	if err := measureCurve(ctx, e, p, res); err != nil {
		return err
	}
	// part measures a part when the plan wants it and the run goes on.
	part := func(name string, measure func()) {
		if p.want(name) && ctx.Err() == nil {
			measure()
		}
	}
	part("e2e", func() { res.E2E, res.E2ETiming = measureE2ECurve(ctx, e, p), p.E2E })
	part("wait", func() { res.Wait, res.WaitTiming = measureWait(ctx, e, p), p.Wait })
	for _, n := range p.ProfileClients {
		part("profile", func() { res.Profile = append(res.Profile, e.measureProfile(ctx, n, p.E2E, scratch)) })
	}
	part("noisy", func() { res.Noisy = measureNoisy(ctx, e, p) })
	for _, n := range p.CleanupKeys {
		part("cleanup", func() { res.Cleanup = append(res.Cleanup, e.measureCleanup(ctx, n, p.HTTP)) })
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	res.Elapsed = time.Since(began)
	res.Machine = append(res.Machine, [2]string{"load average (1 min) after", loadavg()})
	return finish(res, p.Out, scratch)
}

// finish writes the results (Markdown and results.json), prints every
// target, and returns an error when an answer was wrong or a run failed.
func finish(res *results, out, scratch string) error {
	old, err := os.ReadFile(out)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	if err := os.WriteFile(out, []byte(res.markdown(string(old))), 0o644); err != nil {
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
	fmt.Printf("\nwrote %s in %s\n", out, res.Elapsed.Round(time.Second))
	if errs := res.failures(); len(errs) > 0 {
		return fmt.Errorf("%s: see %s", strings.Join(errs, "; "), out)
	}
	return nil
}

// intsFlag is a flag of comma-separated positive numbers.
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

func say(format string, args ...any) { fmt.Printf("bench: "+format+"\n", args...) }
