package main

// The benchmark's environment: a template database (migrated, with the
// organisations, tokens and workflows every part uses) cloned afresh for
// each measured run, a Redis that nothing else uses, and the processes it
// starts: valruns serve and worker, the peer.

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
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
	baseURL           *url.URL // DATABASE_URL
	pg                *pgx.ConnConfig
	admin             *pgx.Conn // to the server's maintenance database
	prefix, tmpl      string
	seq               int
	created           map[string]bool

	redisURL  string
	redisProc *proc
	rdb       *redis.Client

	port      int // the first of the harness's HTTP ports (BENCH_PORT)
	serverEnv []string

	// orgs[0] is the organisation of every load but the noisy
	// neighbour's B, orgs[1].
	orgs []benchOrg
}

// Ports, from BENCH_PORT: valruns, the peer, the worker's metrics (or the
// peer's worker.js health check), the API's pprof.
func (e *env) apiPort() int    { return e.port }
func (e *env) peerPort() int   { return e.port + 1 }
func (e *env) workerPort() int { return e.port + 2 }
func (e *env) pprofPort() int  { return e.port + 3 }

// dbURL is DATABASE_URL naming database name.
func (e *env) dbURL(name string) string {
	u := *e.baseURL
	u.Path = "/" + name
	return u.String()
}

func (e *env) connect(ctx context.Context, db string) (*pgx.Conn, error) {
	return pgx.Connect(ctx, e.dbURL(db))
}

func openEnv(ctx context.Context, root, bin, logDir string, port int) (*env, error) {
	raw := cmp.Or(os.Getenv("DATABASE_URL"), "postgres://postgres@127.0.0.1:5432/valruns?sslmode=disable")
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return nil, fmt.Errorf("DATABASE_URL=%q: the benchmark needs a postgres:// URL", raw)
	}
	pg, err := pgx.ParseConfig(raw)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	e := &env{root: root, bin: bin, logDir: logDir, baseURL: u, pg: pg, port: port, created: map[string]bool{},
		prefix: cmp.Or(os.Getenv("BENCH_DB_PREFIX"), "valruns_bench") + fmt.Sprintf("_%d", os.Getpid()), serverEnv: strings.Fields(os.Getenv("BENCH_SERVER_ENV"))}
	for p := port; p <= e.pprofPort(); p++ {
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			return nil, fmt.Errorf("port %d is taken: set BENCH_PORT to a base port B with B to B+3 free", p)
		}
		_ = ln.Close()
	}
	admin := *u
	admin.Path = "/postgres"
	if e.admin, err = pgx.Connect(ctx, admin.String()); err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL (DATABASE_URL with database postgres): %w", err)
	}
	if err := e.openRedis(ctx); err != nil {
		e.close()
		return nil, err
	}
	if err := e.makeTemplate(ctx); err != nil {
		e.close()
		return nil, fmt.Errorf("template database: %w", err)
	}
	return e, nil
}

// startRedis starts a private redis-server on a free port, its log in
// logDir/name.log, and returns it with its URL.
func startRedis(logDir, name string) (*proc, string, error) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, "", errors.New("redis-server is not installed: install it (apt-get install redis-server) or set BENCH_REDIS_URL")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	p, err := startProc(name, logDir, logDir, childEnv(), "redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", logDir, "--daemonize", "no")
	return p, fmt.Sprintf("redis://127.0.0.1:%d/0", port), err
}

// dialRedis connects to url and waits until it answers.
func dialRedis(ctx context.Context, url string) (*redis.Client, error) {
	opt, err := redis.ParseURL(url)
	if err != nil {
		return nil, err
	}
	rdb := redis.NewClient(opt)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		err = rdb.Ping(ctx).Err()
		if err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		_ = rdb.Close()
		return nil, fmt.Errorf("redis at %s: %w", url, err)
	}
	return rdb, nil
}

// openRedis uses BENCH_REDIS_URL (its database is flushed), or starts a
// private redis-server, so the system's Redis never sees the benchmark.
func (e *env) openRedis(ctx context.Context) (err error) {
	if e.redisURL = os.Getenv("BENCH_REDIS_URL"); e.redisURL == "" {
		if e.redisProc, e.redisURL, err = startRedis(e.logDir, "redis"); err != nil {
			return err
		}
	}
	if e.rdb, err = dialRedis(ctx, e.redisURL); err != nil {
		return err
	}
	return e.flushRedis(ctx)
}

