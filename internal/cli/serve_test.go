package cli

import (
	"io"
	"log/slog"
	"math"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/config"
)

// serve gives the runtime the soft memory limit its body budget implies,
// counting the worker when it runs in the same process, unless GOMEMLIMIT
// chose one or the budget is unlimited. (Not parallel: the limit is the
// process's.)
func TestServeSetsMemoryLimit(t *testing.T) {
	before := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(before) })
	cfg, err := config.Load(func(string) (string, bool) { return "", false })
	require.NoError(t, err)
	a := &app{cfg: cfg, log: slog.New(slog.NewTextHandler(io.Discard, nil))}

	debug.SetMemoryLimit(math.MaxInt64)
	setMemoryLimit(a, "", false)
	require.EqualValues(t, 160<<20, debug.SetMemoryLimit(-1), "the defaults: 64 MiB + 12 x 8 MiB")

	debug.SetMemoryLimit(math.MaxInt64)
	setMemoryLimit(a, "", true)
	require.EqualValues(t, 272<<20, debug.SetMemoryLimit(-1), "serve --worker: 32 MiB + 2 x 1 MiB x 40 slots more")

	debug.SetMemoryLimit(math.MaxInt64)
	setMemoryLimit(a, "1GiB", true)
	require.EqualValues(t, int64(math.MaxInt64), debug.SetMemoryLimit(-1), "GOMEMLIMIT is the operator's: left alone")

	a.cfg.MaxBodyBytesInFlight = 0
	setMemoryLimit(a, "", true)
	require.EqualValues(t, int64(math.MaxInt64), debug.SetMemoryLimit(-1), "no body budget: no limit")
}
