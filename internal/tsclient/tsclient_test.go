// Package tsclient proves that a TypeScript client generated from the API's
// OpenAPI 3 document compiles: openapi-typescript (pinned in package.json,
// installed with npm ci by scripts/install-bench-tools.sh tsclient) turns
// docs/openapi.yaml into types, and tsc type-checks client.ts against them.
package tsclient

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTypedClientCompiles generates the types into a temporary directory
// beside a copy of client.ts and runs tsc on it. client.ts starts a run with
// {"submission": {"customer": "ACME", "total": 42}}, reads status and
// findings, handles problem documents by their code, and holds lines that
// must not compile (@ts-expect-error), so a spec that says less than the
// server (an optional submission, a status of any string) fails too.
func TestTypedClientCompiles(t *testing.T) {
	t.Parallel()
	needNodePackages(t)
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

// needNodePackages installs the pinned packages (npm ci) with the project's
// script, which installs Node.js too when missing and running as root. When
// it cannot, the test is skipped loudly: a skipped test must never pass
// unnoticed.
func needNodePackages(t *testing.T) {
	t.Helper()
	cmd := exec.Command("bash", "../../scripts/install-bench-tools.sh", "tsclient")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	err := cmd.Run()
	if err == nil {
		return
	}
	bar := strings.Repeat("!", 72)
	msg := fmt.Sprintf("\n%s\nSKIPPING %s: no Node.js / npm packages for the typed-client test.\n"+
		"scripts/install-bench-tools.sh tsclient failed (%v): %s\n"+
		"Install Node.js and npm (apt-get install nodejs npm), then run it again.\n%s",
		bar, t.Name(), err, strings.TrimSpace(stderr.String()), bar)
	fmt.Fprintln(os.Stderr, msg)
	t.Skip(msg)
}
