package tasks_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/internal/apitest"
	"github.com/valruns/valruns/internal/proctest"
	"github.com/valruns/valruns/internal/tcpproxy"
)

// `valruns cleanup` from the shell: --dry-run counts and deletes nothing;
// without it, the expired keys are deleted in batches and counted.
func TestCleanupCommand(t *testing.T) {
	t.Parallel()
	bin := proctest.Binary(t)
	env := apitest.New(t)
	org := env.NewOrg("acme")
	insertKeys(t, env, org.ID, "expired-", 2_345, true)
	insertKeys(t, env, org.ID, "live-", 10, false)

	run := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = proctest.Env("DATABASE_URL="+env.DBURL, "CLEANUP_BATCH_SIZE=500", "LOG_LEVEL=error")
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		require.NoError(t, cmd.Run(), "valruns %s\nstdout: %s\nstderr: %s", strings.Join(args, " "), stdout.String(), stderr.String())
		return stdout.String()
	}

	out := run("cleanup", "--dry-run")
	require.Equal(t, "2345 expired idempotency keys would be deleted\n", out)
	require.EqualValues(t, 2_355, env.Count("idempotency_keys", ""), "a dry run deletes nothing")

	out = run("cleanup")
	require.Equal(t, "deleted 2345 expired idempotency keys\n", out)
	require.EqualValues(t, 10, env.Count("idempotency_keys", ""))
	require.EqualValues(t, 0, env.Count("idempotency_keys", "expires_at <= now()"))

	out = run("cleanup")
	require.Equal(t, "deleted 0 expired idempotency keys\n", out)
}

// workerProcess is `valruns worker` running as a child process.
type workerProcess struct {
	cmd *exec.Cmd
	out *proctest.Log
	// metricsAddr serves the worker's /metrics.
	metricsAddr string
}

// startWorkerProcess starts `valruns worker` on dbURL and redisURL with the
// default settings, except those in env (NAME=value).
func startWorkerProcess(t *testing.T, bin, dbURL, redisURL string, env ...string) *workerProcess {
	t.Helper()
	p := &workerProcess{out: &proctest.Log{}, metricsAddr: proctest.FreeAddr(t)}
	p.cmd = exec.Command(bin, "worker")
	p.cmd.Env = proctest.Env(append([]string{"DATABASE_URL=" + dbURL, "REDIS_URL=" + redisURL,
		"WORKER_METRICS_ADDR=" + p.metricsAddr, "LOG_FORMAT=json", "LOG_LEVEL=info",
		"SHUTDOWN_TIMEOUT=5s"}, env...)...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	require.NoError(t, p.cmd.Start())
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			t.Logf("valruns worker (pid %d) output:\n%s", p.cmd.Process.Pid, p.out.String())
		}
	})
	return p
}

// metric returns the value of one sample (its name with labels, as
// /metrics writes it) from the worker's /metrics; "" if absent.
func (p *workerProcess) metric(t *testing.T, sample string) string {
	t.Helper()
	resp, err := http.Get("http://" + p.metricsAddr + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, sample+" "); ok {
			return v
		}
	}
	return ""
}

// kill ends the process with SIGKILL: a crash, no shutdown.
func (p *workerProcess) kill(t *testing.T) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Kill())
	_ = p.cmd.Wait()
}

// stop asks the process to shut down (SIGTERM), then kills it if it does
// not exit in time.
func (p *workerProcess) stop() {
	if p.cmd.ProcessState != nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
	}
}

