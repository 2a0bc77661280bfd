package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// waitRound is a measured round of side whose start to answer p99 is p99,
// with within of its 1000 runs answered within 5 ms of their finished_at.
func waitRound(side string, clients, round int, p99 time.Duration, within int) waitResult {
	return waitResult{Side: side, Clients: clients, Round: round, Window: 10 * time.Second, Runs: 1000,
		P50: p99 / 2, P99: p99, ReadsPerRun: 1, Within5: within, GapP50: time.Millisecond, GapP999: 4 * time.Millisecond}
}

func waitResults() *results {
	ms := time.Millisecond
	return &results{WaitTiming: timing{Warm: time.Second, Dur: 5 * time.Second}, Wait: []waitResult{
		// 1 client: 999 of 1000 and 1000 of 1000 is 99.95%; p99 1.5x and 1.2x.
		waitRound("valruns", 1, 1, 15*ms, 999), waitRound("peer", 1, 1, 10*ms, 1000),
		waitRound("valruns", 1, 2, 12*ms, 1000), waitRound("peer", 1, 2, 10*ms, 0),
		// 8 clients: 1998 of 2000 is 99.90% less a little: a MISS; one round over 1.5x.
		waitRound("valruns", 8, 1, 10*ms, 999), waitRound("peer", 8, 1, 10*ms, 1000),
		waitRound("valruns", 8, 2, 16*ms, 998), waitRound("peer", 8, 2, 10*ms, 1000),
		// 32 clients: the peer's round failed.
		waitRound("valruns", 32, 1, 10*ms, 1000), {Side: "peer", Clients: 32, Round: 1, Failed: "boom"},
	}}
}

// TestWaitChecks: the share of runs answered within 5 ms pools valruns'
// rounds at a count; the p99 must hold in every round; a failed or
// missing round is "not measured", never a PASS.
func TestWaitChecks(t *testing.T) {
	t.Parallel()
	got := byName(waitResults().waitChecks())
	share, p99 := "long-poll answer within 5 ms of the final commit, ", "long-poll start-to-answer p99, valruns vs the peer, "
	want := map[string][2]string{
		share + "1 client":   {"PASS", "99.95% of 2000 runs (2 rounds)"},
		p99 + "1 client":     {"PASS", "round 1 1.50x (15.0 / 10.0 ms); round 2 1.20x (12.0 / 10.0 ms)"},
		share + "8 clients":  {"MISS", "99.85% of 2000 runs (2 rounds)"},
		p99 + "8 clients":    {"MISS", "round 1 1.00x (10.0 / 10.0 ms); round 2 1.60x (16.0 / 10.0 ms)"},
		share + "32 clients": {"PASS", "100.00% of 1000 runs (1 round)"},
		p99 + "32 clients":   {"not measured", "not measured"},
	}
	require.Len(t, got, len(want))
	for name, w := range want {
		require.Equal(t, w, [2]string{got[name].result(), got[name].Measured}, name)
	}

	r := waitResults()
	r.Wait[2].Failed = "boom" // valruns' round 2 at 1 client
	got = byName(r.waitChecks())
	require.Equal(t, "not measured", got[share+"1 client"].result())
	require.Equal(t, "not measured", got[p99+"1 client"].result())
	require.Equal(t, []string{"wait valruns at 1, round 2 failed", "wait peer at 32, round 1 failed"}, r.failures())

	r.Wait = r.Wait[4:] // no round at 1 client
	require.Equal(t, "not measured", byName(r.waitChecks())[share+"1 client"].result())
}

// TestWaitSection: the targets, and a row per round and side.
func TestWaitSection(t *testing.T) {
	t.Parallel()
	s := waitResults().waitSection()
	for _, want := range []string{
		"| 8 | 2 | valruns | 100 | 8.0 / 16.0 | 1.00 | 99.80% (998 of 1000) | 1.0 / 4.0 |",
		"| 32 | 1 | peer | FAILED: boom | | | | |",
		"| long-poll answer within 5 ms of the final commit, 8 clients | 99.85% of 2000 runs (2 rounds) | >= 99.9% of runs | MISS |",
		"finished_at is the final transaction's now()",
	} {
		require.Contains(t, s.text(&results{}), want)
	}
	require.Len(t, s.Checks, 6)
}

// TestWaitFollowAndTally: a client reads the run its start named until the
// run is final, and keeps it when the final answer fell in the window; the
// figures come from the kept runs and their finished_at.
func TestWaitFollowAndTally(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	ans := func(body string, sent, answered time.Duration, in bool) answer {
		return answer{Status: 200, Sent: at.Add(sent), Answered: at.Add(answered), Body: []byte(body), InWindow: in}
	}
	var w loopClient
	w.follow(ans(`{"id":"a","status":"queued"}`, 0, time.Millisecond, false), true) // a start in the warm-up
	require.Equal(t, "a", w.run.ID)
	w.follow(ans(`{"id":"a","status":"running"}`, 2*time.Millisecond, 10*time.Second, true), true) // a long poll that ran out
	w.follow(ans(`{"id":"a","status":"passed"}`, 11*time.Second, 11*time.Second+5*time.Millisecond, true), true)
	require.Empty(t, w.run.ID, "the next request is a start")
	w.follow(ans(`{"id":"b","status":"queued"}`, 12*time.Second, 12*time.Second, true), true)
	w.follow(ans(`{"id":"c","status":"passed"}`, 13*time.Second, 13*time.Second, true), true) // not the run being read
	w.follow(ans(`{"id":"b","status":"failed"}`, 13*time.Second, 13*time.Second+20*time.Millisecond, true), true)
	w.follow(ans(`{"id":"d","status":"queued"}`, 14*time.Second, 14*time.Second, true), true)
	w.follow(ans(`{"id":"d","status":"error"}`, 14*time.Second, 15*time.Second, false), true) // after the window
	w.follow(ans(`{}`, 16*time.Second, 16*time.Second, true), true)
	require.Equal(t, 2, w.noRun)
	require.Equal(t, []sentRun{
		{ID: "a", Sent: at, Answered: at.Add(11*time.Second + 5*time.Millisecond), Reads: 2},
		{ID: "b", Sent: at.Add(12 * time.Second), Answered: at.Add(13*time.Second + 20*time.Millisecond), Reads: 1},
	}, w.done)

	var r waitResult
	r.tally(w.done, map[string]time.Time{"a": at.Add(11 * time.Second), "b": at.Add(13*time.Second + 14*time.Millisecond)})
	require.Equal(t, 2, r.Runs)
	require.Equal(t, 1, r.Within5, "a within 5 ms, b 6 ms after")
	require.Equal(t, 1.5, r.ReadsPerRun)
	require.Equal(t, 1020*time.Millisecond, r.P50)
	require.Equal(t, 6*time.Millisecond, r.GapP999)
	r = waitResult{}
	r.tally(w.done, nil) // no finished_at: never within 5 ms
	require.Equal(t, waitResult{Runs: 2, P50: 1020 * time.Millisecond, P99: 11*time.Second + 5*time.Millisecond, ReadsPerRun: 1.5}, r)
}
