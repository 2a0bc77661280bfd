package main

// Child processes (valruns serve, valruns worker, the Node peer) and what
// /proc says about them: CPU time (utime + stime) and resident memory.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/valruns/valruns/config"
)

// proc is a child process the harness started.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

// childEnv is the harness's environment without any valruns setting (each
// child gets exactly the settings it is given), plus kv.
func childEnv(kv ...string) []string {
	settings := map[string]bool{}
	for _, v := range config.Vars {
		settings[v.Name] = true
	}
	var env []string
	for _, e := range os.Environ() {
		name, _, _ := strings.Cut(e, "=")
		if !settings[name] && !strings.HasPrefix(name, "BENCH_") {
			env = append(env, e)
		}
	}
	return append(env, kv...)
}

// startProc starts a child with its output in logDir/name.log.
func startProc(name, logDir, dir string, env []string, bin string, args ...string) (*proc, error) {
	logPath := filepath.Join(logDir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Env, cmd.Dir, cmd.Stdout, cmd.Stderr = env, dir, f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // never outlive the harness
	if err := cmd.Start(); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		_ = f.Close()
		close(p.done)
	}()
	return p, nil
}

// Pid is the child's process id.
func (p *proc) Pid() int { return p.cmd.Process.Pid }

// Exited reports whether the child has ended.
func (p *proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Stop asks the child to end (SIGTERM) and kills it after timeout.
func (p *proc) Stop(timeout time.Duration) {
	if p == nil || p.Exited() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(timeout):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// Wait waits for the child to end by itself.
func (p *proc) Wait(ctx context.Context) error {
	select {
	case <-p.done:
		return p.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Tail is the end of the child's log, for error messages.
func (p *proc) Tail() string {
	b, _ := os.ReadFile(p.log)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 15 {
		lines = lines[len(lines)-15:]
	}
	return strings.Join(lines, "\n")
}

// waitHTTP waits until url answers 200, or the child ends, or timeout.
func (p *proc) waitHTTP(url string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	hc := &http.Client{Timeout: time.Second}
	for time.Now().Before(deadline) {
		if p.Exited() {
			return fmt.Errorf("%s exited: %v\n%s", p.name, p.err, p.Tail())
		}
		if resp, err := hc.Get(url); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s did not answer %s within %s\n%s", p.name, url, timeout, p.Tail())
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat times: 100 on every
// Linux architecture Go supports except alpha and ia64, which it does not.
const clockTicks = 100

// cpuTime is the process's user + system CPU time so far.
func cpuTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseStatCPU(string(b))
}

// parseStatCPU reads utime and stime (fields 14 and 15) of a /proc/PID/stat line.
func parseStatCPU(stat string) (time.Duration, error) {
	// The command name (field 2) is in parentheses and may hold spaces.
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, errors.New("malformed /proc stat")
	}
	f := strings.Fields(stat[i+1:])
	// f[0] is field 3 (state); utime is field 14, stime field 15.
	if len(f) < 13 {
		return 0, errors.New("short /proc stat")
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return time.Duration(ut+st) * time.Second / clockTicks, nil
}

// memKB reads VmHWM (peak resident set) and VmRSS of a process, in kB.
func memKB(pid int) (hwm, rss int64, err error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	return parseStatusMem(bufio.NewScanner(f))
}

func parseStatusMem(sc *bufio.Scanner) (hwm, rss int64, err error) {
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		f := strings.Fields(val)
		if len(f) == 0 {
			continue
		}
		n, perr := strconv.ParseInt(f[0], 10, 64)
		if perr != nil {
			continue
		}
		switch name {
		case "VmHWM":
			hwm = n
		case "VmRSS":
			rss = n
		}
	}
	return hwm, rss, sc.Err()
}

// procUsage is a process's CPU over a window and its peak memory.
type procUsage struct {
	CPU     time.Duration // CPU time spent inside the window
	PeakRSS int64         // kB: VmHWM at the end of the window (peak since start)
}

// usageMeter takes /proc readings of a process at a window's open and
// close; window is runLoad's OnWindow.
type usageMeter struct {
	pid      int
	cpuStart time.Duration
	usage    procUsage
}

func (m *usageMeter) window(open bool) {
	c, _ := cpuTime(m.pid)
	if open {
		m.cpuStart = c
		return
	}
	m.usage.CPU = c - m.cpuStart
	hwm, rss, _ := memKB(m.pid)
	m.usage.PeakRSS = max(hwm, rss)
}