// A worker killed in the middle of a run: the run stays running with its
// first attempt uncommitted; a second worker takes it over once the run's
// lease has run out (the sweeper re-enqueues it; with fastRecovery this
// takes a second or two, where asynq's own recovery of the task takes about
// 1.5 minutes), and the run finishes exactly once.
//
// The run is held mid-execution deterministically (holdFinish): the
// worker's Finish, after its claim committed, blocks on a lock the test
// holds until it rolls back. The worker is killed while blocked there. The
// worker claims every run (RUN_FAST_PATH=0): this is about a run held under
// a lease.
func TestWorkerKilledMidRunIsTakenOverAndFinishesOnce(t *testing.T) {
	t.Parallel()
	bin := proctest.Binary(t)
	env := apitest.New(t)
	org := env.NewOrg("acme")
	wf := env.NewWorkflow(org, orderWorkflow)
	rdb := newRedis(t)
	ctx := context.Background()

	// Queued; no worker runs yet.
	id := startRun(t, env, org, wf, invalidOrder)
	other := startRun(t, env, org, wf, validOrder) // an ordinary run the first worker completes

	tx, blockerPID := holdFinish(t, env, `id = $1`, id)

	w1 := startWorkerProcess(t, bin, env.DBURL, redisURL(rdb), fastRecovery...)
	// Wait until the worker's Finish waits on the test's transaction.
	var workerPID int
	apitest.Eventually(t, 60*time.Second, func() bool {
		var pids []int
		err := env.DB.Raw(`SELECT pid FROM pg_stat_activity WHERE ? = ANY (pg_blocking_pids(pid))`, blockerPID).Scan(&pids).Error
		require.NoError(t, err)
		if len(pids) == 1 {
			workerPID = pids[0]
			return true
		}
		return false
	}, "the worker's Finish blocks on the test's lock")
	var query string
	require.NoError(t, env.DB.Raw(`SELECT query FROM pg_stat_activity WHERE pid = ?`, workerPID).Scan(&query).Error)
	require.Contains(t, query, "findings", "blocked in the UPDATE that writes the findings")
	mid := readRun(t, env, id)
	require.Equal(t, "running", mid.Status, "the claim committed")
	require.Equal(t, 1, mid.Attempts)

	require.Contains(t, w1.out.String(), `"msg":"worker running"`, "LOG_FORMAT=json")
	w1.kill(t)
	// The dead worker's backend sees its client gone while its statement
	// still waits, and exits (client_connection_check_interval): nothing of
	// the first attempt is committed.
	apitest.Eventually(t, 30*time.Second, func() bool {
		var n int64
		require.NoError(t, env.DB.Raw(`SELECT count(*) FROM pg_stat_activity WHERE pid = ?`, workerPID).Scan(&n).Error)
		return n == 0
	}, "the killed worker's database session ends while its Finish is still blocked")
	require.NoError(t, tx.Rollback(ctx))
	mid = readRun(t, env, id)
	require.Equal(t, "running", mid.Status)
	require.Equal(t, 1, mid.Attempts)
	require.Empty(t, dbFindings(t, env, id))

	startWorkerProcess(t, bin, env.DBURL, redisURL(rdb), fastRecovery...)
	var run apiRun
	apitest.Eventually(t, 3*time.Minute, func() bool {
		run = getRun(t, env, org, id)
		return finished(run.Status)
	}, "the second worker finishes the run")
	require.Equal(t, "failed", run.Status)
	require.Equal(t, 2, run.Attempts, "taken over once")
	require.Equal(t, invalidOrderFindings, run.Findings, "findings written once")
	require.Equal(t, invalidOrderFindings, dbFindings(t, env, id))
	require.Nil(t, run.Error)
	require.Equal(t, "passed", waitRun(t, env, org, other, time.Minute).Status)
	require.EqualValues(t, 0, env.Count("validation_runs", "status IN ('queued', 'running')"), "no run left running")
}

// fastRecovery are settings under which a dead worker's runs are taken over
// within seconds, for tests about what happens rather than how fast.
var fastRecovery = []string{"RUN_LEASE=1s", "RUN_SWEEP_INTERVAL=100ms", "RUN_REDELIVER_AFTER=500ms", "RUN_FAST_PATH=0"}

