package main

// The benchmark's environment: a template database (migrated, with the
// organisations every part uses), and each measurement's rig: a clone of
// it, a private redis-server, and the processes started on them.

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/valruns/valruns/config"
)

// benchOrg is an organisation the load acts as.
type benchOrg struct {
	ID, Slug, Token, TokenID, Workflow string
	// Quota is the quota its usage slots are balanced for (pgbench's).
	Quota int64
}

// startPath is the start route of the org's workflow.
func (o benchOrg) startPath() string { return "/api/workflows/" + o.Workflow + "/start/" }

// The workflow every organisation gets: the demo invoice of `make run`.
const workflowBody = `{"name":"bench invoice","schema":{"type":"object","required":["customer","total"],` +
	`"properties":{"customer":{"type":"string","minLength":1},"total":{"type":"number"}}},` +
	`"assertions":[{"name":"positive_total","expr":"submission.total > 0","severity":"error","message":"total must be positive"},` +
	`{"name":"large_total","expr":"submission.total < 10000","severity":"warning","message":"total is unusually large"}]}`

// startBody is the body of every start: a small invoice with two lines.
const startBody = `{"submission":{"customer":"ACME","total":42,"lines":[{"sku":"A-1","qty":2},{"sku":"B-7","qty":1}]},"metadata":{"source":"bench"}}`

type env struct {
	root, bin, logDir string
	baseURL           *url.URL  // DATABASE_URL
	admin             *pgx.Conn // to the server's maintenance database
	prefix, tmpl      string
	seq               int
	created           map[string]bool
	port              int // BENCH_PORT: the API, then the peer, the worker's metrics, the API's pprof
	serverEnv         []string
	// orgs[0] is the organisation of every load but the noisy neighbour's B, orgs[1].
	orgs []benchOrg
}

// dbURL is DATABASE_URL naming database name.
func (e *env) dbURL(name string) string {
	u := *e.baseURL
	u.Path = "/" + name
	return u.String()
}

func openEnv(ctx context.Context, root, bin, logDir string, port int) (*env, error) {
	raw := cmp.Or(os.Getenv("DATABASE_URL"), "postgres://postgres@127.0.0.1:5432/valruns?sslmode=disable")
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return nil, fmt.Errorf("DATABASE_URL=%q: the benchmark needs a postgres:// URL", raw)
	}
	e := &env{root: root, bin: bin, logDir: logDir, baseURL: u, port: port, created: map[string]bool{},
		prefix: cmp.Or(os.Getenv("BENCH_DB_PREFIX"), "valruns_bench") + fmt.Sprintf("_%d", os.Getpid()), serverEnv: strings.Fields(os.Getenv("BENCH_SERVER_ENV"))}
	for p := port; p <= port+3; p++ {
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			return nil, fmt.Errorf("port %d is taken: set BENCH_PORT to a base port B with B to B+3 free", p)
		}
		_ = ln.Close()
	}
	if e.admin, err = pgx.Connect(ctx, e.dbURL("postgres")); err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL (DATABASE_URL with database postgres): %w", err)
	}
	if err := e.makeTemplate(ctx); err != nil {
		e.close()
		return nil, err
	}
	return e, nil
}

// startRedis starts a private redis-server on a free port, its log in
// logDir/redis-PORT.log, and waits until it accepts connections.
func startRedis(logDir string) (*proc, string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", err
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	_, port, _ := net.SplitHostPort(addr)
	p, err := startProc("redis-"+port, logDir, logDir, childEnv(), "redis-server", "--port", port, "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", logDir)
	for deadline := time.Now().Add(10 * time.Second); err == nil; time.Sleep(20 * time.Millisecond) {
		c, derr := net.Dial("tcp", addr)
		if derr == nil {
			_ = c.Close()
			return p, "redis://" + addr + "/0", nil
		} else if p.Exited() || time.Now().After(deadline) {
			p.Stop(time.Second)
			err = fmt.Errorf("redis-server on %s: %v\n%s", addr, derr, p.Tail())
		}
	}
	return nil, "", err
}

func (e *env) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for name := range e.created {
		if err := e.dropDB(ctx, name); err != nil {
			fmt.Fprintf(os.Stderr, "bench: could not drop database %s: %v\n", name, err)
		}
	}
	_ = e.admin.Close(ctx)
}

