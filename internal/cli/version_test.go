package cli

import (
	"os"
	"regexp"
	"runtime"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestVersionText: the version names the release, the revision (from the
// build information, else from scripts/build.sh's -ldflags) and whether the
// checkout was modified, and says so when the revision is unknown.
func TestVersionText(t *testing.T) {
	goLine := "go1.26.8 " + runtime.GOOS + "/" + runtime.GOARCH + "\n"
	bi := func(settings ...debug.BuildSetting) *debug.BuildInfo {
		return &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/valruns/valruns", Version: "v1.2.3"}, Settings: settings}
	}
	first := "valruns " + Release + "\n"
	require.Equal(t, first+"revision 0123abcd 2026-01-02T03:04:05Z modified\n"+goLine, versionText(bi(
		debug.BuildSetting{Key: "vcs.revision", Value: "0123abcd"},
		debug.BuildSetting{Key: "vcs.time", Value: "2026-01-02T03:04:05Z"},
		debug.BuildSetting{Key: "vcs.modified", Value: "true"})))
	require.Equal(t, first+"revision 0123abcd\n"+goLine, versionText(bi(
		debug.BuildSetting{Key: "vcs.revision", Value: "0123abcd"},
		debug.BuildSetting{Key: "vcs.modified", Value: "false"})))
	require.Equal(t, first+"revision unknown (built without VCS information: outside a git checkout, or with -buildvcs=false)\n"+goLine,
		versionText(nil), "a binary without build information (and the Docker image's build, which has no .git)")

	gitRevision, gitModified = "feedbeef", "false"
	t.Cleanup(func() { gitRevision, gitModified = "", "" })
	require.Equal(t, first+"revision feedbeef\n"+goLine, versionText(bi()), "the revision scripts/build.sh passed")
}

// TestReleaseIsChangelogs: Release is the newest release of CHANGELOG.md
// (Keep a Changelog: "## [Unreleased]", then "## [X.Y.Z] - YYYY-MM-DD",
// newest first), and that release has a link at the foot of the file.
func TestReleaseIsChangelogs(t *testing.T) {
	b, err := os.ReadFile("../../CHANGELOG.md")
	require.NoError(t, err)
	heading := regexp.MustCompile(`(?m)^## \[([^\]]+)\](?: - (\d{4}-\d{2}-\d{2}))?$`)
	var newest string
	for _, m := range heading.FindAllStringSubmatch(string(b), -1) {
		if m[1] == "Unreleased" {
			continue
		}
		require.NotEmpty(t, m[2], "release %s has a date", m[1])
		newest = m[1]
		break
	}
	require.Equal(t, Release, newest, "CHANGELOG.md's newest release and apidoc.go's @version (internal/cli.Release) differ: raise both together, then make docs")
	require.Regexp(t, `(?m)^\[`+regexp.QuoteMeta(Release)+`\]: https://`, string(b), "CHANGELOG.md links its newest release")
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
