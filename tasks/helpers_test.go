package tasks_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/internal/apitest"
	"github.com/valruns/valruns/internal/proctest"
	"github.com/valruns/valruns/internal/testredis"
	"github.com/valruns/valruns/tasks"
)

// Tests here use real PostgreSQL (a fresh database per test, from
// internal/testdb) and real Redis. Each test that touches Redis gets a DB
// number of its own from redisDBs and flushes it before and after; the
// Redis-down test runs a private redis-server instead.

func TestMain(m *testing.M) { os.Exit(proctest.Run(m)) }

// ---- Redis ---------------------------------------------------------------

// redisBase is TEST_REDIS_URL (internal/testredis): its address and
// credentials; the DB numbers tests use are 10 to 15.
func redisBase(t testing.TB) asynq.RedisClientOpt {
	t.Helper()
	opt, err := asynq.ParseRedisURI(testredis.URL(t))
	require.NoError(t, err, "TEST_REDIS_URL")
	o, ok := opt.(asynq.RedisClientOpt)
	require.True(t, ok, "TEST_REDIS_URL must name a single Redis server")
	return o
}

// redisDBs hands out the Redis DB numbers 10..15, one per test at a time.
var redisDBs = struct {
	sync.Mutex
	free  []int
	freed chan struct{} // signalled (non-blocking) when a number is returned
}{free: []int{10, 11, 12, 13, 14, 15}, freed: make(chan struct{}, 1)}

func takeRedisDB() (int, bool) {
	redisDBs.Lock()
	defer redisDBs.Unlock()
	if len(redisDBs.free) == 0 {
		return 0, false
	}
	n := redisDBs.free[0]
	redisDBs.free = redisDBs.free[1:]
	return n, true
}

func giveRedisDB(n int) {
	redisDBs.Lock()
	redisDBs.free = append(redisDBs.free, n)
	redisDBs.Unlock()
	select {
	case redisDBs.freed <- struct{}{}:
	default:
	}
}

// newRedis gives the test a Redis DB of its own, flushed now and when the
// test ends. It waits (bounded) while all six are in use.
func newRedis(t testing.TB) asynq.RedisClientOpt {
	t.Helper()
	base := redisBase(t)
	deadline := time.After(4 * time.Minute)
	n, ok := takeRedisDB()
	for !ok {
		select {
		case <-redisDBs.freed:
		case <-time.After(time.Second):
		case <-deadline:
			t.Fatal("no Redis DB number (10..15) became free in 4m")
		}
		n, ok = takeRedisDB()
	}
	opt := base
	opt.DB = n
	refuseForeignWorker(t, opt)
	flushRedis(t, opt)
	t.Cleanup(func() {
		flushRedis(t, opt)
		giveRedisDB(n)
	})
	return opt
}

func redisClient(opt asynq.RedisClientOpt) *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr: opt.Addr, Username: opt.Username, Password: opt.Password, DB: opt.DB,
		DialTimeout: 2 * time.Second, ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second,
	})
}

// flushRedis empties one of the test DB numbers, which testredis.URL
// checked were the tests' own.
func flushRedis(t testing.TB, opt asynq.RedisClientOpt) {
	t.Helper()
	c := redisClient(opt)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, testredis.Flush(ctx, c), "FLUSHDB %d", opt.DB)
}

// refuseForeignWorker fails the test, flushing nothing, when an asynq
// server that is not this test's is alive in the Redis DB it was handed (a
// `make run` whose REDIS_URL names it): the DB numbers 10..15 are the tests'
// own (docs/operations.md, Makefile, scripts/redis-dbs.sh), and a test's own servers are
// gone, and the DB flushed, before its number is handed out again.
func refuseForeignWorker(t testing.TB, opt asynq.RedisClientOpt) {
	t.Helper()
	live, err := liveServers(opt)
	require.NoError(t, err, "Redis DB %d at %s", opt.DB, opt.Addr)
	if live > 0 {
		t.Fatalf("Redis DB %d at %s holds %d live asynq server(s) that are not this test's (a `make run` with REDIS_URL=%s?): "+
			"the tests flush DBs 10 to 15 of TEST_REDIS_URL's server, so they stop here; give make run another DB (0 to 8) "+
			"or the tests another Redis (TEST_REDIS_URL)", opt.DB, opt.Addr, live, redisURL(opt))
	}
}

