package main

// What the numbers were measured on.

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
)

type machine struct {
	CPU, RAM, Kernel            string
	Cores                       int
	Postgres, Fsync, SyncCommit string
	MaxConns, SharedBuffers     string
	Go, Node, Pgbench, Redis    string
	RedisWhere, Commit          string
	// LoadStart and LoadEnd are /proc/loadavg's 1-minute figure at the start
	// and the end: well above 0 means something else shared the CPU.
	LoadStart, LoadEnd string
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}

func firstLine(name string, args ...string) string {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return "not available"
	}
	s := strings.TrimSpace(string(out))
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	return s
}

func (e *env) machine(ctx context.Context, root string) machine {
	m := machine{Cores: runtime.NumCPU(), Go: runtime.Version(), LoadStart: loadavg()}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
		_ = f.Close()
	}
	if f, err := os.Open("/proc/meminfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && k == "MemTotal" {
				var kb int64
				_, _ = fmt.Sscanf(strings.TrimSpace(v), "%d", &kb)
				m.RAM = fmt.Sprintf("%.1f GiB", float64(kb)/(1<<20))
				break
			}
		}
		_ = f.Close()
	}
	m.Kernel = firstLine("uname", "-sr")
	for _, s := range []struct {
		dst  *string
		name string
	}{{&m.Postgres, "server_version"}, {&m.Fsync, "fsync"}, {&m.SyncCommit, "synchronous_commit"},
		{&m.MaxConns, "max_connections"}, {&m.SharedBuffers, "shared_buffers"}} {
		if err := e.admin.QueryRow(ctx, "SELECT current_setting($1)", s.name).Scan(s.dst); err != nil {
			*s.dst = "?"
		}
	}
	m.Node = firstLine("node", "--version")
	m.Pgbench = firstLine("pgbench", "--version")
	if info, err := e.rdb.Info(ctx, "server").Result(); err == nil {
		for _, l := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(l), "redis_version:"); ok {
				m.Redis = v
			}
		}
	}
	m.RedisWhere = "a private redis-server started by the harness"
	if e.redisProc == nil {
		m.RedisWhere = "BENCH_REDIS_URL"
	}
	m.Commit = firstLine("git", "-C", root, "describe", "--always", "--dirty")
	return m
}
