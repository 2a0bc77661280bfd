package main

// The plan's estimated time, printed before anything runs, so that a
// user who asked for the full curve knows to expect most of an hour.

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// What a run costs beyond its warm-up and window (a fresh database, the
// processes started, ready and stopped, the runs drained and counted), and
// the parts whose time is not a window: measured on the 2-core box the
// lead benchmarks on, rounded up.
const (
	httpOverhead    = time.Second
	pgbenchOverhead = time.Second
	e2eOverhead     = 3 * time.Second
	setupTime       = 10 * time.Second // the template: 100 organisations, tokens, workflows
	captureTime     = 5 * time.Second  // each side's capture and the check of its script
	latencyPerRun   = 60 * time.Millisecond
	drainQueueRate  = 5_000 // runs queued per second through the API
	drainPointTime  = 30 * time.Second
	cleanupRate     = 50_000 // keys inserted, then deleted, per second
	pgworkRate      = 500    // runs started, then executed, per second
	slowRunTime     = 60 * time.Millisecond
)

// startRuns counts the start table's HTTP runs and pgbench runs.
func (p plan) startRuns() (http, pgbench int) {
	for _, c := range p.Levels {
		for _, s := range startSteps(context.Background(), nil, p, c, sqlScript{}, sqlScript{}) {
			if s.Section == "pgbench" {
				pgbench++
			} else {
				http++
			}
		}
	}
	return http, pgbench
}

// e2eLoops counts the end-to-end curve's loops: this binary and the peer
// in two modes at every count, the baseline at the checks' count.
func (p plan) e2eLoops(baseline bool) int {
	n := 4 * len(p.E2ELevels)
	if baseline {
		n += 2
	}
	return n
}

// estimate is how long the plan takes, roughly.
func (p plan) estimate(baseline bool) time.Duration {
	http, pgbench := p.startRuns()
	httpRun := p.HTTP.Warm + p.HTTP.Dur + httpOverhead
	d := setupTime + time.Duration(http)*httpRun + time.Duration(pgbench)*(p.PG.Warm+p.PG.Dur+pgbenchOverhead)
	if p.want("capture") || p.want("pgbench") {
		d += 2 * captureTime
	}
	if p.want("tracing") {
		d += time.Duration(2*max(p.Rounds, 1)) * httpRun
	}
	if p.want("cleanup") {
		d += 2*httpRun + 2*rateTime(p.CleanupKeys, cleanupRate)
	}
	if p.want("latency") {
		d += httpOverhead + time.Duration(p.Samples)*latencyPerRun
	}
	sides := 1
	if baseline {
		sides = 2
	}
	if p.want("pgwork") || p.want("e2e") || p.want("drain") || p.want("scale") || p.want("profile") {
		d += time.Duration(sides) * setupTime
	}
	if p.want("pgwork") {
		d += time.Duration(sides) * 2 * (rateTime(p.PgWorkRuns, pgworkRate) + httpOverhead)
	}
	e2eLoop := p.E2E.Warm + p.E2E.Dur + e2eOverhead
	if p.want("e2e") {
		d += time.Duration(p.e2eLoops(baseline)) * e2eLoop
	}
	if p.want("profile") {
		d += e2eLoop
	}
	if p.want("drain") {
		d += rateTime(p.DrainRuns, drainQueueRate) + time.Duration(len(p.DrainConc))*drainPointTime
	}
	if p.want("scale") {
		d += time.Duration(len(p.Scale)) * (p.E2E.Warm + p.ScaleDur + e2eOverhead)
	}
	if p.want("noisy") {
		window := p.Noisy.Warm + p.Noisy.Dur + e2eOverhead
		backlog := time.Duration(p.NoisyRuns)*slowRunTime + e2eOverhead
		d += time.Duration(len(p.NoisyEnv)) * (3*window + backlog)
	}
	return d
}

func rateTime(n, perSec int) time.Duration {
	return time.Duration(n) * time.Second / time.Duration(perSec)
}

// describe says what the plan measures, in a line.
func (p plan) describe(baseline bool) string {
	http, pgbench := p.startRuns()
	var parts []string
	if http+pgbench > 0 {
		parts = append(parts, fmt.Sprintf("starts at clients %s: %d HTTP runs of %s + %s, %d pgbench runs",
			levelsText(p.Levels, 0), http, p.HTTP.Warm, p.HTTP.Dur, pgbench))
	}
	if p.want("e2e") {
		parts = append(parts, fmt.Sprintf("end to end at clients %s: %d loops of %s + %s", levelsText(p.E2ELevels, 0),
			p.e2eLoops(baseline), p.E2E.Warm, p.E2E.Dur))
	}
	for _, part := range []string{"capture", "tracing", "cleanup", "latency", "pgwork", "profile", "drain", "scale", "noisy"} {
		if len(p.Only) > 0 && p.want(part) {
			parts = append(parts, part)
		}
	}
	if len(p.Only) == 0 {
		parts = append(parts, "the other parts (capture, tracing, cleanup, latency, pgwork, profile, drain, scale, noisy)")
	}
	return strings.Join(parts, "; ")
}

// levelsText is "1, 8, 32 and 128" (or main alone when levels is empty).
func levelsText(levels []int, main int) string {
	if len(levels) == 0 {
		return fmt.Sprint(main)
	}
	s := make([]string, len(levels))
	for i, n := range levels {
		s[i] = fmt.Sprint(n)
	}
	if len(s) == 1 {
		return s[0]
	}
	return strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
}