// liveServers counts the asynq servers whose heartbeat has not expired
// in the Redis DB opt names.
func liveServers(opt asynq.RedisClientOpt) (int64, error) {
	c := redisClient(opt)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return c.ZCount(ctx, "asynq:servers", strconv.FormatInt(time.Now().Unix(), 10), "+inf").Result()
}

func redisURL(opt asynq.RedisClientOpt) string {
	return fmt.Sprintf("redis://%s/%d", opt.Addr, opt.DB)
}

// redisServer is a private redis-server (no persistence) for tests that
// stop Redis; the system's Redis is never stopped.
type redisServer struct {
	t    testing.TB
	port int
	cmd  *exec.Cmd
	out  *proctest.Log
}

func startRedisServer(t testing.TB, port int) *redisServer {
	t.Helper()
	s := &redisServer{t: t, port: port, out: &proctest.Log{}}
	s.start()
	t.Cleanup(func() {
		s.stop()
		if t.Failed() {
			t.Logf("redis-server output:\n%s", s.out.String())
		}
	})
	return s
}

func (s *redisServer) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

func (s *redisServer) start() {
	s.t.Helper()
	require.Nil(s.t, s.cmd, "redis-server already running")
	cmd := exec.Command("/usr/bin/redis-server", "--port", strconv.Itoa(s.port), "--save", "", "--appendonly", "no",
		"--bind", "127.0.0.1", "--dir", s.t.TempDir())
	cmd.Stdout, cmd.Stderr = s.out, s.out
	require.NoError(s.t, cmd.Start())
	s.cmd = cmd
	c := redis.NewClient(&redis.Options{Addr: s.addr(), DialTimeout: time.Second})
	defer c.Close()
	apitest.Eventually(s.t, 20*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		return c.Ping(ctx).Err() == nil
	}, "private redis-server answers PING")
}

// stop kills the server (SIGKILL: like a crash) and waits for it to exit.
func (s *redisServer) stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

// ---- workers -------------------------------------------------------------

// testWorker is a tasks.Worker on an apitest Env's database.
type testWorker struct {
	*tasks.Worker
	Registry *prometheus.Registry
	Redis    asynq.RedisClientOpt
	stopOnce sync.Once
}

// Stop shuts the worker down (once; also done at cleanup).
func (w *testWorker) Stop() { w.stopOnce.Do(w.Shutdown) }

// newWorker builds a worker on env's database and Redis opt, with a short
// poll and retry delay and otherwise the default timings (lease, sweep);
// edit adjusts the configuration. It is not started.
func newWorker(t testing.TB, env *apitest.Env, opt asynq.RedisClientOpt, edit func(*tasks.Config)) *testWorker {
	t.Helper()
	logs := &proctest.Log{}
	reg := prometheus.NewRegistry()
	cfg := tasks.Config{
		DB: env.DB, Redis: opt,
		Concurrency:     4,
		RetryDelay:      100 * time.Millisecond,
		ShutdownTimeout: 10 * time.Second,
		// Retries due are pushed back within tens of milliseconds, not
		// the default's seconds: tests wait on them.
		PollInterval: 20 * time.Millisecond,
		Registry:     reg,
		Log:          slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
	}
	if edit != nil {
		edit(&cfg)
	}
	w, err := tasks.NewWorker(cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("worker log:\n%s", logs.String())
		}
	})
	return &testWorker{Worker: w, Registry: reg, Redis: opt}
}

// startWorker builds and starts a worker, and makes env's API hand its
// runs to the same Redis (as serve --worker does); it is shut down at
// cleanup.
func startWorker(t testing.TB, env *apitest.Env, opt asynq.RedisClientOpt, edit func(*tasks.Config)) *testWorker {
	t.Helper()
	w := newWorker(t, env, opt, edit)
	require.NoError(t, w.Start(context.Background()))
	t.Cleanup(w.Stop)
	handOff(t, env, opt)
	return w
}

// handOff makes env's API hand each committed run to Redis opt, through a
// tasks.Dispatcher closed at cleanup.
func handOff(t testing.TB, env *apitest.Env, opt asynq.RedisClientOpt) *tasks.Dispatcher {
	t.Helper()
	d := tasks.NewDispatcher(tasks.DispatcherConfig{Redis: opt, MaxRetry: 5, Timeout: time.Minute, GiveUp: 10 * time.Second})
	env.SetHandOff(d.HandOff)
	t.Cleanup(func() {
		env.SetHandOff(nil)
		d.Close()
	})
	return d
}

