package main

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// The profile reads a histogram's observations between two scrapes: the
// count, the mean and the median interpolated in its bucket, of the
// series whose labels match.
func TestProfileHistogramBetweenScrapes(t *testing.T) {
	page := func(counts [3]int, sum float64) metricsText {
		text := `valruns_start_phase_seconds_bucket{phase="statement",le="0.001"} ` + itoa(counts[0]) + `
valruns_start_phase_seconds_bucket{phase="statement",le="0.0025"} ` + itoa(counts[1]) + `
valruns_start_phase_seconds_bucket{phase="statement",le="+Inf"} ` + itoa(counts[2]) + `
valruns_start_phase_seconds_sum{phase="statement"} ` + strings.TrimRight(strings.TrimRight(ftoa(sum), "0"), ".") + `
valruns_start_phase_seconds_count{phase="statement"} ` + itoa(counts[2]) + `
valruns_start_phase_seconds_bucket{phase="waiting_writer",le="0.001"} 99
valruns_start_phase_seconds_count{phase="waiting_writer"} 99`
		return metricsText(strings.Split(text, "\n"))
	}
	before := page([3]int{10, 10, 10}, 0.005)
	// 100 more: 20 under 1 ms, 80 between 1 and 2.5 ms; 0.15 s in all.
	after := page([3]int{30, 110, 110}, 0.155)
	h := after.hist(before, "valruns_start_phase_seconds", `phase="statement"`)
	if h.Count != 100 || h.Mean != 1500*time.Microsecond {
		t.Fatalf("count %v mean %v, want 100 and 1.5ms", h.Count, h.Mean)
	}
	// The 50th of 100 is the 30th of the 80 between 1 and 2.5 ms.
	if want := time.Millisecond + time.Duration(30.0/80*1.5*float64(time.Millisecond)); h.P50 != want {
		t.Fatalf("p50 %v, want %v", h.P50, want)
	}
	if h := after.hist(after, "valruns_start_phase_seconds", `phase="statement"`); h.Count != 0 {
		t.Fatalf("nothing observed between two equal scrapes: %+v", h)
	}
}

func TestProfileWaitLabels(t *testing.T) {
	for _, c := range []struct{ state, typ, event, want string }{
		{"active", "", "", "active: on CPU"},
		{"active", "IO", "WALSync", "active: waiting IO/WALSync"},
		{"idle", "Client", "ClientRead", "idle (Client/ClientRead)"},
		{"idle in transaction", "", "", "idle in transaction"},
	} {
		if got := waitLabel(c.state, c.typ, c.event); got != c.want {
			t.Errorf("waitLabel(%q, %q, %q) = %q, want %q", c.state, c.typ, c.event, got, c.want)
		}
	}
}

func itoa(n int) string     { return strconv.Itoa(n) }
func ftoa(f float64) string { return strconv.FormatFloat(f, 'f', 6, 64) }
