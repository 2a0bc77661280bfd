package main

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestMarkdownFullAndPartial: a full run writes the results afresh; a
// partial run replaces its own sections of the existing results and keeps
// the others as they were measured.
func TestMarkdownFullAndPartial(t *testing.T) {
	t.Parallel()
	old := resultsTitle + "\n## The curve: starts\n\nold curve\n\n## Noisy neighbour\n\nold noisy\n"
	r := curveResults()
	r.Date, r.Commit = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC), "abc123"

	full := r.markdown(old)
	require.True(t, strings.HasPrefix(full, resultsTitle))
	require.NotContains(t, full, "old", "a full run keeps nothing of the old results")
	require.Contains(t, full, "## The curve: starts\n\nMeasured 2026-12-01 10:00 UTC at abc123, mode quick. Targets: 6 PASS, 7 MISS, 10 not measured.\n\n")
	require.Less(t, strings.Index(full, "## Machine"), strings.Index(full, "## The curve: starts"))

	r.Partial = true
	part := r.markdown(old)
	require.NotContains(t, part, "old curve")
	require.Contains(t, part, "## Noisy neighbour\n\nold noisy\n")
	require.Equal(t, 1, strings.Count(part, "## The curve: starts"+"\n"))
	require.Less(t, strings.Index(part, "## The curve: starts"), strings.Index(part, "## Noisy neighbour"), "replaced where it was")
	require.Greater(t, strings.Index(part, "## Machine"), strings.Index(part, "## Noisy neighbour"), "a section the old results lacked is added")
	require.Equal(t, part, r.markdown(part), "writing it again changes nothing")
	require.True(t, strings.HasPrefix(r.markdown(""), resultsTitle), "a partial run with no results yet")
}

// TestFailures: a failed run, an answer not as expected, a failed loop,
// profile, noisy neighbour or cleanup each fail the run; a MISS does not.
func TestFailures(t *testing.T) {
	t.Parallel()
	r := curveResults()
	require.Equal(t, []string{"peer start, no key at 32 failed: the peer exited"}, r.failures())
	r.Rows[0].Non2xx, r.Rows[0].Notes = 3, []string{"non-2xx by status: map[503:3]"}
	require.Contains(t, r.failures(), "valruns start, no key at 1: 0 transport errors, 3 non-2xx, 0 unexpected (non-2xx by status: map[503:3])")

	r = e2eResults()
	r.E2E[0].Errors = 2
	require.Equal(t, []string{"e2e serve --worker at 1: 2 answers were errors", "e2e peer, one process at 32 failed"}, r.failures())

	require.Equal(t, []string{"the profile at 8 clients failed"}, (&results{Profile: []profileResult{{Clients: 1}, {Clients: 8, Failed: "no pprof"}}}).failures())
	require.Equal(t, []string{"the cleanup of 10 keys failed or its starts had errors"},
		(&results{Cleanup: cleanups{{Keys: 1}, {Keys: 10, During: row{Non2xx: 1}}}}).failures())
	require.Empty(t, (&results{Cleanup: cleanups{{}}}).failures())
}

// TestCleanupChecks: the cleanup's speed alone, and the starts during it
// beside the starts without it (rps and p99.9), at each count of keys; and
// its time alone from the fewest keys to the most (at most 2x).
func TestCleanupChecks(t *testing.T) {
	t.Parallel()
	c := &cleanupResult{Keys: 1000, AloneKeys: 1_000_000, Alone: 10 * time.Second,
		Without: row{RPS: 4000, P999: 40 * time.Millisecond}, During: row{RPS: 2400, P999: 400 * time.Millisecond}}
	got := byName(c.checks())
	require.Equal(t, "PASS", got["cleanup of 1000 keys, alone"].result())
	require.Equal(t, "100000 keys/s (1000000 keys in 10.00 s)", got["cleanup of 1000 keys, alone"].Measured)
	rps := got["new-key starts during the cleanup of 1000 keys / without it, 32 clients"]
	require.Equal(t, "MISS", rps.result())
	require.Equal(t, "0.60x (2400 / 4000 rps)", rps.Measured)
	require.Equal(t, "MISS", got["new-key start p99.9 during the cleanup of 1000 keys / without it, 32 clients"].result())
	c.During.RPS, c.During.P999 = 3900, 50*time.Millisecond
	for _, k := range c.checks() {
		require.Equal(t, "PASS", k.result(), k.Name)
	}
	for _, k := range (&cleanupResult{Failed: "boom"}).checks() {
		require.Equal(t, "not measured", k.result(), k.Name)
	}

	big := &cleanupResult{Keys: 10_000, AloneKeys: 10_000, Alone: 25 * time.Second, Without: c.Without, During: c.During}
	s := cleanups{c, big}.section()
	flat := byName(s.Checks)["cleanup time alone, 10000 keys / 1000"]
	require.Equal(t, "MISS", flat.result())
	require.Equal(t, "2.50x (25.00 / 10.00 s)", flat.Measured)
	require.Len(t, s.Checks, 7, "three per count of keys, and the time alone from the fewest to the most")
	require.Contains(t, s.Body, "| 10000 | 10000 in 25.00, 0.0 | 0 in 0.00 | ")
	big.Alone = 15 * time.Second
	require.Equal(t, "PASS", byName(cleanups{c, big}.section().Checks)["cleanup time alone, 10000 keys / 1000"].result())
	big.Failed = "boom"
	s = cleanups{c, big}.section()
	require.Equal(t, "not measured", byName(s.Checks)["cleanup time alone, 10000 keys / 1000"].result())
	require.Contains(t, s.Body, "| 10000 | FAILED: boom |")
}

func TestRatioTextNeverRoundsOntoTheTarget(t *testing.T) {
	t.Parallel()
	require.Equal(t, "0.696", ratioText(0.6957, 0.7))
	require.Equal(t, "0.70", ratioText(0.7, 0.7))
	require.Equal(t, "1.23", ratioText(1.2345, 1.0))
}
