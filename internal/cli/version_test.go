package cli

import (
	"os"
	"runtime"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestVersionText: the version names the module version, the revision
// (from the build information, else from scripts/build.sh's -ldflags) and
// whether the checkout was modified, and says so when the revision is unknown.
func TestVersionText(t *testing.T) {
	goLine := "go1.26.8 " + runtime.GOOS + "/" + runtime.GOARCH + "\n"
	bi := func(settings ...debug.BuildSetting) *debug.BuildInfo {
		return &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/valruns/valruns", Version: "v1.2.3"}, Settings: settings}
	}
	require.Equal(t, "valruns v1.2.3\nrevision 0123abcd 2026-01-02T03:04:05Z modified\n"+goLine, versionText(bi(
		debug.BuildSetting{Key: "vcs.revision", Value: "0123abcd"},
		debug.BuildSetting{Key: "vcs.time", Value: "2026-01-02T03:04:05Z"},
		debug.BuildSetting{Key: "vcs.modified", Value: "true"})))
	require.Equal(t, "valruns v1.2.3\nrevision 0123abcd\n"+goLine, versionText(bi(
		debug.BuildSetting{Key: "vcs.revision", Value: "0123abcd"},
		debug.BuildSetting{Key: "vcs.modified", Value: "false"})))
	require.Contains(t, versionText(bi()), "\nrevision unknown (built without VCS information")

	gitRevision, gitModified = "feedbeef", "false"
	t.Cleanup(func() { gitRevision, gitModified = "", "" })
	require.Equal(t, "valruns v1.2.3\nrevision feedbeef\n"+goLine, versionText(bi()), "the revision scripts/build.sh passed")
}

// TestTerminalThroughConsole: a command's out is Run's console; whether it
// is a terminal is its standard output's answer (valruns start shows its
// progress line by it). /dev/zero stands in for a terminal: a character
// device other than /dev/null.
func TestTerminalThroughConsole(t *testing.T) {
	f, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	require.NoError(t, err)
	defer f.Close()
	z, err := os.OpenFile("/dev/zero", os.O_WRONLY, 0)
	require.NoError(t, err)
	defer z.Close()
	require.True(t, isTerminal(&console{Writer: z, stderr: z}))
	require.False(t, isTerminal(&console{Writer: f, stderr: z}))
	require.True(t, isTerminal(stderrOf(&console{Writer: f, stderr: z})))
}
