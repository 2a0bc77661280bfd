package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestClientDocUsageErrors: each bad usage docs/client.md shows (a
// `$ bin/valruns start ...` line followed by a `valruns start: --...`
// line) is what `valruns start` prints for it, exit code 2. The examples
// run as the page sets them up: VALRUNS_URL and VALRUNS_TOKEN exported, an
// invoice.json, $DEMO_WORKFLOW a workflow's id.
func TestClientDocUsageErrors(t *testing.T) {
	b, err := os.ReadFile("../../docs/client.md")
	require.NoError(t, err)
	invoice := filepath.Join(t.TempDir(), "invoice.json")
	require.NoError(t, os.WriteFile(invoice, []byte(`{"customer":"ACME","total":42}`), 0o644))
	t.Setenv("VALRUNS_URL", "http://127.0.0.1:8080")
	t.Setenv("VALRUNS_TOKEN", "vr_docexample")
	lines := strings.Split(string(b), "\n")
	checked := 0
	for i, line := range lines[:len(lines)-1] {
		cmd, ok := strings.CutPrefix(line, "$ bin/valruns ")
		want := lines[i+1]
		if !ok || !strings.HasPrefix(want, "valruns start: --") {
			continue
		}
		cmd, _, _ = strings.Cut(cmd, "#")
		var args []string
		for _, a := range strings.Fields(cmd) {
			switch a {
			case "invoice.json":
				a = invoice
			case "$DEMO_WORKFLOW":
				a = "a3916aea-f8b7-42e0-b2f5-d9093258123d"
			}
			args = append(args, a)
		}
		r := runCLI(t, args...)
		require.Equal(t, 2, r.code, "%s: %s", line, r.stderr)
		require.Equal(t, want+"\n", r.stderr, "docs/client.md shows, for %s", line)
		require.Empty(t, r.stdout)
		checked++
	}
	require.GreaterOrEqual(t, checked, 2, "the usage errors of docs/client.md's examples")
}
