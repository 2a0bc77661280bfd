package cli

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/valruns/valruns/docs"
)

// Release is the release this source is: the spec's info.version, set by
// apidoc.go's @version (its one source, which GET / answers too), and the
// newest release of CHANGELOG.md (TestReleaseIsChangelogs checks that they
// agree). Raise both together when releasing, run make docs, and tag the
// commit v<Release> and client/v<Release> (the Go client is a module of
// its own, tagged with its directory).
var Release = docs.SwaggerInfo.Version

// gitRevision and gitModified are the git revision and whether the
// checkout had uncommitted changes ("true"), set by scripts/build.sh with
// -ldflags -X where go build does not record them itself: in a git
// worktree, whose .git is a file Go does not look for.
var gitRevision, gitModified string

// cmdVersion is `valruns version` (and `valruns --version`): the release and
// the git revision the binary was built from.
func cmdVersion(_ context.Context, args []string, out io.Writer) error {
	fs := flags("version", "version", out,
		"Prints what this binary was built from: the release (the newest release of CHANGELOG.md), the\n"+
			"git revision and its time (\"modified\" when the checkout had uncommitted changes), and the Go\n"+
			"version. The revision is recorded by `make build` (go build -buildvcs=auto); a build without it\n"+
			"says so. `valruns --version` is the same.")
	if err := parseFlagsOnly(fs, args); err != nil {
		return err
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		bi = nil
	}
	_, err := io.WriteString(out, versionText(bi))
	return err
}

// versionText is the version as `valruns version` prints it, from the
// build information (nil when the binary has none):
//
//	valruns 0.1.0
//	revision 0123abcd... 2026-01-02T03:04:05Z modified
//	go1.26.8 linux/amd64
func versionText(bi *debug.BuildInfo) string {
	var b strings.Builder
	goVersion := runtime.Version()
	settings := map[string]string{}
	if bi != nil {
		goVersion = bi.GoVersion
		for _, s := range bi.Settings {
			settings[s.Key] = s.Value
		}
	}
	if settings["vcs.revision"] == "" && gitRevision != "" {
		settings["vcs.revision"], settings["vcs.modified"] = gitRevision, gitModified
	}
	fmt.Fprintf(&b, "valruns %s\n", Release)
	if rev := settings["vcs.revision"]; rev != "" {
		fmt.Fprintf(&b, "revision %s", rev)
		if t := settings["vcs.time"]; t != "" {
			fmt.Fprintf(&b, " %s", t)
		}
		if settings["vcs.modified"] == "true" {
			b.WriteString(" modified")
		}
		b.WriteString("\n")
	} else {
		b.WriteString("revision unknown (built without VCS information: outside a git checkout, or with -buildvcs=false)\n")
	}
	fmt.Fprintf(&b, "%s %s/%s\n", goVersion, runtime.GOOS, runtime.GOARCH)
	return b.String()
}