// fastSweep makes a worker take over stranded runs within seconds: for
// tests about what happens, not how fast. The lease is a hundred
// heartbeats long, so a delivery loses a live run only when its worker
// cannot renew for 10 s. A 1 s lease with a 200 ms heartbeat was not
// enough under -race beside a CPU hog (a run was executed twice). With 3 s,
// TestHeartbeatKeepsALongRunLeased and
// TestDeadWorkersRunIsRedeliveredWhenItsLeaseRunsOut each failed once in
// three runs of make test beside two busy loops, while the fault suite's
// clusters shared the cores: a renewal held up for 3 s is what a longer
// lease rules out. A stranded run's own lease is set by each test.
func fastSweep(c *tasks.Config) {
	c.RunLease = 10 * time.Second
	c.RunHeartbeat = 100 * time.Millisecond
	c.SweepInterval = 100 * time.Millisecond
	c.RedeliverAfter = 500 * time.Millisecond
}

// claimedPath turns the fast path off: every delivery claims its run and
// validates it under a lease (for tests of the lease, heartbeat, hand-back).
func claimedPath(c *tasks.Config) { c.FastBudget = -1 }

// idleRedis is a connection option for workers that are never started
// (their handlers are called directly): nothing connects to it.
func idleRedis() asynq.RedisClientOpt { return asynq.RedisClientOpt{Addr: "127.0.0.1:1", DB: 15} }

// ---- metrics -------------------------------------------------------------

// metricValue reads a counter or gauge from reg: the sample whose labels
// include labels (name=value pairs), summed; 0 when absent.
func metricValue(t testing.TB, reg prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if !hasLabels(m, labels) {
				continue
			}
			switch {
			case m.Counter != nil:
				sum += m.Counter.GetValue()
			case m.Gauge != nil:
				sum += m.Gauge.GetValue()
			}
		}
	}
	return sum
}