func (e *env) createDB(ctx context.Context, name, template string) error {
	q := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize()
	if template != "" {
		q += " TEMPLATE " + pgx.Identifier{template}.Sanitize()
	}
	var err error
	for range 50 {
		if _, err = e.admin.Exec(ctx, q); err == nil {
			e.created[name] = true
			return nil
		}
		// "source database is being accessed by other users": an
		// autovacuum worker or a child that has not quite gone yet.
		if !strings.Contains(err.Error(), "55006") && !strings.Contains(err.Error(), "being accessed") {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
	return err
}

func (e *env) dropDB(ctx context.Context, name string) error {
	if !e.created[name] {
		return fmt.Errorf("refusing to drop %s: not created by this run", name)
	}
	_, err := e.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	if err == nil {
		delete(e.created, name)
	}
	return err
}

var orgCreated = regexp.MustCompile(`slug=(\S+) id=(\S+)`)

// makeTemplate creates the template database with the binary's own
// commands, then through the API each organisation's workflow and one
// start, so that its usage slots of this month exist, as a tenant's do.
func (e *env) makeTemplate(ctx context.Context) error {
	e.tmpl = e.prefix + "_tmpl"
	if err := e.createDB(ctx, e.tmpl, ""); err != nil {
		return err
	}
	r := &rig{e: e, db: e.tmpl}
	defer r.stop()
	if err := r.open(ctx); err != nil {
		return err
	}
	cli := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, e.bin, args...)
		cmd.Env = childEnv("DATABASE_URL="+e.dbURL(e.tmpl), "REDIS_URL="+r.redisURL)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return "", fmt.Errorf("template: valruns %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
		}
		return string(out), nil
	}
	if _, err := cli("migrate", "up"); err != nil {
		return err
	}
	if _, err := r.start(ctx, "serve"); err != nil {
		return err
	}
	for _, name := range []string{"a", "b"} {
		var o benchOrg
		out, err := cli("org", "create", "bench org "+name)
		if m := orgCreated.FindStringSubmatch(out); err == nil && m == nil {
			err = fmt.Errorf("valruns org create said %q, not slug=... id=...", out)
		} else if err == nil {
			o.Slug, o.ID = m[1], m[2]
			out, err = cli("token", "create", "--org", o.Slug)
			o.Token = strings.TrimSpace(out) // alone on stdout
		}
		if err == nil {
			o.Workflow, err = createWorkflow(ctx, r.base, o.Token, workflowBody)
		}
		if err == nil {
			_, err = post(ctx, r.base+o.startPath(), []byte(startBody), headerFor(o.Token, ""))
		}
		if err == nil {
			err = r.conn.QueryRow(ctx, `SELECT t.id::text, (SELECT coalesce(max(quota), 0) FROM usage_slots s WHERE s.org_id = t.org_id)
				FROM api_tokens t WHERE t.org_id = $1`, o.ID).Scan(&o.TokenID, &o.Quota)
		}
		if err != nil {
			return fmt.Errorf("template: organisation %s: %w", name, err)
		}
		e.orgs = append(e.orgs, o)
	}
	return nil
}

// createWorkflow creates the workflow body defines, as token's organisation.
func createWorkflow(ctx context.Context, base, token, body string) (string, error) {
	b, err := post(ctx, base+"/api/workflows/", []byte(body), headerFor(token, ""))
	var wf struct{ ID string }
	if err == nil && (json.Unmarshal(b, &wf) != nil || wf.ID == "") {
		err = fmt.Errorf("create workflow: no id in %s", b)
	}
	return wf.ID, err
}

// rig is one measurement's system: a clone of the template, a redis-server
// of its own, a connection to the database, and the processes started.
type rig struct {
	e            *env
	db, redisURL string
	redis        *proc
	conn         *pgx.Conn
	base         string // the API's URL, or the peer's
	procs        []*proc
}

