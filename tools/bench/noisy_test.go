package main

import (
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func exampleNoisy() *noisyLog {
	b := func(mode string, startP99, finalP99 time.Duration) e2eResult {
		return e2eResult{Mode: mode, Answers: 120, StartP50: startP99 / 3, StartP99: startP99,
			Final: 120, FinalP50: finalP99 / 2, FinalP99: finalP99}
	}
	variant := func(settings []string, floodP99, backlogP99 time.Duration, aFinished int) noisyVariant {
		return noisyVariant{Settings: settings,
			Alone:     b("alone", 30*time.Millisecond, 60*time.Millisecond),
			Flood:     b("A floods", floodP99, time.Second),
			Backlog:   b("behind A's 1000 slow runs", 20*time.Millisecond, backlogP99),
			AFloodRPS: 500, AFloodStatuses: map[int]int{}, AQueued: 1000,
			AAlone: e2eResult{Mode: modeSeparate.Name, Clients: 64, Window: 10 * time.Second, Started: 5000, Finished: aFinished}}
	}
	return &noisyLog{Load: "0.20 before, 1.50 after",
		Clients: 64, Warm: 2 * time.Second, Dur: time.Minute, BacklogRuns: 1000, BacklogB: 20,
		Variants: []noisyVariant{
			variant([]string{"ORG_START_RATE=0", "ORG_RUN_SHARE=1000000"}, 480*time.Millisecond, 88*time.Second, 5000),
			variant([]string{"ORG_START_RATE=0", "ORG_RUN_SHARE="}, 50*time.Millisecond, 1500*time.Millisecond, 4900),
			variant([]string{"ORG_START_RATE=", "ORG_RUN_SHARE="}, 60*time.Millisecond, 1800*time.Millisecond, 4000),
		}}
}

// TestNoisyChecks: issue 16's targets divide the figures of one variant
// (A's throughput: of a variant by the first's) and pass only when met.
func TestNoisyChecks(t *testing.T) {
	t.Parallel()
	x := exampleNoisy()
	got := byName(x.checks())
	// Two per variant, and A's throughput for the one after the first that
	// shares its start rate: a rate limit throttles A alone by design.
	require.Len(t, got, 7)
	off := got["B's start p99 while A floods at 64 clients / B alone [ORG_START_RATE=0 ORG_RUN_SHARE=1000000]"]
	require.False(t, off.Pass, off.Measured)
	require.Equal(t, "16.00x (480.0 / 30.0 ms)", off.Measured)
	on := got["B's start p99 while A floods at 64 clients / B alone [ORG_START_RATE=0 ORG_RUN_SHARE default]"]
	require.True(t, on.Pass, on.Measured)
	backlog := got["B's start-to-final p99 behind A's 1000 queued slow runs [ORG_START_RATE=0 ORG_RUN_SHARE=1000000]"]
	require.False(t, backlog.Pass, backlog.Measured)
	require.Equal(t, "88.00 s over 120 runs", backlog.Measured)
	require.True(t, got["B's start-to-final p99 behind A's 1000 queued slow runs [ORG_START_RATE default ORG_RUN_SHARE default]"].Pass)
	fair := got["A alone, runs finished/s [ORG_START_RATE=0 ORG_RUN_SHARE default] / [ORG_START_RATE=0 ORG_RUN_SHARE=1000000]"]
	require.True(t, fair.Pass, fair.Measured) // 490 / 500
	require.Equal(t, "0.98x (490 / 500 runs/s)", fair.Measured)
	require.NotContains(t, got, "A alone, runs finished/s [ORG_START_RATE default ORG_RUN_SHARE default] / [ORG_START_RATE=0 ORG_RUN_SHARE=1000000]")
	slow := x.Variants[1]
	slow.AAlone.Finished = 4000
	x.Variants = append(x.Variants, slow)
	require.False(t, byName(x.checks())["A alone, runs finished/s [ORG_START_RATE=0 ORG_RUN_SHARE default] / [ORG_START_RATE=0 ORG_RUN_SHARE=1000000]"].Pass)
	x.Variants = x.Variants[:3]

	// A backlog run not final is a miss whatever the p99 of the others.
	x.Variants[1].Backlog.Unfinished = 1
	for _, c := range x.checks() {
		if strings.HasPrefix(c.Name, "B's start-to-final") && strings.HasSuffix(c.Name, "[ORG_START_RATE=0 ORG_RUN_SHARE default]") {
			require.False(t, c.Pass)
			require.Contains(t, c.Measured, "1 not final")
		}
	}
	// Nothing measured is "not measured", never a pass.
	x.Variants[0].Alone.Failed = "boom"
	x.Variants[0].Backlog.Failed = "boom"
	x.Variants[0].AAlone.Failed = "boom"
	for _, c := range x.checks() {
		if strings.Contains(c.Name, "ORG_RUN_SHARE=1000000") {
			require.Equal(t, "not measured", c.result(), c.Name)
		}
	}
}

// TestNoisyMarkdownAndFailure: the section names each variant's settings
// as the processes had them, B's three rows and A alone; A's 429s are the
// rate limit at work, anything else not a 2xx fails the run.
func TestNoisyMarkdownAndFailure(t *testing.T) {
	t.Parallel()
	x := exampleNoisy()
	x.ServerEnv = []string{"LOG_LEVEL=warn", "WORKER_CONCURRENCY=20", "ORG_START_RATE=0"}
	x.Variants[2].AFloodStatuses = map[int]int{429: 7000}
	x.Variants[2].AFloodRPS = 100
	md := x.section().text(&results{})
	for _, want := range []string{
		"| alone | 120 | 10.0 | 30.0 | 30.0 | 60.0 | 0 | 0 | - |",
		"| A floods | 120 | 160.0 | 480.0 | 500.0 | 1000.0 | 0 | 0 | 64 clients: 500 starts/s answered 201, 0 answers 429 |",
		"| behind A's 1000 slow runs | 120 | 6.7 | 20.0 | 44000.0 | 88000.0 | 0 | 0 | 1000 of A's slow runs not final when B began |",
		"64 clients: 100 starts/s answered 201, 7000 answers 429 |",
		"A alone, 64 clients: **500 starts/s, 500 runs finished/s**",
		"BENCH_SERVER_ENV for every process: `LOG_LEVEL=warn WORKER_CONCURRENCY=20 ORG_START_RATE=0`",
		"Load average 0.20 before, 1.50 after",
	} {
		require.Contains(t, md, want)
	}

	require.Empty(t, x.failures())
	x.Variants[2].AFloodStatuses = map[int]int{429: 10, 503: 2}
	require.Equal(t, []string{"A's flood: 2 answers were errors other than 429"}, x.failures())
	x.Variants[2].AFloodStatuses = nil
	x.Variants[1].Flood.Errors, x.Variants[1].Flood.Limited = 3, 1
	require.Equal(t, []string{"B A floods: 3 answers were errors (1 of them 429)"}, x.failures())
	x.Variants[1].Flood.Errors = 0
	x.Variants[0].AAlone.Errors, x.Variants[0].AAlone.Limited = 50, 50
	require.Empty(t, x.failures(), "A alone's 429s are the rate limit")
	x.Variants[0].Failed = []string{"alone: boom"}
	require.Equal(t, []string{"alone: boom"}, x.failures())
}

// TestNoisyEnvFlag: each -noisy-env is one variant; NAME= is the
// service's default, "" the harness's settings.
func TestNoisyEnvFlag(t *testing.T) {
	t.Parallel()
	var f settingsFlag
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.Var(&f, "noisy-env", "")
	require.NoError(t, fs.Parse([]string{"-noisy-env", "ORG_START_RATE=0 ORG_RUN_SHARE=40", "-noisy-env", "ORG_START_RATE=", "-noisy-env", ""}))
	require.Equal(t, settingsFlag{{"ORG_START_RATE=0", "ORG_RUN_SHARE=40"}, {"ORG_START_RATE="}, {}}, f)
	require.Equal(t, "ORG_START_RATE default", noisyVariant{Settings: f[1]}.label())
	require.Equal(t, "the harness's settings", noisyVariant{Settings: f[2]}.label())
	require.Error(t, f.Set("ORG_START_RATE"))
	require.Error(t, f.Set("=5"))
}
