package main

// The long poll: each client starts a run with a new key, then reads it
// with `Prefer: wait=10` until it is final, and starts the next; valruns
// (serve + worker) beside the peer (server.js + worker.js, its read
// waiting with BullMQ's job.waitUntilFinished), in rounds, in turn. The
// harness keeps each run's start sent and final answer read; after the
// window, PostgreSQL gives each run's finished_at, and the gap between it
// and the answer says whether the answer waited for a tick.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
)

// waitResult is one round of one side at one count.
type waitResult struct {
	Side    string // valruns, peer
	Clients int
	Round   int // from 1
	Window  time.Duration
	// Runs whose final answer was read inside the window; their start to
	// answer (from the start's request sent to the final answer read),
	// and their reads (GETs) per run.
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

// measureWait runs the long poll: at each count, p.WaitRounds rounds of
// valruns then the peer.
func measureWait(ctx context.Context, e *env, p plan) []waitResult {
	var out []waitResult
	for _, n := range p.WaitLevels {
		for round := 1; round <= max(p.WaitRounds, 1); round++ {
			for i, m := range e2ePairs[1] { // serve + worker, then peer + worker.js
				if ctx.Err() != nil {
					return out
				}
				r := waitResult{Side: []string{valrunsSide, peerSide}[i], Clients: n, Round: round}
				r.Failed = failed("wait "+r.Side, e.loop(ctx, m, n, p.Wait, true, nil, func(rg *rig, w window) error {
					return r.read(ctx, rg, w)
				}))
				out = append(out, r)
				say("wait %-8s c=%-3d round %d: %5.0f runs/s, start to answer p50 / p99 %s / %s ms, %d of %d answered within 5 ms of finished_at",
					r.Side, n, round, r.RunsPerSec(), ms(r.P50), ms(r.P99), r.Within5, r.Runs)
			}
		}
	}
	return out
}

// read sets r from a window of the long poll: no answer may be an error
// or name no run; then the runs' finished_at.
func (r *waitResult) read(ctx context.Context, rg *rig, w window) error {
	l := w.load
	r.Window, r.Errors = l.Duration, w.noRun+l.Errors+l.Non2xx+l.Unexpected
	if r.Errors > 0 {
		return fmt.Errorf("%d answers were errors or named no run (first error: %s, non-2xx: %v)", r.Errors, l.FirstError, l.Statuses)
	}
	finished, err := finishedAt(ctx, rg.conn, w.runs)
	r.tally(w.runs, finished)
	return err
}

// tally sets r's figures from its runs and their finished_at (by run id):
// start to answer over every run, the gap answer - finished_at over those
// with a finished_at.
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
	var out []waitResult
	for _, x := range r.Wait {
		if x.Side == side && x.Clients == clients {
			out = append(out, x)
		}
	}
	return out
}

// waitChecks are the long poll's targets (issue 48) at 1 and 8 clients
// and any other count measured: valruns' answer within 5 ms of the run's
// finished_at for at least 99.9% of its runs, over its rounds; its start
// to answer p99 at most 1.5x the peer's, in every round.
func (r *results) waitChecks() []check {
	var counts []int
	for _, x := range r.Wait {
		counts = append(counts, x.Clients)
	}
	var out []check
	for _, n := range curveCounts(makePlan(false).WaitLevels, counts...) {
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
		if runs == 0 {
			c = notMeasured(c)
		} else {
			share := 100 * float64(within) / float64(runs)
			c.Measured, c.Pass = fmt.Sprintf("%s%% of %d runs (%s)", ratioText(share, 99.9), runs, rounds(len(vs))), share >= 99.9
		}
		out = append(out, c, waitP99Check(n, vs, peers))
	}
	return out
}

func rounds(n int) string {
	if n == 1 {
		return "1 round"
	}
	return fmt.Sprintf("%d rounds", n)
}

// waitP99Check is the p99 target at n clients: each valruns round beside
// the peer's round of the same number; one round missing or failed, and
// the target is not measured.
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
	fmt.Fprintf(&b, "Each client, in a closed loop, starts a run with a new key, then reads it with `Prefer: wait=10` until it is final (passed, failed or error), "+
		"then starts the next (%s warm-up, %s measured, a fresh database each); valruns (`serve` + `worker`, two processes) beside the peer (server.js + worker.js, two processes), "+
		"in rounds, in turn. The peer's read waits for the run's job with BullMQ's QueueEvents and `job.waitUntilFinished`, then reads the row. "+
		"A run counts when its final answer was read inside the window. Start to answer runs from the start's request sent to the final answer read. "+
		"The gap is the final answer read minus the run's finished_at, read from PostgreSQL after the window: finished_at is the final transaction's now(), "+
		"taken before its commit, so the gap slightly over-counts the time from the commit to the answer; the harness and PostgreSQL share one clock on one machine. "+
		"The 5 ms target pools valruns' rounds at a count; the peer's gap is shown beside it, not judged.\n\n",
		r.WaitTiming.Warm, r.WaitTiming.Dur)
	cs := r.waitChecks()
	b.WriteString(checkTable(cs))
	b.WriteString("\n| clients | round | side | runs/s | start to answer p50 / p99 ms | reads per run | answered within 5 ms of finished_at | gap p50 / p99.9 ms |\n|---|---|---|---|---|---|---|---|\n")
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
	return section{Heading: "## Long poll: start to final answer", Body: b.String(), Checks: cs}
}
