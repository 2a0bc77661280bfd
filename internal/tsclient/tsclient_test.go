// Package tsclient proves that a TypeScript client generated from the API's
// OpenAPI 3 document compiles: openapi-typescript (pinned in package.json,
// installed with npm ci by scripts/install-bench-tools.sh tsclient) turns
// docs/openapi.yaml into types, and tsc type-checks client.ts against them.
package tsclient

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/internal/proctest"
)

// TestTypedClientCompiles generates the types into a temporary directory
// beside a copy of client.ts and runs tsc on it. client.ts starts a run with
// {"submission": {"customer": "ACME", "total": 42}}, reads status and
// findings, handles problem documents by their code, and holds lines that
// must not compile (@ts-expect-error), so a spec that says less than the
// server (an optional submission, a status of any string) fails too.
func TestTypedClientCompiles(t *testing.T) {
	t.Parallel()
	proctest.NeedNodePackages(t, "tsclient", "the typed-client test")
	here, err := os.Getwd()
	require.NoError(t, err)
	bin := func(name string) string { return filepath.Join(here, "node_modules", ".bin", name) }

	dir := t.TempDir()
	for _, f := range []string{"client.ts", "tsconfig.json"} {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, f), b, 0o644))
	}
	types := filepath.Join(dir, "generated", "api.d.ts")
	run(t, bin("openapi-typescript"), filepath.Join(here, "..", "..", "docs", "openapi.yaml"), "-o", types)
	b, err := os.ReadFile(types)
	require.NoError(t, err)
	require.Contains(t, string(b), `"/api/workflows/{id}/start/"`)
	require.Contains(t, string(b), "submission: unknown", "a submission is any JSON value")
	run(t, bin("tsc"), "-p", filepath.Join(dir, "tsconfig.json"))
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	cmd := exec.Command(name, args...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s %s:\n%s", filepath.Base(name), strings.Join(args, " "), out)
}
