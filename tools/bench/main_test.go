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
func parse(t *testing.T, args ...string) (plan, options, error) {
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

	p, o, err := parse(t)
	require.NoError(t, err)
	require.Equal(t, makePlan(false), p)
	require.Equal(t, options{Out: "tools/bench/RESULTS.md", Bin: "bin/valruns", Scratch: "tools/bench/results", Port: 18080}, o)

	p, o, err = parse(t, "-quick", "-clients", "2,4", "-duration", "3s", "-e2e-clients", "8", "-e2e-duration", "4s",
		"-noisy-duration", "5s", "-cleanup-keys", "11", "-noisy-runs", "13", "-noisy-clients", "0", "-noisy-env", "ORG_START_RATE=",
		"-profile-clients", "1", "-only", "noisy, peer", "-out", "/tmp/r.md", "-scratch", "/tmp/s", "-bin", "b")
	require.NoError(t, err)
	want := makePlan(true)
	want.Levels, want.HTTP.Dur, want.PG.Dur, want.E2ELevels, want.E2E.Dur = []int{2, 4}, 3*time.Second, 3*time.Second, []int{8}, 4*time.Second
	want.Noisy.Dur, want.CleanupKeys, want.NoisyRuns, want.NoisyEnv, want.ProfileClients = 5*time.Second, 11, 13, [][]string{{"ORG_START_RATE="}}, 1
	want.Only = map[string]bool{"noisy": true, "peer": true}
	require.Equal(t, want, p, "-noisy-clients 0 keeps the planned 64")
	require.Equal(t, options{Out: "/tmp/r.md", Bin: "b", Scratch: "/tmp/s", Port: 18080}, o)

	t.Setenv("QUICK", "1")
	t.Setenv("BENCH_PORT", "19000")
	p, o, err = parse(t)
	require.NoError(t, err)
	require.True(t, p.Quick)
	require.Equal(t, 19000, o.Port)

	t.Setenv("BENCH_PORT", "high")
	_, _, err = parse(t)
	require.ErrorContains(t, err, `BENCH_PORT="high"`)
	_, _, err = parse(t, "-clients", "0")
	require.Error(t, err, "a client count is positive")
	_, _, err = parse(t, "-only", "valruns,drain")
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
	_, o, err := parse(t)
	require.NoError(t, err)
	require.FileExists(t, filepath.Join(root, o.Out), "the results a partial run updates")
}
