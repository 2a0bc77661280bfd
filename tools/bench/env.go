package main

// The benchmark's environment: a template database (migrated, with the
// organisations, tokens and workflows every scenario uses) cloned afresh
// for each measured run, and a Redis that nothing else uses.

import (
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
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/valruns/valruns/models"
)

// benchOrg is an organisation the load acts as.
type benchOrg struct {
	ID, Slug, Token, Workflow string
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

// benchQuota is the quota of the quota organisation: never reached in a run.
const benchQuota = 1_000_000_000

type env struct {
	root, bin, logDir string
	baseURL           *url.URL // DATABASE_URL
	pg                *pgx.ConnConfig
	admin             *pgx.Conn // to the server's maintenance database
	prefix            string
	tmpl              string
	seq               int
	created           map[string]bool

	redisURL  string
	redisProc *proc
	rdb       *redis.Client

	port      int // first of the harness's HTTP ports
	serverEnv []string

	orgs     []benchOrg // orgs[0] is the organisation of the single-org scenarios
	quotaOrg benchOrg
}

// dbURL is DATABASE_URL naming database name.
func (e *env) dbURL(name string) string {
	u := *e.baseURL
	u.Path = "/" + name
	return u.String()
}

func openEnv(ctx context.Context, root, bin, logDir string, norgs int, port int) (*env, error) {
	raw := cmpOr(os.Getenv("DATABASE_URL"), "postgres://postgres@127.0.0.1:5432/valruns?sslmode=disable")
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return nil, fmt.Errorf("DATABASE_URL=%q: the benchmark needs a postgres:// URL", raw)
	}
	pg, err := pgx.ParseConfig(raw)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	e := &env{root: root, bin: bin, logDir: logDir, baseURL: u, pg: pg,
		prefix: cmpOr(os.Getenv("BENCH_DB_PREFIX"), "valruns_bench") + fmt.Sprintf("_%d", os.Getpid()), created: map[string]bool{}, port: port}
	e.serverEnv = strings.Fields(os.Getenv("BENCH_SERVER_ENV"))
	admin := *u
	admin.Path = "/postgres"
	if e.admin, err = pgx.Connect(ctx, admin.String()); err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL (DATABASE_URL with database postgres): %w", err)
	}
	// The peer's, and every API's and worker's the loops may start.
	ports := []int{port + 1}
	for i := range maxAPIs {
		ports = append(ports, e.apiPort(i))
	}
	for j := range maxWorkers {
		ports = append(ports, e.workerPort(j))
	}
	for _, p := range ports {
		if ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p)); err != nil {
			e.close()
			return nil, fmt.Errorf("port %d is taken: set BENCH_PORT to a base port B with B to B+2, B+11 to B+13 and B+21 free", p)
		} else {
			_ = ln.Close()
		}
	}
	if err := e.openRedis(ctx); err != nil {
		e.close()
		return nil, err
	}
	if err := e.makeTemplate(ctx, norgs); err != nil {
		e.close()
		return nil, fmt.Errorf("template database: %w", err)
	}
	return e, nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// openRedis uses BENCH_REDIS_URL (its database is flushed), or starts a