func (e *env) flushRedis(ctx context.Context) error { return e.rdb.FlushDB(ctx).Err() }

func (e *env) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if e.admin != nil {
		for name := range e.created {
			if err := e.dropDB(ctx, name); err != nil {
				fmt.Fprintf(os.Stderr, "bench: could not drop database %s: %v\n", name, err)
			}
		}
		_ = e.admin.Close(ctx)
	}
	if e.rdb != nil {
		if e.redisProc == nil {
			_ = e.rdb.FlushDB(ctx).Err()
		}
		_ = e.rdb.Close()
	}
	e.redisProc.Stop(5 * time.Second)
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

// fresh clones the template into a new database for one run, and empties
// Redis.
func (e *env) fresh(ctx context.Context) (string, error) {
	e.seq++
	name := fmt.Sprintf("%s_%d", e.prefix, e.seq)
	if err := e.createDB(ctx, name, e.tmpl); err != nil {
		return "", err
	}
	return name, e.flushRedis(ctx)
}

// makeTemplate creates the template database with the binary's own
// commands (migrate up, org create, token create), then through the API
// each organisation's workflow and one start, so that its usage slots of
// this month exist, as an active tenant's do.
func (e *env) makeTemplate(ctx context.Context) error {
	e.tmpl = e.prefix + "_tmpl"
	if err := e.createDB(ctx, e.tmpl, ""); err != nil {
		return err
	}
	url := e.dbURL(e.tmpl)
	cli := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, e.bin, args...)
		cmd.Env = childEnv("DATABASE_URL="+url, "REDIS_URL="+e.redisURL)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return "", fmt.Errorf("valruns %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
		}
		return string(out), nil
	}
	if _, err := cli("migrate", "up"); err != nil {
		return err
	}
	srv, base, err := e.startServer(ctx, url, false)
	if err != nil {
		return err
	}
	defer srv.Stop(10 * time.Second)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	hc := &http.Client{Timeout: 30 * time.Second}
	for _, name := range []string{"a", "b"} {
		var o benchOrg
		out, err := cli("org", "create", "bench org "+name)
		if m := orgCreated.FindStringSubmatch(out); err == nil && m == nil {
			err = fmt.Errorf("valruns org create said %q, not slug=... id=...", out)
		} else if err == nil {
			o.Slug, o.ID = m[1], m[2]
		}
		if err == nil {
			out, err = cli("token", "create", "--org", o.Slug)
			fs := strings.Fields(out)
			if err == nil && len(fs) > 0 {
				o.Token = fs[len(fs)-1]
			}
		}
		if err == nil {
			o.Workflow, err = createWorkflow(hc, base, o.Token, workflowBody)
		}
		if err == nil {
			err = sendOnce(ctx, hc, base+o.startPath(), []byte(startBody), headerFor(o.Token, ""))
		}
		if err == nil {
			err = conn.QueryRow(ctx, `SELECT t.id::text, (SELECT coalesce(max(quota), 0) FROM usage_slots s WHERE s.org_id = t.org_id)
				FROM api_tokens t WHERE t.org_id = $1`, o.ID).Scan(&o.TokenID, &o.Quota)
		}
		if err != nil {
			return fmt.Errorf("organisation %s: %w", name, err)
		}
		e.orgs = append(e.orgs, o)
	}
	return nil
}

var orgCreated = regexp.MustCompile(`slug=(\S+) id=(\S+)`)

// createWorkflow creates the workflow body defines, as token's organisation.
func createWorkflow(hc *http.Client, base, token, body string) (string, error) {
	req, _ := http.NewRequest(http.MethodPost, base+"/api/workflows/", strings.NewReader(body))
	req.Header = headerFor(token, "")
	resp, err := hc.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var wf struct{ ID string }
	if resp.StatusCode != http.StatusCreated || json.Unmarshal(b, &wf) != nil || wf.ID == "" {
		return "", fmt.Errorf("create workflow: %d %s", resp.StatusCode, b)
	}
	return wf.ID, nil
}

