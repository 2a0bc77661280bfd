package main

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestProfileHistogramBetweenScrapes: the profile reads what a histogram
// observed between two scrapes, its count and mean, of the series whose
// labels match.
func TestProfileHistogramBetweenScrapes(t *testing.T) {
	t.Parallel()
	page := func(count int, sum string) metricsText {
		return metricsText(strings.Split(`valruns_start_phase_seconds_bucket{phase="statement",le="0.001"} 5
valruns_start_phase_seconds_sum{phase="statement"} `+sum+`
valruns_start_phase_seconds_count{phase="statement"} `+strconv.Itoa(count)+`
valruns_start_phase_seconds_count{phase="waiting_writer"} 99
valruns_start_batch_starts_count 7`, "\n"))
	}
	before, after := page(10, "0.005"), page(110, "0.155") // 100 more, 0.15 s in all
	require.Equal(t, histStat{Count: 100, Mean: 1500 * time.Microsecond}, after.hist(before, "valruns_start_phase_seconds", `phase="statement"`))
	require.Equal(t, histStat{}, after.hist(after, "valruns_start_phase_seconds", `phase="statement"`), "nothing observed between equal scrapes")
	require.Equal(t, 7.0, after.value("valruns_start_batch_starts_count", ""), "no labels: every series of the name")
}

// TestProfileSection: a column per count profiled; a start's stages, the
// rest of its request (the request less its wait and its statement), its
// hand-off; a count whose run failed says so in each of its cells.
func TestProfileSection(t *testing.T) {
	t.Parallel()
	ms := func(f float64) histStat {
		return histStat{Count: 10, Mean: time.Duration(f * float64(time.Millisecond))}
	}
	lone := profileResult{Clients: 1, Starts: 1000, Window: 2 * time.Second, Client: 1400 * time.Microsecond,
		HTTP: ms(1.2), Waiting: ms(0.1), Statement: ms(0.8), Handoff: ms(0.3), BatchMean: 1, Queued: ms(1.5), Top: []string{"flat cum"}}
	s := profileSection([]profileResult{lone, {Clients: 8, Failed: "serve exited"}})
	require.Equal(t, "## Where the time goes", s.Heading)
	for _, want := range []string{
		"| a start, ms | 1 client | 8 clients |\n|---|---|---|\n",
		"| the window: starts measured (per second) | 1000 in 2s (500/s) | FAILED: serve exited |",
		"| the request as its client sees it, sent to answer read | 1.400 | FAILED: serve exited |",
		"`valruns_http_request_duration_seconds`): the two below and the rest | 1.200 |",
		"the commit; starts per statement | 0.800 (1.0) |",
		"the key, the answer | 0.300 |",
		"(`valruns_run_handoff_seconds`): from the commit, the dispatcher's buffer, the gate's script, the push | 0.300 |",
		"| it is queued for a worker | 1.5 | FAILED: serve exited |",
		"| a worker begins it | - |",
		"**The API's CPU profile at 1 client**",
	} {
		require.Contains(t, s.Body, want)
	}
	require.NotContains(t, s.Body, "CPU profile at 8 clients")
}