// private redis-server on a free port, so the system's Redis never sees
// the benchmark.
func (e *env) openRedis(ctx context.Context) error {
	if u := os.Getenv("BENCH_REDIS_URL"); u != "" {
		e.redisURL = u
	} else {
		if _, err := exec.LookPath("redis-server"); err != nil {
			return errors.New("redis-server is not installed: install it (apt-get install redis-server) or set BENCH_REDIS_URL to a Redis database the benchmark may flush")
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		port := ln.Addr().(*net.TCPAddr).Port
		_ = ln.Close()
		p, err := startProc("redis", e.logDir, e.logDir, childEnv(), "redis-server",
			"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--dir", e.logDir, "--daemonize", "no")
		if err != nil {
			return err
		}
		e.redisProc = p
		e.redisURL = fmt.Sprintf("redis://127.0.0.1:%d/0", port)
	}
	opt, err := redis.ParseURL(e.redisURL)
	if err != nil {
		return fmt.Errorf("BENCH_REDIS_URL: %w", err)
	}
	e.rdb = redis.NewClient(opt)
	deadline := time.Now().Add(10 * time.Second)
	for {
		err = e.rdb.Ping(ctx).Err()
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("redis at %s: %w", e.redisURL, err)
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

// fresh clones the template into a new database for one run.
func (e *env) fresh(ctx context.Context) (string, error) {
	e.seq++
	name := fmt.Sprintf("%s_%d", e.prefix, e.seq)
	return name, e.createDB(ctx, name, e.tmpl)
}

// makeTemplate creates, migrates and fills the template database.
func (e *env) makeTemplate(ctx context.Context, norgs int) error {
	e.tmpl = e.prefix + "_tmpl"
	if err := e.createDB(ctx, e.tmpl, ""); err != nil {
		return err
	}
	url := e.dbURL(e.tmpl)
	cmd := exec.CommandContext(ctx, e.bin, "migrate", "up")
	cmd.Env = childEnv("DATABASE_URL=" + url)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("valruns migrate up: %v\n%s", err, out)
	}

	db, err := models.Open(ctx, url, models.DBOptions{MaxOpenConns: 4})
	if err != nil {
		return err
	}
	orgStore, tokens := models.NewOrgStore(db), models.NewTokenStore(db)
	mk := func(name string) (benchOrg, error) {
		org, err := orgStore.Create(ctx, name)
		if err != nil {
			return benchOrg{}, err
		}
		tok, _, err := tokens.Create(ctx, org.ID)
		return benchOrg{ID: org.ID, Slug: org.Slug, Token: tok}, err
	}
	for i := range norgs {
		o, err := mk(fmt.Sprintf("bench org %03d", i+1))
		if err != nil {
			_ = models.SQLDB(db).Close()
			return err
		}
		e.orgs = append(e.orgs, o)
	}
	if e.quotaOrg, err = mk("bench quota org"); err != nil {
		_ = models.SQLDB(db).Close()
		return err
	}
	// The quota is set before any server reads the token's principal
	// (an API process caches it, quota included, for AUTH_CACHE_TTL).
	err = db.WithContext(ctx).Exec(`UPDATE organizations SET monthly_run_quota = ? WHERE id = ?`, benchQuota, e.quotaOrg.ID).Error
	_ = models.SQLDB(db).Close()
	if err != nil {
		return err
	}

	// Workflows through the API, as a user makes them.
	srv, base, err := e.startServer(ctx, e.tmpl, false)
	if err != nil {
		return err
	}
	defer srv.Stop(10 * time.Second)
	hc := &http.Client{Timeout: 30 * time.Second}
	for i := range e.orgs {
		if e.orgs[i].Workflow, err = createWorkflow(hc, base, e.orgs[i].Token); err != nil {
			return err
		}
	}
	if e.quotaOrg.Workflow, err = createWorkflow(hc, base, e.quotaOrg.Token); err != nil {
		return err
	}
	// One start per organisation, as every active tenant has made this
	// month: the template then holds each organisation's usage slots,
	// balanced for its quota, so that a run (and pgbench's replay of the
	// captured statements, which are the fast path's) finds them.
	for _, o := range append(slices.Clone(e.orgs), e.quotaOrg) {
		if err := sendOnce(ctx, hc, base+o.startPath(), []byte(startBody), headerFor(o.Token, "")); err != nil {
			return fmt.Errorf("first start of %s: %w", o.Slug, err)
		}
	}
	return nil
}

func createWorkflow(hc *http.Client, base, token string) (string, error) {
	return createWorkflowBody(hc, base, token, workflowBody)
}

// createWorkflowBody creates the workflow body defines, as token's organisation.
func createWorkflowBody(hc *http.Client, base, token, body string) (string, error) {
	req, _ := http.NewRequest(http.MethodPost, base+"/api/workflows/", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusCreated {
		return "", fmt.Errorf("create workflow: %d %s", resp.StatusCode, b)
	}
	var wf struct{ ID string }
	if err := json.Unmarshal(b, &wf); err != nil || wf.ID == "" {
		return "", fmt.Errorf("create workflow: no id in %s", b)
	}
	return wf.ID, nil
}

// startServer runs `valruns serve` (with --worker when worker) on database
// db and waits until it is ready. It returns the process and its base URL.
func (e *env) startServer(ctx context.Context, db string, worker bool, extra ...string) (*proc, string, error) {
	return e.startServerURL(ctx, e.dbURL(db), worker, extra...)
}

func (e *env) startServerURL(ctx context.Context, dbURL string, worker bool, extra ...string) (*proc, string, error) {
	return e.startServerBin(ctx, e.bin, dbURL, worker, extra...)
}

// startServerBin is startServerURL with another valruns binary (a baseline's).
func (e *env) startServerBin(ctx context.Context, bin, dbURL string, worker bool, extra ...string) (*proc, string, error) {
	return e.startServerAt(ctx, bin, dbURL, worker, e.apiPort(0), extra...)
}

// startServerAt is startServerBin listening on port.
func (e *env) startServerAt(ctx context.Context, bin, dbURL string, worker bool, port int, extra ...string) (*proc, string, error) {
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	// No start rate: the bench measures throughput beside an unlimited
	// peer (BENCH_SERVER_ENV may set one). No drain at shutdown: no load
	// balancer watches its /readyz, and it stops servers between runs.
	kv := append([]string{"DATABASE_URL=" + dbURL, "HTTP_ADDR=" + addr, "REDIS_URL=" + e.redisURL, "ORG_START_RATE=0",
		"SHUTDOWN_DRAIN=0"}, e.serverEnv...)
	kv = append(kv, extra...)
	args := []string{"serve"}
	if worker {
		args = append(args, "--worker")
	}
	name := "serve"
	if port != e.apiPort(0) {
		name = fmt.Sprintf("serve-%d", port)
	}
	p, err := startProc(name, e.logDir, e.root, childEnv(kv...), bin, args...)
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

// startWorker runs `valruns worker` on database db.
func (e *env) startWorker(ctx context.Context, db string) (*proc, error) {
	return e.startWorkerBin(ctx, e.bin, e.dbURL(db))
}

// startWorkerBin runs `valruns worker` of binary bin on the database at
// dbURL, with extra settings (such as WORKER_CONCURRENCY=50).
func (e *env) startWorkerBin(ctx context.Context, bin, dbURL string, extra ...string) (*proc, error) {
	return e.startWorkerAt(ctx, bin, dbURL, e.workerPort(0), extra...)
}

// startWorkerAt is startWorkerBin serving its metrics on port.
func (e *env) startWorkerAt(ctx context.Context, bin, dbURL string, port int, extra ...string) (*proc, error) {
	metrics := fmt.Sprintf("127.0.0.1:%d", port)
	kv := append([]string{"DATABASE_URL=" + dbURL, "REDIS_URL=" + e.redisURL, "WORKER_METRICS_ADDR=" + metrics}, e.serverEnv...)
	kv = append(kv, extra...)
	name := "worker"
	if port != e.workerPort(0) {
		name = fmt.Sprintf("worker-%d", port)
	}
	p, err := startProc(name, e.logDir, e.root, childEnv(kv...), bin, "worker")
	if err != nil {
		return nil, err
	}
	if err := p.waitHTTP("http://"+metrics+"/healthz", 30*time.Second); err != nil {
		p.Stop(5 * time.Second)
		return nil, err
	}
	return p, nil
}

// connsSampler watches a database's connections while a window is open:
// how many the server held and how many were busy at most.
type connsSampler struct {
	stop chan struct{}
	done chan struct{}
	max  int
	busy int
}

func (e *env) sampleConns(ctx context.Context, db string) *connsSampler {
	s := &connsSampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		conn, err := pgx.Connect(ctx, e.dbURL("postgres"))
		if err != nil {
			return
		}
		defer conn.Close(context.Background())
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			var n, busy int
			if err := conn.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE state NOT IN ('idle'))
				FROM pg_stat_activity WHERE datname = $1`, db).Scan(&n, &busy); err == nil {
				s.max, s.busy = max(s.max, n), max(s.busy, busy)
			}
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

func (s *connsSampler) finish() { close(s.stop); <-s.done }
