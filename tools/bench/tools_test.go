package main

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
)

// benchTools is what scripts/install-bench-tools.sh said, per tool, once
// per test binary: nil when the tool is there (installed now if need be).
var benchTools sync.Map // tool -> *toolCheck

type toolCheck struct {
	once sync.Once
	err  error
}

// needTool makes sure a tool of the benchmark exists (pgbench, node,
// redis-server, or peer: the peer's Node packages) with the project's
// scripts/install-bench-tools.sh, which installs the Debian packages when
// missing and running as root, and npm ci in tools/bench/peer. When it cannot,
// the test is skipped loudly: a skipped test must never pass unnoticed.
func needTool(t *testing.T, tool string) {
	t.Helper()
	v, _ := benchTools.LoadOrStore(tool, &toolCheck{})
	c := v.(*toolCheck)
	c.once.Do(func() {
		cmd := exec.Command("bash", "../../scripts/install-bench-tools.sh", tool)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		if err := cmd.Run(); err != nil {
			c.err = fmt.Errorf("%v: %s", err, strings.TrimSpace(stderr.String()))
		}
	})
	if c.err == nil {
		return
	}
	bar := strings.Repeat("!", 72)
	msg := fmt.Sprintf("\n%s\nSKIPPING %s: the benchmark's %s is missing.\n"+
		"scripts/install-bench-tools.sh %s failed (%v).\n"+
		"Run it as root, or install what it names.\n%s", bar, t.Name(), tool, tool, c.err, bar)
	fmt.Fprintln(os.Stderr, msg)
	t.Skip(msg)
}
