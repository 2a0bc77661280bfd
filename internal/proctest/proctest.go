// Package proctest helps tests that run the real valruns binary as child
// processes (several servers on one database, workers killed with SIGKILL,
// the cleanup command): it builds the binary once, gives children a clean
// configuration, collects their output and finds free ports.
package proctest

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valruns/valruns/config"
)

var build struct {
	once sync.Once
	dir  string
	path string
	err  error
	out  []byte
}

// Run runs a package's tests and removes the binary Binary built. Call it
// from TestMain: os.Exit(proctest.Run(m)).
func Run(m *testing.M) int {
	code := m.Run()
	if build.dir != "" {
		_ = os.RemoveAll(build.dir)
	}
	return code
}

// Binary builds the valruns command once per test binary and returns its
// path. Use Run in TestMain so the build is removed afterwards.
func Binary(t testing.TB) string {
	t.Helper()
	build.once.Do(func() {
		build.dir, build.err = os.MkdirTemp("", "valruns-bin-")
		if build.err != nil {
			return
		}
		build.path = filepath.Join(build.dir, "valruns")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		// A package path builds from any directory inside the module.
		cmd := exec.CommandContext(ctx, "go", "build", "-o", build.path, "github.com/valruns/valruns")
		build.out, build.err = cmd.CombinedOutput()
	})
	if build.err != nil {
		t.Fatalf("go build valruns: %v\n%s", build.err, build.out)
	}
	return build.path
}

// Env is the environment of a valruns child: the test's own, with every
// setting of config.Vars removed (so each takes its default), plus kv
// (NAME=value). The exceptions: ORG_START_RATE is 0 (unlimited) unless kv
// sets it, so that a test may flood one organisation (a test about the
// rate limit sets it: "ORG_START_RATE=" for the documented default); and
// REDIS_URL is RedisURL() unless kv sets it, since its default is the
// database `make run` uses, which no test may touch.
func Env(kv ...string) []string {
	settings := make(map[string]bool, len(config.Vars))
	for _, v := range config.Vars {
		settings[v.Name] = true
	}
	var env []string
	for _, e := range os.Environ() {
		if name, _, _ := strings.Cut(e, "="); !settings[name] {
			env = append(env, e)
		}
	}
	env = append(env, "ORG_START_RATE=0", "REDIS_URL="+RedisURL()) // a later duplicate in kv wins (os/exec)
	return append(env, kv...)
}

// Log is a bytes.Buffer safe for concurrent writers, such as a child's
// stdout and stderr.
type Log struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *Log) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *Log) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// handedOut are the ports FreePort returned in this process: the kernel
// may hand a port closed a moment ago to the next listener on port 0, so
// two children started at once could be given one port.
var handedOut = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// FreePort returns a loopback port nothing listens on right now, and that
// it has not returned before in this process.
func FreePort(t testing.TB) int {
	t.Helper()
	handedOut.Lock()
	defer handedOut.Unlock()
	for {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		_ = ln.Close()
		if !handedOut.ports[port] {
			handedOut.ports[port] = true
			return port
		}
	}
}

// FreeAddr is 127.0.0.1:FreePort().
func FreeAddr(t testing.TB) string {
	t.Helper()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(FreePort(t)))
}

// WaitHTTP polls url until it answers 200, for at most 30 s. exited, when
// not nil, tells whether the server under test has already ended (and how):
// then the test fails at once instead of waiting out the time.
func WaitHTTP(t testing.TB, url string, exited func() (why string, ended bool)) {
	t.Helper()
	client := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if exited != nil {
			if why, ended := exited(); ended {
				t.Fatalf("the server ended before %s answered: %s", url, why)
			}
		}
		if resp, err := client.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not answer 200 within 30s", url)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// NeedNodePackages installs the pinned npm packages of one part of
// scripts/install-bench-tools.sh (npm ci; the script installs Node.js too
// when missing and running as root), for a test that runs them (what says
// which). When it cannot, the test is skipped loudly: a skipped test must
// never pass unnoticed.
func NeedNodePackages(t testing.TB, part, what string) {
	t.Helper()
	cmd := exec.Command("bash", filepath.Join(moduleRoot(t), "scripts", "install-bench-tools.sh"), part)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	err := cmd.Run()
	if err == nil {
		return
	}
	bar := strings.Repeat("!", 72)
	msg := fmt.Sprintf("\n%s\nSKIPPING %s: no Node.js / npm packages for %s.\n"+
		"scripts/install-bench-tools.sh %s failed (%v): %s\n"+
		"Install Node.js and npm (apt-get install nodejs npm), then run it again.\n%s",
		bar, t.Name(), what, part, err, strings.TrimSpace(stderr.String()), bar)
	fmt.Fprintln(os.Stderr, msg)
	t.Skip(msg)
}

// moduleRoot is the directory of the module's go.mod, above the test's
// working directory (its package's).
func moduleRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}
