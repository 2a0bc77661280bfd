package main

// Child processes (valruns serve and worker, the peer, redis-server), what
// /proc says about them (CPU time, resident memory), and the machine.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
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

// Tail is the end of the child's log, for error messages.
func (p *proc) Tail() string {
	b, _ := os.ReadFile(p.log)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-15):], "\n")
}

// waitHTTP waits until url answers 200, or the child ends, or timeout.
func (p *proc) waitHTTP(url string, timeout time.Duration) error {
	hc := &http.Client{Timeout: time.Second}
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if p.Exited() {
			return fmt.Errorf("%s exited: %v\n%s", p.name, p.err, p.Tail())
		}
		if resp, err := hc.Get(url); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
	}
	return fmt.Errorf("%s did not answer %s within %s\n%s", p.name, url, timeout, p.Tail())
}

// cpuTime is the process's user + system CPU time so far.
func cpuTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseStatCPU(string(b))
}

// parseStatCPU reads utime and stime (fields 14 and 15, in USER_HZ: 100 on
// every Linux architecture Go supports) of a /proc/PID/stat line.
func parseStatCPU(stat string) (time.Duration, error) {
	// The command name (field 2) is in parentheses and may hold spaces;
	// after it, f[0] is field 3.
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, errors.New("malformed /proc stat")
	}
	f := strings.Fields(stat[i+1:])
	if len(f) < 13 {
		return 0, errors.New("short /proc stat")
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100, errors.Join(err1, err2)
}

// usageMeter is a process's CPU time over a window; window is runLoad's
// OnWindow.
type usageMeter struct {
	pid        int
	start, CPU time.Duration
}

func (m *usageMeter) window(open bool) {
	c, _ := cpuTime(m.pid)
	if open {
		m.start = c
		return
	}
	m.CPU = c - m.start
}

// machine is what the numbers were measured on, as table rows.
func (e *env) machine() [][2]string {
	grep := func(path, re string) string {
		b, _ := os.ReadFile(path)
		if m := regexp.MustCompile(re).FindSubmatch(b); m != nil {
			return string(m[1])
		}
		return "?"
	}
	var pg string
	_ = e.admin.QueryRow(context.Background(), `SELECT current_setting('server_version') || ', fsync=' || current_setting('fsync') ||
		', synchronous_commit=' || current_setting('synchronous_commit') || ', max_connections=' || current_setting('max_connections') ||
		', shared_buffers=' || current_setting('shared_buffers')`).Scan(&pg)
	return [][2]string{
		{"CPU", fmt.Sprintf("%s, %d cores", grep("/proc/cpuinfo", `(?m)^model name\s*:\s*(.+)$`), runtime.NumCPU())},
		{"RAM", grep("/proc/meminfo", `(?m)^MemTotal:\s+([0-9]+ kB)`)},
		{"kernel", firstLine("uname", "-sr")}, {"PostgreSQL", pg}, {"Go", runtime.Version()}, {"Node", firstLine("node", "--version")},
		{"pgbench", firstLine("pgbench", "--version")}, {"Redis", firstLine("redis-server", "--version")},
		{"load average (1 min) before the run", loadavg()},
	}
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); len(f) > 0 {
		return f[0]
	}
	return "?"
}

func firstLine(name string, args ...string) string {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return "not available"
	}
	s, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return s
}
