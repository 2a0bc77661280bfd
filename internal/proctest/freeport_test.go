package proctest_test

import (
	"testing"

	"github.com/valruns/valruns/internal/proctest"
)

// TestFreePortNeverTwice: the kernel picks a port at random for each
// listener on port 0, so among a thousand picks some repeat (about 18 in
// 28,000 ports); FreePort hands each port out once per process, so two
// children started at once never get one port.
func TestFreePortNeverTwice(t *testing.T) {
	seen := map[int]bool{}
	for range 1000 {
		p := proctest.FreePort(t)
		if seen[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		seen[p] = true
	}
}