// startServer runs `valruns serve` (with --worker when worker) on the
// database at dbURL, with extra settings last, and waits until it is
// ready. It returns the process and its base URL.
func (e *env) startServer(ctx context.Context, dbURL string, worker bool, extra ...string) (*proc, string, error) {
	addr := fmt.Sprintf("127.0.0.1:%d", e.apiPort())
	// No start rate: the bench measures throughput beside an unlimited
	// peer (BENCH_SERVER_ENV may set one). No drain at shutdown: no load
	// balancer watches its /readyz, and it stops servers between runs.
	kv := append([]string{"DATABASE_URL=" + dbURL, "HTTP_ADDR=" + addr, "REDIS_URL=" + e.redisURL, "ORG_START_RATE=0",
		"SHUTDOWN_DRAIN=0"}, e.serverEnv...)
	args := []string{"serve"}
	if worker {
		args = append(args, "--worker")
	}
	p, err := startProc("serve", e.logDir, e.root, childEnv(append(kv, extra...)...), e.bin, args...)
	if err != nil {
		return nil, "", err
	}
	base := "http://" + addr
	if err := p.waitHTTP(base+"/readyz", 30*time.Second); err != nil {
		p.Stop(5 * time.Second)
		return nil, "", err
	}
	return p, base, nil
}

// startWorker runs `valruns worker` on the database at dbURL, with extra
// settings last (such as WORKER_CONCURRENCY=50).
func (e *env) startWorker(ctx context.Context, dbURL string, extra ...string) (*proc, error) {
	metrics := fmt.Sprintf("127.0.0.1:%d", e.workerPort())
	kv := append([]string{"DATABASE_URL=" + dbURL, "REDIS_URL=" + e.redisURL, "WORKER_METRICS_ADDR=" + metrics}, e.serverEnv...)
	p, err := startProc("worker", e.logDir, e.root, childEnv(append(kv, extra...)...), e.bin, "worker")
	if err != nil {
		return nil, err
	}
	if err := p.waitHTTP("http://"+metrics+"/healthz", 30*time.Second); err != nil {
		p.Stop(5 * time.Second)
		return nil, err
	}
	return p, nil
}

// startPeer runs the Node peer for orgs[0] on the database at dbURL, with
// its BullMQ worker in the same process when worker (without, the start
// curve leaves its queue to grow, as valruns' leaves queued runs).
func (e *env) startPeer(ctx context.Context, dbURL string, worker bool) (*proc, string, error) {
	kv := []string{"PORT=" + strconv.Itoa(e.peerPort()), "HOST=127.0.0.1", "DATABASE_URL=" + dbURL,
		"REDIS_URL=" + e.redisURL, "ORG_ID=" + e.orgs[0].ID, "NODE_ENV=production"}
	if worker {
		kv = append(kv, "PEER_WORKER=1")
	}
	p, err := startProc("peer", e.logDir, e.peerDir(), childEnv(kv...), "node", "server.js")
	if err != nil {
		return nil, "", err
	}
	base := fmt.Sprintf("http://127.0.0.1:%d", e.peerPort())
	if err := p.waitHTTP(base+"/healthz", 30*time.Second); err != nil {
		p.Stop(5 * time.Second)
		return nil, "", err
	}
	return p, base, nil
}

// startPeerWorker runs the peer's BullMQ worker as a process of its own
// (node worker.js), its health check on the worker's port.
func (e *env) startPeerWorker(ctx context.Context, dbURL string) (*proc, error) {
	kv := []string{"HEALTH_PORT=" + strconv.Itoa(e.workerPort()), "HOST=127.0.0.1", "DATABASE_URL=" + dbURL,
		"REDIS_URL=" + e.redisURL, "NODE_ENV=production"}
	p, err := startProc("peer-worker", e.logDir, e.peerDir(), childEnv(kv...), "node", "worker.js")
	if err != nil {
		return nil, err
	}
	if err := p.waitHTTP(fmt.Sprintf("http://127.0.0.1:%d/healthz", e.workerPort()), 30*time.Second); err != nil {
		p.Stop(5 * time.Second)
		return nil, err
	}
	return p, nil
}

// peerDir is the peer's directory (server.js, worker.js, node_modules),
// under the repository's root the harness runs from.
func (e *env) peerDir() string { return filepath.Join(e.root, "tools", "bench", "peer") }
