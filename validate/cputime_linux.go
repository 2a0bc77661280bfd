package validate

import (
	"time"

	"golang.org/x/sys/unix"
)

// threadCPU is the CPU time the calling OS thread has used, and whether it could be read.
// Run locks its goroutine to its thread, so the difference of two readings in one Run is
// the work of that validation alone: a stopped or CPU-starved process does not add to it.
func threadCPU() (time.Duration, bool) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0, false
	}
	return time.Duration(ts.Nano()), true
}
