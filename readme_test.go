package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/config"
	"github.com/valruns/valruns/internal/proctest"
)

// TestDocsConfigTable keeps the configuration table of docs/operations.md
// true: every setting config reads is a row, with its default.
func TestDocsConfigTable(t *testing.T) {
	b, err := os.ReadFile("docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Configuration\n")
	if !ok {
		t.Fatal("docs/operations.md has no ## Configuration section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	rows := map[string]string{}
	for _, line := range strings.Split(section, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`") {
			continue
		}
		rows[strings.Trim(strings.TrimSpace(cells[1]), "`")] = strings.Trim(strings.TrimSpace(cells[2]), "`")
	}
	for _, v := range config.Vars {
		def, ok := rows[v.Name]
		if !ok {
			t.Errorf("the configuration table of docs/operations.md has no row for %s", v.Name)
			continue
		}
		if def != v.Default {
			t.Errorf("docs/operations.md says %s defaults to %q, config says %q", v.Name, def, v.Default)
		}
	}
}

// TestREADMEWalkthrough runs the README's Quickstart, every sh block of
// that section top to bottom in one bash (set -euo pipefail), from a
// directory laid out like a clone after `make run`: bin/valruns and
// .dev/demo-token, against the service as `make run` runs it on a port
// other than the default, once as a reader who did not paste the export
// line make run printed and once as one who did. Its commands must succeed
// and its answers must be the ones the README describes.
func TestREADMEWalkthrough(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("README.md")
	require.NoError(t, err)
	_, section, ok := strings.Cut(string(b), "\n## Quickstart\n")
	require.True(t, ok, "README has a ## Quickstart section")
	section, _, _ = strings.Cut(section, "\n## ")
	var walkthrough strings.Builder
	for {
		_, rest, ok := strings.Cut(section, "```sh\n")
		if !ok {
			break
		}
		block, after, ok := strings.Cut(rest, "```")
		require.True(t, ok, "an sh block is closed")
		walkthrough.WriteString(block)
		section = after
	}
	require.NotEmpty(t, walkthrough.String(), "the Quickstart has commands")

	script := walkthrough.String()
	// No shell function of the Quickstart may shadow a command, a builtin
	// or a keyword its reader has (an id() helper once hid id(1)).
	for _, m := range regexp.MustCompile(`(?m)^\s*(?:function\s+)?([A-Za-z_][A-Za-z0-9_-]*)\s*\(\)`).FindAllStringSubmatch(script, -1) {
		out, _ := exec.Command("bash", "-c", `type -t "$1" || true`, "bash", m[1]).Output()
		require.Empty(t, strings.TrimSpace(string(out)), "the Quickstart's function %s() shadows a %s of that name", m[1], strings.TrimSpace(string(out)))
	}

	bin := proctest.Binary(t)
	dir := t.TempDir()
	_, addr, token, _ := proctest.MakeRun(t, bin, dir)
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "bin"), 0o755))
	require.NoError(t, os.Symlink(bin, filepath.Join(dir, "bin", "valruns")))

	run := func(env ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", script)
		cmd.Dir = dir
		// Empty is unset to the Quickstart; a later duplicate wins (os/exec).
		cmd.Env = append(proctest.Env("B=", "TOKEN="), env...)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "the Quickstart failed:\n%s", out)
		return string(out)
	}

	// As a reader who did not paste make run's export line: B from the
	// HTTP_ADDR make run was given (not the default port), TOKEN from the
	// file make run keeps.
	text := run("HTTP_ADDR=" + addr)
	for _, want := range []string{
		"HTTP/1.1 201 Created",              // the retry: the stored status...
		"Idempotent-Replayed: true",         // ...replayed
		`Ratelimit-Policy: "org";q=100;w=1`, // the default start rate (Go writes the name in canonical case)
		"\n422\n",                           // the same key, another body
		`"status":"passed"`,                 // the run, validated
		`"runs":1,`,                         // billed once: the replay and the 422 count nothing
		`"state":"finished"`,                // the key lookup...
		`"validation_run_id":"`,             // ...linked to its run
		`"status": "passed"`,                // valruns start --wait, indented
	} {
		require.Contains(t, text, want, "the Quickstart's output:\n%s", text)
	}

	requireRateLimitExamples(t, text)

	// As a reader who pasted make run's `export B=... TOKEN=...`: the
	// Quickstart keeps both, though this shell's HTTP_ADDR and the kept
	// token file would say otherwise.
	require.NoError(t, os.WriteFile(filepath.Join(dir, ".dev", "demo-token"), []byte("vr_not-the-token\n"), 0o600))
	text = run("B=http://"+addr, "TOKEN="+token, "HTTP_ADDR=127.0.0.1:1")
	for _, want := range []string{"Idempotent-Replayed: true", "\n422\n", `"status":"passed"`, `"status": "passed"`} {
		require.Contains(t, text, want, "the Quickstart's output with B and TOKEN exported:\n%s", text)
	}
}

// TestREADMEIsAFrontDoor keeps the README short enough to read in ten
// minutes, with every page of the manual one click away.
func TestREADMEIsAFrontDoor(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("README.md")
	require.NoError(t, err)
	readme := string(b)
	require.LessOrEqual(t, strings.Count(readme, "\n"), 300, "README.md is a front door of at most 300 lines: the manual is docs/")
	for _, page := range []string{"docs/api.md", "docs/operations.md", "docs/design.md", "docs/client.md", "reliability/README.md", "tools/bench/RESULTS.md"} {
		require.Contains(t, readme, "]("+page, "the README links %s", page)
	}
}

// rateLimitLine is a line of the rate limit headers, as sent or shown.
var rateLimitLine = regexp.MustCompile(`(?im)^(ratelimit(?:-policy)?): (.*)$`)

// requireRateLimitExamples: the RateLimit headers the docs show are the ones
// the Quickstart's start got (quickstart, its output), written as the
// server writes them: the same names and policy, the same form of what is
// left (r and t, which depend on the moment, may differ).
func requireRateLimitExamples(t *testing.T, quickstart string) {
	t.Helper()
	sent := map[string]string{}
	for _, m := range rateLimitLine.FindAllStringSubmatch(quickstart, -1) {
		sent[m[1]] = strings.TrimSpace(m[2])
	}
	require.Len(t, sent, 2, "the Quickstart's retry shows both headers:\n%s", quickstart)
	docs, err := filepath.Glob("docs/*.md")
	require.NoError(t, err)
	shown := 0
	for _, file := range append([]string{"README.md"}, docs...) {
		b, err := os.ReadFile(file)
		require.NoError(t, err)
		for _, m := range rateLimitLine.FindAllStringSubmatch(string(b), -1) {
			shown++
			value, ok := sent[m[1]]
			require.True(t, ok, "%s shows the header %q; the server sends %v", file, m[1], sent)
			if m[1] == "Ratelimit" {
				form := regexp.MustCompile(`^"org";r=\d+;t=\d+$`)
				require.Regexp(t, form, value)
				require.Regexp(t, form, m[2], "%s: %s", file, m[0])
				continue
			}
			require.Equal(t, value, m[2], "%s: %s", file, m[0])
		}
	}
	require.NotZero(t, shown, "the docs show the rate limit headers")
}