// onRig runs f on a fresh rig running procs (started in order, each with
// extra), then closes the rig; a process that ended meanwhile is an error.
func (e *env) onRig(ctx context.Context, procs, extra []string, f func(*rig, []*proc) error) (err error) {
	e.seq++
	rg := &rig{e: e, db: fmt.Sprintf("%s_%d", e.prefix, e.seq)}
	if err = e.createDB(ctx, rg.db, e.tmpl); err != nil {
		return err
	}
	defer rg.close()
	if err = rg.open(ctx); err != nil {
		return err
	}
	ps := make([]*proc, len(procs))
	for i, what := range procs {
		if ps[i], err = rg.start(ctx, what, extra...); err != nil {
			return err
		}
	}
	return cmp.Or(f(rg, ps), rg.exited())
}

// open starts the rig's Redis and connects to its database.
func (r *rig) open(ctx context.Context) (err error) {
	if r.redis, r.redisURL, err = startRedis(r.e.logDir); err == nil {
		r.conn, err = pgx.Connect(ctx, r.e.dbURL(r.db))
	}
	return err
}

// start runs one of the rig's processes, extra settings last (the last of a
// name wins), and waits until it is ready: "serve [--worker]", "worker",
// "peer [--worker]" (BullMQ's worker in-process), "peer-worker" (worker.js).
func (r *rig) start(ctx context.Context, what string, extra ...string) (*proc, error) {
	e, api, aside := r.e, fmt.Sprintf("127.0.0.1:%d", r.e.port), fmt.Sprintf("127.0.0.1:%d", r.e.port+2)
	bin, dir, ready, args := e.bin, e.root, "http://"+aside+"/healthz", strings.Fields(what)
	var kv []string
	switch what {
	case "serve", "serve --worker":
		// No start rate beside an unlimited peer (BENCH_SERVER_ENV may set
		// one); no drain at shutdown: no load balancer watches it.
		r.base, ready = "http://"+api, "http://"+api+"/readyz"
		kv = append([]string{"HTTP_ADDR=" + api, "ORG_START_RATE=0", "SHUTDOWN_DRAIN=0"}, e.serverEnv...)
	case "worker":
		kv = append([]string{"WORKER_METRICS_ADDR=" + aside}, e.serverEnv...)
	case "peer", "peer --worker":
		peer := fmt.Sprintf("127.0.0.1:%d", e.port+1)
		bin, dir, args, r.base, ready = "node", e.peerDir(), []string{"server.js"}, "http://"+peer, "http://"+peer+"/healthz"
		kv = []string{"PORT=" + strconv.Itoa(e.port+1), "HOST=127.0.0.1", "ORG_ID=" + e.orgs[0].ID, "NODE_ENV=production"}
		if what == "peer --worker" {
			kv = append(kv, "PEER_WORKER=1")
		}
	case "peer-worker":
		bin, dir, args = "node", e.peerDir(), []string{"worker.js"}
		kv = []string{"HEALTH_PORT=" + strconv.Itoa(e.port+2), "HOST=127.0.0.1", "NODE_ENV=production"}
	default:
		return nil, fmt.Errorf("no process %q", what)
	}
	kv = append(append([]string{"DATABASE_URL=" + e.dbURL(r.db), "REDIS_URL=" + r.redisURL}, kv...), extra...)
	p, err := startProc(strings.Fields(what)[0], e.logDir, dir, childEnv(kv...), bin, args...)
	if err != nil {
		return nil, err
	}
	r.procs = append(r.procs, p)
	return p, p.waitHTTP(ready, 30*time.Second)
}

// exited is an error when one of the rig's processes has ended.
func (r *rig) exited() error {
	for _, p := range r.procs {
		if p.Exited() {
			return fmt.Errorf("%s exited during the run: %v\n%s", p.name, p.err, p.Tail())
		}
	}
	return nil
}

// stop stops the rig's processes, the last started first, and its Redis.
func (r *rig) stop() {
	for _, p := range slices.Backward(append([]*proc{r.redis}, r.procs...)) {
		p.Stop(20 * time.Second)
	}
	if r.conn != nil {
		_ = r.conn.Close(context.Background())
	}
}

// close stops the rig and drops its database.
func (r *rig) close() {
	r.stop()
	_ = r.e.dropDB(context.Background(), r.db)
}

// peerDir is the peer's directory, under the root the harness runs from.
func (e *env) peerDir() string { return filepath.Join(e.root, "tools", "bench", "peer") }

// Child processes (valruns, the peer, redis-server), their CPU time, the machine.

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

// usageMeter is a process's CPU time over a window (window: an OnWindow).
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
