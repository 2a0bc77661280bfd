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