// Finding: a killed worker's runs stayed running for the whole run lease,
// then 5 min: 10 runs finished about 305 s after the kill. RUN_LEASE is now
// 15 s (the default, which this test uses). Here, with the
// default settings, two workers run; the first holds ten runs mid-execution
// under their claims (RUN_FAST_PATH=0 for it; each run's Finish waits on a
// lock the test holds) and is killed with SIGKILL. Every run must be final within
// 60 s of the kill, taken over once (attempt 2), its findings written once.
func TestKilledWorkersRunsFinishWithinAMinute(t *testing.T) {
	t.Parallel()
	bin := proctest.Binary(t)
	env := apitest.New(t)
	org := env.NewOrg("acme")
	wf := env.NewWorkflow(org, orderWorkflow)
	rdb := newRedis(t)
	ctx := context.Background()

	const n = 10 // the first worker holds them all
	ids := make([]string, n)
	for i := range ids {
		ids[i] = startRun(t, env, org, wf, invalidOrder)
	}
	tx, blockerPID := holdFinish(t, env, `true`)

	w1 := startWorkerProcess(t, bin, env.DBURL, redisURL(rdb), "RUN_FAST_PATH=0")
	var workerPIDs []int
	apitest.Eventually(t, 60*time.Second, func() bool {
		workerPIDs = nil
		require.NoError(t, env.DB.Raw(`SELECT pid FROM pg_stat_activity WHERE ? = ANY (pg_blocking_pids(pid))`,
			blockerPID).Scan(&workerPIDs).Error)
		return len(workerPIDs) == n
	}, "the first worker's ten Finish statements block on the test's lock")
	require.EqualValues(t, n, env.Count("validation_runs", "status = 'running' AND attempts = 1"))
	w2 := startWorkerProcess(t, bin, env.DBURL, redisURL(rdb))

	w1.kill(t)
	killed := time.Now()
	// Its backends exit while their statements still wait
	// (client_connection_check_interval): nothing of theirs commits.
	apitest.Eventually(t, 30*time.Second, func() bool {
		var n int64
		require.NoError(t, env.DB.Raw(`SELECT count(*) FROM pg_stat_activity WHERE pid IN ?`, workerPIDs).Scan(&n).Error)
		return n == 0
	}, "the killed worker's sessions end while their Finish statements are still blocked")
	require.NoError(t, tx.Rollback(ctx))
	for _, id := range ids {
		run := waitRun(t, env, org, id, time.Until(killed.Add(60*time.Second)))
		require.Equal(t, "failed", run.Status)
		require.Equal(t, 2, run.Attempts, "taken over once")
		require.Equal(t, invalidOrderFindings, run.Findings)
		require.Equal(t, invalidOrderFindings, dbFindings(t, env, id), "findings written once")
	}
	t.Logf("all %d runs final %s after the kill", n, time.Since(killed).Round(time.Second))
	require.EqualValues(t, 0, env.Count("validation_runs", "status IN ('queued', 'running')"))
	// The promise is above: each run final, taken over once, its findings
	// once. The second worker finished them all; its sweeper re-enqueued
	// them. (Its count is not exact: a redelivery whose run its delivery was
	// already writing may go uncounted, and a redelivery whose task was lost
	// after the count is sent again.)
	apitest.Eventually(t, 10*time.Second, func() bool {
		return w2.metric(t, `valruns_runs_finished_total{status="failed"}`) == strconv.Itoa(n)
	}, "the second worker finished each run once")
	redelivered := 0
	for _, reason := range []string{"lease_expired", "taker_stopped"} {
		n, err := strconv.Atoi(w2.metric(t, `valruns_runs_redelivered_total{reason="`+reason+`"}`))
		require.NoError(t, err)
		redelivered += n
	}
	require.Positive(t, redelivered, "the second worker's sweeper handed the runs on")
}

// holdFinish makes a worker's Finish of every run matching where block
// until the returned transaction ends (the caller rolls it back, or the
// test ends): a trigger on the UPDATE that writes a run's findings of such a
// run waits for an advisory lock the transaction holds. The claim, which
// writes no findings, does not wait. It returns the transaction and its
// backend's pid.
func holdFinish(t *testing.T, env *apitest.Env, where string, args ...any) (pgx.Tx, int) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, env.DB.Exec(`
CREATE TABLE test_held (id uuid PRIMARY KEY);
CREATE FUNCTION test_hold_finish() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF EXISTS (SELECT 1 FROM test_held WHERE id = NEW.id) THEN
		PERFORM pg_advisory_xact_lock_shared(7407);
	END IF;
	RETURN NEW;
END $$;
CREATE TRIGGER test_hold_finish BEFORE UPDATE ON validation_runs FOR EACH ROW
	WHEN (NEW.findings IS NOT NULL AND OLD.findings IS NULL) EXECUTE FUNCTION test_hold_finish();`).Error)
	require.NoError(t, env.DB.Exec(`INSERT INTO test_held SELECT id FROM validation_runs WHERE `+
		strings.ReplaceAll(where, "$1", "?"), args...).Error)
	blocker, err := pgx.Connect(ctx, env.DBURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = blocker.Close(ctx) })
	tx, err := blocker.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	var pid int
	require.NoError(t, tx.QueryRow(ctx, `SELECT pg_backend_pid(), pg_advisory_xact_lock(7407)`).Scan(&pid, nil))
	return tx, pid
}