func hasLabels(m *dto.Metric, labels []string) bool {
	for i := 0; i+1 < len(labels); i += 2 {
		found := false
		for _, lp := range m.GetLabel() {
			if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// ---- API -----------------------------------------------------------------

// finding is a finding as GET /api/runs/{id}/ shows it.
type finding struct {
	Step     string `json:"step"`
	Severity string `json:"severity"`
	Path     string `json:"path"`
	Message  string `json:"message"`
}

// apiRun is a run as the API shows it.
type apiRun struct {
	ID       string    `json:"id"`
	Status   string    `json:"status"`
	Findings []finding `json:"findings"`
	Error    *string   `json:"error"`
	Attempts int       `json:"attempts"`
}

func finished(status string) bool {
	return status == "passed" || status == "failed" || status == "error"
}

// orderWorkflow is the workflow most tests use: a schema and three
// assertions, one of them a warning.
var orderWorkflow = map[string]any{
	"name": "orders",
	"schema": json.RawMessage(`{
		"type": "object",
		"required": ["customer", "total"],
		"properties": {
			"customer": {"type": "string", "minLength": 1},
			"total": {"type": "number", "minimum": 0}
		}
	}`),
	"assertions": []map[string]any{
		{"name": "positive_total", "expr": "submission.total > 0", "severity": "error", "message": "total must be positive"},
		{"name": "not_huge", "expr": "submission.total < 1000", "severity": "warning", "message": "total is unusually large"},
	},
}

// Submissions of orderWorkflow and what they yield.
var (
	validOrder   = map[string]any{"submission": map[string]any{"customer": "ACME", "total": 42}}
	invalidOrder = map[string]any{"submission": map[string]any{"customer": 5, "total": 0}}
	hugeOrder    = map[string]any{"submission": map[string]any{"customer": "ACME", "total": 5000}}

	invalidOrderFindings = []finding{
		{Step: "schema", Severity: "error", Path: "/customer", Message: "got number, want string"},
		{Step: "assertion:positive_total", Severity: "error", Path: "", Message: "total must be positive"},
	}
	hugeOrderFindings = []finding{
		{Step: "assertion:not_huge", Severity: "warning", Path: "", Message: "total is unusually large"},
	}
)

// startRun starts a run through the API (headers: name/value pairs) and
// returns its id; the answer must be 201.
func startRun(t testing.TB, env *apitest.Env, org apitest.Org, wfID string, body any, headers ...string) string {
	t.Helper()
	r := env.Do(http.MethodPost, "/api/workflows/"+wfID+"/start/", org.Token, body, headers...)
	require.Equal(t, http.StatusCreated, r.Status, "start: %s", r.Body)
	var run apiRun
	r.JSON(t, &run)
	require.Equal(t, "queued", run.Status)
	return run.ID
}

func getRun(t testing.TB, env *apitest.Env, org apitest.Org, id string) apiRun {
	t.Helper()
	r := env.Do(http.MethodGet, "/api/runs/"+id+"/", org.Token, nil)
	require.Equal(t, http.StatusOK, r.Status, "get run: %s", r.Body)
	var run apiRun
	r.JSON(t, &run)
	return run
}

// waitRun polls the run through the API until it has finished.
func waitRun(t testing.TB, env *apitest.Env, org apitest.Org, id string, timeout time.Duration) apiRun {
	t.Helper()
	var run apiRun
	apitest.Eventually(t, timeout, func() bool {
		run = getRun(t, env, org, id)
		return finished(run.Status)
	}, "run "+id+" finishes")
	return run
}

// dbRun is a run's row as the worker left it.
type dbRun struct {
	Status     string
	Attempts   int
	Error      *string
	FinishedAt *time.Time
	LeaseSet   bool
	Key        *string
}

func readRun(t testing.TB, env *apitest.Env, id string) dbRun {
	t.Helper()
	var r dbRun
	require.NoError(t, env.DB.Raw(`SELECT status, attempts, error, finished_at, lease_expires_at IS NOT NULL AS lease_set,
		idempotency_key AS key FROM validation_runs WHERE id = ?`, id).Scan(&r).Error)
	return r
}

// dbFindings lists a run's findings as stored, in order (nil before it finished).
func dbFindings(t testing.TB, env *apitest.Env, id string) []finding {
	t.Helper()
	var raw *string
	require.NoError(t, env.DB.Raw(`SELECT findings::text FROM validation_runs WHERE id = ?`, id).Scan(&raw).Error)
	if raw == nil {
		return nil
	}
	fs := []finding{}
	require.NoError(t, json.Unmarshal([]byte(*raw), &fs))
	return fs
}

// countFindings counts the findings stored for all runs.
func countFindings(t testing.TB, env *apitest.Env) int64 {
	t.Helper()
	var n int64
	require.NoError(t, env.DB.Raw(`SELECT coalesce(sum(json_array_length(findings)), 0) FROM validation_runs`).Scan(&n).Error)
	return n
}

// insertKeys inserts n idempotency keys of org in one statement: expired
// ones (created two days ago, expired a day ago) or live ones.
func insertKeys(t testing.TB, env *apitest.Env, orgID, prefix string, n int, expired bool) {
	t.Helper()
	created, expires := "now() - interval '1 hour'", "now() + interval '1 day'"
	if expired {
		created, expires = "now() - interval '2 days'", "now() - interval '1 day'"
	}
	res := env.DB.Exec(`
INSERT INTO idempotency_keys (org_id, endpoint, key, request_hash, request_method, request_path,
	response_status, response_body, request_id, created_at, expires_at)
SELECT ?, 'workflow_start', ? || i, sha256(i::text::bytea), 'POST', '/api/workflows/x/start',
	201, '\x7b7d'::bytea, 'req-' || i, `+created+`, `+expires+`
FROM generate_series(1, ?) AS i`, orgID, prefix, n)
	require.NoError(t, res.Error)
	require.EqualValues(t, n, res.RowsAffected)
}

// eventuallyMetric waits until metricValue(name, labels) == want: a
// handler's counters move just after the database shows its effect.
func eventuallyMetric(t testing.TB, reg prometheus.Gatherer, want float64, name string, labels ...string) {
	t.Helper()
	apitest.Eventually(t, 10*time.Second, func() bool { return metricValue(t, reg, name, labels...) == want },
		fmt.Sprintf("%s%v == %v (now %v)", name, labels, want, metricValue(t, reg, name, labels...)))
}

// noSweep leaves a worker's sweeper idle for the length of a test.
func noSweep(c *tasks.Config) { c.SweepInterval, c.RedeliverAfter = time.Minute, time.Minute }
