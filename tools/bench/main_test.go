package main

import (
	"flag"
	"io"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// parse is parseFlags on a fresh flag set, as the command line would be.
func parse(t *testing.T, args ...string) (plan, error) {
	t.Helper()
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return parseFlags(fs, args)
}

// TestParseFlagsPlan: with no flags, the plan is makePlan's and the paths
// are the repository root's (where scripts/bench.sh runs the harness); each
// flag given replaces its part of the plan and leaves the rest as planned.
// Not parallel: it sets QUICK and BENCH_PORT.
func TestParseFlagsPlan(t *testing.T) {
	t.Setenv("QUICK", "")
	t.Setenv("BENCH_PORT", "")

	p, err := parse(t)
	require.NoError(t, err)
	want := makePlan(false)
	want.Out, want.Bin, want.Scratch, want.Port = "tools/bench/RESULTS.md", "bin/valruns", "tools/bench/results", 18080
	require.Equal(t, want, p)

	p, err = parse(t, "-quick", "-clients", "2,4", "-duration", "3s", "-e2e-clients", "8", "-e2e-duration", "4s",
		"-noisy-duration", "5s", "-cleanup-keys", "11", "-noisy-runs", "13", "-noisy-clients", "16", "-noisy-env", "ORG_START_RATE=",
		"-profile-clients", "1", "-wait-clients", "8", "-wait-rounds", "2", "-wait-duration", "6s", "-only", "noisy, peer", "-out", "/tmp/r.md", "-scratch", "/tmp/s", "-bin", "b")
	require.NoError(t, err)
	want = makePlan(true)
	want.Out, want.Bin, want.Scratch, want.Port = "/tmp/r.md", "b", "/tmp/s", 18080
	want.Levels, want.HTTP.Dur, want.PG.Dur, want.E2ELevels, want.E2E.Dur = []int{2, 4}, 3*time.Second, 3*time.Second, []int{8}, 4*time.Second
	want.Noisy.Dur, want.CleanupKeys, want.NoisyRuns, want.NoisyEnv, want.ProfileClients = 5*time.Second, []int{11}, 13, [][]string{{"ORG_START_RATE="}}, []int{1}
	want.NoisyClients = 16
	want.WaitLevels, want.WaitRounds, want.Wait.Dur = []int{8}, 2, 6*time.Second
	want.Only = map[string]bool{"noisy": true, "peer": true}
	require.Equal(t, want, p)

	t.Setenv("QUICK", "1")
	t.Setenv("BENCH_PORT", "19000")
	p, err = parse(t)
	require.NoError(t, err)
	require.True(t, p.Quick)
	require.Equal(t, 19000, p.Port)

	t.Setenv("BENCH_PORT", "high")
	_, err = parse(t)
	require.ErrorContains(t, err, `BENCH_PORT="high"`)
	_, err = parse(t, "-clients", "0")
	require.Error(t, err, "a client count is positive")
	_, err = parse(t, "-only", "valruns,drain")
	require.ErrorContains(t, err, `"drain"`)
}

// TestPathsFromTheRoot: the harness runs from the repository's root (two
// levels above this package): the peer it starts, the scripts pgbench runs
// and the results it updates by default are there.
func TestPathsFromTheRoot(t *testing.T) {
	t.Setenv("QUICK", "")
	t.Setenv("BENCH_PORT", "")
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	require.FileExists(t, filepath.Join(root, "go.mod"), "the repository's root")
	e := &env{root: root}
	for _, f := range []string{"server.js", "worker.js", "package-lock.json"} {
		require.FileExists(t, filepath.Join(e.peerDir(), f))
	}
	p, err := parse(t)
	require.NoError(t, err)
	require.FileExists(t, filepath.Join(root, p.Out), "the results a partial run updates")
}
