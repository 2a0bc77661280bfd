package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// stubGo is a `go` command for scripts/build.sh: STUB_ALL packages of which
// STUB_STALE are missing from the build cache, modules missing when
// STUB_NO_MODULES is set, a compile error when STUB_FAIL is set.
const stubGo = `#!/usr/bin/env bash
set -eu
case "$1 $2" in
"list -deps")
	if [[ " $* " == *" -f "* ]]; then
		for ((i = 0; i < STUB_ALL; i++)); do
			if ((i < STUB_STALE)); then echo true; else echo false; fi
		done
	elif [ -n "${STUB_NO_MODULES:-}" ] && [ "${GOPROXY:-}" = off ]; then
		exit 1
	fi ;;
"mod download") echo "stub: mod download" ;;
"build -v")
	for ((i = 0; i < STUB_STALE; i++)); do echo "example.com/p$i" >&2; done
	if [ -n "${STUB_FAIL:-}" ]; then echo "p0/x.go:1:1: syntax error" >&2; exit 1; fi
	out=; while [ $# -gt 0 ]; do [ "$1" = -o ] && out=$2; shift; done; : >"$out" ;;
build*) out=; while [ $# -gt 0 ]; do [ "$1" = -o ] && out=$2; shift; done; : >"$out" ;;
*) echo "stub go: unexpected $*" >&2; exit 2 ;;
esac
`

// TestBuildScript: scripts/build.sh (make build, make run) calls a build a
// first build only when most packages are to be compiled, says how many
// changed otherwise, shows progress in steps of a tenth off a terminal,
// says when it downloads modules, and passes a compile error through.
func TestBuildScript(t *testing.T) {
	t.Parallel()
	stub := filepath.Join(t.TempDir(), "go")
	require.NoError(t, os.WriteFile(stub, []byte(stubGo), 0o755))
	build := func(env ...string) (string, error) {
		t.Helper()
		out := filepath.Join(t.TempDir(), "valruns")
		cmd := exec.Command("scripts/build.sh", out)
		cmd.Env = append(os.Environ(), append([]string{"GO=" + stub}, env...)...)
		b, err := cmd.CombinedOutput()
		return string(b), err
	}

	out, err := build("STUB_ALL=565", "STUB_STALE=560")
	require.NoError(t, err, out)
	require.Contains(t, out, "first build with this Go version and build cache: compiling 560 packages")
	require.Equal(t, 10, strings.Count(out, "  compiled "), "a line per tenth, off a terminal:\n%s", out)
	require.Contains(t, out, "  compiled 560/560 packages")
	require.NotContains(t, out, "downloading")

	out, err = build("STUB_ALL=565", "STUB_STALE=3")
	require.NoError(t, err, out)
	require.Contains(t, out, "compiling 3 changed package(s)")
	require.NotContains(t, out, "first build")

	out, err = build("STUB_ALL=565", "STUB_STALE=0")
	require.NoError(t, err, out)
	require.Contains(t, out, "is up to date")
	require.NotContains(t, out, "first build")

	out, err = build("STUB_ALL=565", "STUB_STALE=560", "STUB_NO_MODULES=1")
	require.NoError(t, err, out)
	require.Contains(t, out, "downloading the Go modules")
	require.Less(t, strings.Index(out, "downloading"), strings.Index(out, "first build"))

	out, err = build("STUB_ALL=565", "STUB_STALE=4", "STUB_FAIL=1")
	require.Error(t, err, "a compile error fails the build:\n%s", out)
	require.Contains(t, out, "p0/x.go:1:1: syntax error")
	require.NotContains(t, out, "built ")
}

// TestRedisDBsScript: make run and make test refuse a REDIS_URL that names
// one of the tests' Redis databases (TEST_REDIS_URL's and 10 to 15 of its
// server), which the tests use and flush; any other is fine.
func TestRedisDBsScript(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		redis, test string
		ok          bool
	}{
		{"", "", true}, // the defaults: 0 on 127.0.0.1:6379, 9 on 127.0.0.1:16379
		{"redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/9", true},
		{"redis://127.0.0.1:6379/8", "redis://127.0.0.1:6379/9", true},
		{"redis://127.0.0.1:6379/9", "redis://127.0.0.1:6379/9", false},
		{"redis://localhost/12", "", true}, // the tests' default server is 127.0.0.1:16379
		{"redis://localhost:16379/12", "", false},
		{"redis://:secret@127.0.0.1:6379/15", "redis://127.0.0.1:6379/9", false},
		{"redis://127.0.0.1:6380/12", "redis://127.0.0.1:6379/9", true}, // another server
		{"redis://127.0.0.1:6379/3", "redis://127.0.0.1:6379/3", false},
	} {
		t.Run(fmt.Sprintf("%s vs %s", tt.redis, tt.test), func(t *testing.T) {
			cmd := exec.Command("scripts/redis-dbs.sh")
			cmd.Env = append(os.Environ(), "REDIS_URL="+tt.redis, "TEST_REDIS_URL="+tt.test)
			out, err := cmd.CombinedOutput()
			if tt.ok {
				require.NoError(t, err, "%s", out)
				require.Empty(t, out)
				return
			}
			require.Error(t, err)
			require.Contains(t, string(out), "which make test uses")
		})
	}
}