// The `valruns worker` process's /readyz is honest: 200 while its task
// server runs and PostgreSQL and Redis answer, 503 not_ready (saying
// which) while Redis is down, 200 again once it is back; its /healthz
// (liveness) stays 200 throughout. Its /metrics has the backlog's gauges
// and the start-to-final histogram.
func TestWorkerProcessReadyz(t *testing.T) {
	t.Parallel()
	bin := proctest.Binary(t)
	env := apitest.New(t)
	rs := startRedisServer(t, proctest.FreePort(t))
	p := startWorkerProcess(t, bin, env.DBURL, "redis://"+rs.addr()+"/0")
	get := func(path string) (int, string) {
		t.Helper()
		client := &http.Client{Timeout: 10 * time.Second}
		resp, err := client.Get("http://" + p.metricsAddr + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}
	proctest.WaitHTTP(t, "http://"+p.metricsAddr+"/readyz", nil)
	for _, sample := range []string{"valruns_runs_unfinished", "valruns_runs_oldest_unfinished_seconds",
		"valruns_runs_waiting_fair_share", "valruns_worker_running", `valruns_run_start_to_final_seconds_count{status="passed"}`} {
		require.NotEmpty(t, p.metric(t, sample), "/metrics has %s", sample)
	}
	require.Equal(t, "1", p.metric(t, "valruns_worker_running"))

	rs.stop()
	var body string
	apitest.Eventually(t, 30*time.Second, func() bool {
		var status int
		status, body = get("/readyz")
		return status == http.StatusServiceUnavailable
	}, "/readyz answers 503 while Redis is down")
	require.Contains(t, body, `"code":"not_ready"`)
	require.Contains(t, body, "Redis does not answer")
	status, _ := get("/healthz")
	require.Equal(t, http.StatusOK, status, "liveness does not depend on Redis")

	rs.start()
	proctest.WaitHTTP(t, "http://"+p.metricsAddr+"/readyz", nil)
}

// A graceful stop of `valruns serve` (SIGTERM) hands every run it answered
// 201 to the queue before the process exits, as it would have without the
// stop: none is left queued for the sweeper, as a crash leaves them. Its
// Redis answers each call 100 ms late (a proxy), so that the hand-off is
// still at work when the HTTP server has answered its last start. Clients
// flood starts until the server stops taking them; SIGTERM comes once 200
// were accepted. Then a worker whose sweeper would not look at those runs
// for ten minutes (RUN_REDELIVER_AFTER) finishes every one.
func TestServeStopHandsOffEveryAcceptedRun(t *testing.T) {
	t.Parallel()
	bin := proctest.Binary(t)
	env := apitest.New(t)
	org := env.NewOrg("acme")
	wf := env.NewWorkflow(org, orderWorkflow)
	opt := newRedis(t)
	slow := tcpproxy.New(t, opt.Addr, tcpproxy.Late(func() time.Duration { return 100 * time.Millisecond })).Addr()

	addr := proctest.FreeAddr(t)
	log := &proctest.Log{}
	serve := exec.Command(bin, "serve")
	serve.Env = proctest.Env("DATABASE_URL="+env.DBURL, "REDIS_URL="+fmt.Sprintf("redis://%s/%d", slow, opt.DB),
		"HTTP_ADDR="+addr, "LOG_FORMAT=json", "LOG_LEVEL=warn", "SHUTDOWN_DRAIN=0", "RUN_REDELIVER_AFTER=10m")
	serve.Stdout, serve.Stderr = log, log
	require.NoError(t, serve.Start())
	exited := make(chan struct{})
	go func() { _ = serve.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = serve.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("valruns serve output:\n%s", log.String())
		}
	})
	proctest.WaitHTTP(t, "http://"+addr+"/healthz", proctest.ExitedChild(exited, log))

	var mu sync.Mutex
	var accepted []string // the runs answered 201
	var stop sync.Once
	body, err := json.Marshal(validOrder)
	require.NoError(t, err)
	var clients sync.WaitGroup
	for range 16 {
		clients.Go(func() {
			client := &http.Client{Timeout: time.Minute}
			for {
				req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/api/workflows/"+wf+"/start/", bytes.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+org.Token)
				resp, err := client.Do(req)
				if err != nil {
					return // the server no longer takes starts
				}
				b, err := io.ReadAll(resp.Body)
				_ = resp.Body.Close()
				if err != nil || resp.StatusCode != http.StatusCreated {
					t.Errorf("start: %d %s %v", resp.StatusCode, b, err)
					return
				}
				var run struct{ ID string }
				if err := json.Unmarshal(b, &run); err != nil || run.ID == "" {
					t.Errorf("start: %s %v", b, err)
					return
				}
				mu.Lock()
				accepted = append(accepted, run.ID)
				n := len(accepted)
				mu.Unlock()
				if n >= 200 {
					stop.Do(func() { _ = serve.Process.Signal(syscall.SIGTERM) })
				}
			}
		})
	}
	clients.Wait()
	select {
	case <-exited:
	case <-time.After(2 * time.Minute):
		t.Fatal("valruns serve did not exit within 2 minutes of SIGTERM")
	}
	t.Logf("%d starts accepted before the stop", len(accepted))

	startWorkerProcess(t, bin, env.DBURL, redisURL(opt), "RUN_REDELIVER_AFTER=10m")
	var left int64
	deadline := time.Now().Add(2 * time.Minute)
	for {
		left = env.Count("validation_runs", "id IN ? AND status NOT IN ('passed', 'failed', 'error')", accepted)
		if left == 0 {
			break
		}
		require.True(t, time.Now().Before(deadline),
			"%d of the %d runs answered 201 not final after 2 minutes of a worker: not handed off, they wait for the sweeper", left, len(accepted))
		time.Sleep(100 * time.Millisecond)
	}
	for _, line := range strings.Split(log.String(), "\n") {
		if strings.Contains(line, "runs not handed to the queue") {
			t.Errorf("a graceful stop left runs to the sweeper: %s", line)
		}
	}
}
