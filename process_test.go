package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/valruns/valruns/internal/apitest"
	"github.com/valruns/valruns/internal/proctest"
	"github.com/valruns/valruns/internal/testdb"
	"github.com/valruns/valruns/models"
)

// These tests run the real binary: `valruns serve` processes on one
// database, killed with SIGKILL when a test needs a crash. They prove what
// no in-process test can: two processes share no memory, only PostgreSQL, and
// a dead process leaves nothing locked.

func TestMain(m *testing.M) { os.Exit(proctest.Run(m)) }

// TestProcIdempotency builds the binary once and runs the process tests on it.
func TestProcIdempotency(t *testing.T) {
	t.Parallel()
	bin := proctest.Binary(t)
	t.Run("two processes on one database, same-key storm: one run", func(t *testing.T) {
		t.Parallel()
		procTwoProcessStorm(t, bin)
	})
	t.Run("crash: killed inside its transaction, blocked on a lock: 409 until its orphaned backend exits, then the retry executes once", func(t *testing.T) {
		t.Parallel()
		procCrash(t, bin)
	})
}

// procServer is a running `valruns serve`.
type procServer struct {
	name   string
	url    string
	cmd    *exec.Cmd
	log    *proctest.Log
	exited chan struct{}
}

// procStart starts `valruns serve` on dbURL and waits until it answers
// /healthz. It is killed at the end of the test (before the database is
// dropped: cleanups run last-registered first).
func procStart(t *testing.T, bin, name, dbURL string, env ...string) *procServer {
	t.Helper()
	addr := proctest.FreeAddr(t)
	s := &procServer{name: name, url: "http://" + addr, log: &proctest.Log{}, exited: make(chan struct{})}
	s.cmd = exec.Command(bin, "serve")
	// No Redis: these tests are about the API; the runs it hands off are
	// dropped (a worker's sweeper would enqueue them).
	s.cmd.Env = proctest.Env(append([]string{"DATABASE_URL=" + dbURL, "HTTP_ADDR=" + addr, "LOG_FORMAT=json", "AUTH_CACHE_TTL=0",
		"REDIS_URL=redis://127.0.0.1:1/0"}, env...)...)
	s.cmd.Stdout = s.log
	s.cmd.Stderr = s.log
	require.NoError(t, s.cmd.Start())
	go func() {
		_ = s.cmd.Wait()
		close(s.exited)
	}()
	t.Cleanup(func() {
		s.kill()
		if t.Failed() {
			t.Logf("%s output:\n%s", s.name, s.log.String())
		}
	})

	proctest.WaitHTTP(t, s.url+"/healthz", proctest.ExitedChild(s.exited, s.log))
	return s
}

// kill sends SIGKILL and waits for the process to be gone.
func (s *procServer) kill() {
	select {
	case <-s.exited:
		return
	default:
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
}

// procAnswer is one HTTP answer.
type procAnswer struct {
	Status int
	Header http.Header
	Body   []byte
}

// procPost sends POST path to s with a token and an optional key.
func procPost(ctx context.Context, client *http.Client, s *procServer, path, token, key, body string) (procAnswer, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url+path, strings.NewReader(body))
	if err != nil {
		return procAnswer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := client.Do(req)
	if err != nil {
		return procAnswer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return procAnswer{Status: resp.StatusCode, Header: resp.Header, Body: b}, err
}

// procFixture is a database with an organisation, its token and a workflow
// created through the API of s.
type procFixture struct {
	db    *gorm.DB
	url   string
	org   string
	token string
}

func procNewDB(t *testing.T) *procFixture {
	t.Helper()
	db, u := testdb.New(t, testdb.Options{MaxOpenConns: 4})
	ctx := context.Background()
	org, err := models.NewOrgStore(db).Create(ctx, "proc")
	require.NoError(t, err)
	token, _, err := models.NewTokenStore(db).Create(ctx, org.ID)
	require.NoError(t, err)
	return &procFixture{db: db, url: u, org: org.ID, token: token}
}

func (f *procFixture) workflow(t *testing.T, s *procServer) string {
	t.Helper()
	r, err := procPost(context.Background(), http.DefaultClient, s, "/api/workflows/", f.token, "", `{"name":"proc"}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, r.Status, "create workflow: %s", r.Body)
	var w struct{ ID string }
	require.NoError(t, json.Unmarshal(r.Body, &w))
	return w.ID
}

func (f *procFixture) count(t *testing.T, q string, args ...any) int64 {
	t.Helper()
	var n int64
	require.NoError(t, f.db.Raw(q, args...).Scan(&n).Error)
	return n
}

// procCounts is what starts wrote: runs, usage, start keys.
type procCounts struct{ Runs, Usage, Keys int64 }

func (f *procFixture) counts(t *testing.T) procCounts {
	t.Helper()
	return procCounts{
		Runs:  f.count(t, `SELECT count(*) FROM validation_runs`),
		Usage: f.count(t, `SELECT coalesce(sum(runs), 0) FROM usage_slots`),
		Keys:  f.count(t, `SELECT count(*) FROM idempotency_keys WHERE endpoint = 'workflow_start'`),
	}
}

const procBody = `{"submission":{"total":42},"metadata":{"via":"process test"}}`

// procTwoProcessStorm: 40 clients, alternating between two processes, send
// the same new key at once, three rounds: each round makes one run; every
// answer is the one 201 or a 409, never a 5xx.
func procTwoProcessStorm(t *testing.T, bin string) {
	f := procNewDB(t)
	a := procStart(t, bin, "process A", f.url)
	b := procStart(t, bin, "process B", f.url)
	wf := f.workflow(t, a)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 40}, Timeout: 30 * time.Second}
	t.Cleanup(client.CloseIdleConnections)

	const clients, rounds = 40, 3
	for round := 1; round <= rounds; round++ {
		key := fmt.Sprintf("proc-storm-%d", round)
		answers := make([]procAnswer, clients)
		errs := make([]error, clients)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s := a
				if i%2 == 1 {
					s = b
				}
				<-start
				answers[i], errs[i] = procPost(context.Background(), client, s, "/api/workflows/"+wf+"/start/", f.token, key, procBody)
			}()
		}
		close(start)
		wg.Wait()

		tally := map[int]int{}
		fresh := 0
		var body string
		for i, r := range answers {
			require.NoError(t, errs[i], "request %d", i)
			tally[r.Status]++
			require.Contains(t, []int{http.StatusCreated, http.StatusConflict}, r.Status, "request %d: %s", i, r.Body)
			if r.Status == http.StatusCreated {
				if body == "" {
					body = string(r.Body)
				}
				require.Equal(t, body, string(r.Body), "every 201 is the same answer")
				if r.Header.Get("Idempotent-Replayed") != "true" {
					fresh++
				}
			}
		}
		t.Logf("round %d: answers by status %v", round, tally)
		require.Equal(t, 1, fresh, "exactly one request executed")
		n := int64(round)
		require.Equal(t, procCounts{Runs: n, Usage: n, Keys: n}, f.counts(t))
		require.EqualValues(t, 1, f.count(t, `SELECT count(*) FROM idempotency_keys WHERE key = ?`, key))
	}
}

// procCrash: process A is killed while its keyed start is blocked inside its
// transaction, on a usage slot the test holds and keeps holding. PostgreSQL
// notices a dead client only when the backend next uses its socket, and a
// backend waiting for a lock does not: the orphaned backend would keep the
// key's advisory lock until its statement ended. The request transaction's
// client_connection_check_interval makes it check, and exit on its own, with
// the test's lock still held; the statement timeout is set far beyond the
// test's patience, so it cannot be what ends it. Meanwhile every retry of
// the key gets 409, never a second run; then the retry executes, once.
func procCrash(t *testing.T, bin string) {
	f := procNewDB(t)
	// No statement of A may end by its timeout while the test waits.
	const txTimeout = "IDEMPOTENCY_TX_TIMEOUT=30m"
	a := procStart(t, bin, "process A", f.url, txTimeout)
	b := procStart(t, bin, "process B", f.url, txTimeout)
	wf := f.workflow(t, a)
	path := "/api/workflows/" + wf + "/start/"
	ctx := context.Background()

	r, err := procPost(ctx, http.DefaultClient, a, path, f.token, "", procBody)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, r.Status, "a prior run creates the usage slots: %s", r.Body)
	before := f.counts(t)
	require.Equal(t, procCounts{Runs: 1, Usage: 1, Keys: 0}, before)

	// Hold every usage slot, so A's start blocks inside its transaction
	// with the key's advisory lock taken.
	lockDB, err := sql.Open("pgx", f.url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = lockDB.Close() })
	lockTx, err := lockDB.BeginTx(ctx, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = lockTx.Rollback() })
	var slots int
	require.NoError(t, lockTx.QueryRow(`SELECT count(*) FROM (SELECT 1 FROM usage_slots WHERE org_id = $1 FOR UPDATE) s`, f.org).Scan(&slots))
	require.Equal(t, models.UsageSlots, slots, "the prior start created the usage slots")

	errc := make(chan error, 1)
	go func() {
		r, err := procPost(ctx, &http.Client{Timeout: 30 * time.Second}, a, path, f.token, "crash-1", procBody)
		if err == nil {
			err = fmt.Errorf("process A answered %d %s", r.Status, r.Body)
		}
		errc <- err
	}()

	waiting := func() []int64 { // backends blocked on a lock
		var pids []int64
		require.NoError(t, f.db.Raw(`SELECT pid FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&pids).Error)
		return pids
	}
	var orphan int64 // the pid of A's backend, blocked on the row
	apitest.Eventually(t, 15*time.Second, func() bool {
		if pids := waiting(); len(pids) == 1 {
			orphan = pids[0]
		}
		return orphan != 0
	}, "process A's request waiting for a usage slot")
	// objsubid 1: the bigint form, the keys' lock space (the usage slots'
	// slow path holds a two-int lock besides while it waits).
	keyLocks := func(pid int64) int64 {
		return f.count(t, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 AND pid = ?`, pid)
	}
	require.EqualValues(t, 1, keyLocks(orphan), "A holds the key's advisory lock")

	a.kill() // SIGKILL: no shutdown, no rollback sent by the process
	require.Error(t, <-errc, "A's client gets no answer")

	// Retry against B at once and keep retrying, as a client does, with the
	// slots still held: each answer is 409 while the orphan holds the key;
	// the first that is not starts executing and blocks on the slots too.
	type answer struct {
		status int
		body   string
		header http.Header
	}
	executed := make(chan answer, 1)
	var mu sync.Mutex
	var before409 []string // every answer before the one that executed
	go func() {
		for {
			r, err := procPost(ctx, &http.Client{Timeout: 5 * time.Minute}, b, path, f.token, "crash-1", procBody)
			if err != nil {
				executed <- answer{status: -1, body: err.Error()}
				return
			}
			if r.Status != http.StatusConflict {
				executed <- answer{status: r.Status, body: string(r.Body), header: r.Header}
				return
			}
			mu.Lock()
			before409 = append(before409, fmt.Sprintf("%d %s Retry-After=%q", r.Status, r.Body, r.Header.Get("Retry-After")))
			mu.Unlock()
			time.Sleep(20 * time.Millisecond)
		}
	}()

	// The orphan exits on its own, while the test still holds the slots, and
	// nothing of it committed.
	apitest.Eventually(t, 60*time.Second, func() bool {
		return f.count(t, `SELECT count(*) FROM pg_stat_activity WHERE pid = ?`, orphan) == 0
	}, "A's orphaned backend ends while the lock it waits for is still held")
	require.Equal(t, before, f.counts(t), "A committed nothing: no run, no key, no bill")

	// The retry now holds the key and waits for a slot like A did; release them.
	var retry int64
	apitest.Eventually(t, 60*time.Second, func() bool {
		for _, pid := range waiting() {
			if keyLocks(pid) == 1 {
				retry = pid
			}
		}
		return retry != 0
	}, "the retry to B executing, waiting for a usage slot with the key's lock")
	require.NoError(t, lockTx.Rollback())

	var got answer
	select {
	case got = <-executed:
	case <-time.After(60 * time.Second):
		t.Fatal("the retry to B did not finish within a minute of the slots' release")
	}
	mu.Lock()
	for _, a := range before409 {
		require.Contains(t, a, `"code":"idempotency_key_in_progress"`, "every answer before the execution")
		require.NotContains(t, a, `Retry-After=""`, "a 409 says when to retry")
	}
	t.Logf("retries answered 409 while the orphan held the key: %d", len(before409))
	mu.Unlock()
	require.Equal(t, http.StatusCreated, got.status, "body %s", got.body)
	require.Empty(t, got.header.Get("Idempotent-Replayed"), "executed, not replayed")
	require.Equal(t, procCounts{Runs: 2, Usage: 2, Keys: 1}, f.counts(t))
	require.EqualValues(t, 1, f.count(t, `SELECT count(*) FROM validation_runs WHERE idempotency_key = 'crash-1'`), "exactly one run for the key")
	require.Zero(t, f.count(t, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`), "no advisory lock left")

	r2, err := procPost(ctx, http.DefaultClient, b, path, f.token, "crash-1", procBody)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, r2.Status)
	require.Equal(t, "true", r2.Header.Get("Idempotent-Replayed"))
	require.Equal(t, got.body, string(r2.Body))
	require.Equal(t, procCounts{Runs: 2, Usage: 2, Keys: 1}, f.counts(t))
}

// TestProcDrain: on SIGTERM a `valruns serve` process first answers 503 on
// /readyz while it still serves requests, for SHUTDOWN_DRAIN, and only
// then stops accepting them and exits; a second signal ends the drain.
func TestProcDrain(t *testing.T) {
	t.Parallel()
	bin := proctest.Binary(t)
	f := procNewDB(t)
	get := func(s *procServer, path string) (int, string, error) {
		// A new connection per request: a draining server closes each.
		client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
		req, err := http.NewRequest(http.MethodGet, s.url+path, nil)
		if err != nil {
			return 0, "", err
		}
		req.Header.Set("Authorization", "Bearer "+f.token)
		resp, err := client.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), err
	}
	exited := func(s *procServer) bool {
		select {
		case <-s.exited:
			return true
		default:
			return false
		}
	}
	// draining sends SIGTERM, waits for /readyz to answer 503, and checks
	// that an API request is still served then.
	draining := func(s *procServer) {
		t.Helper()
		status, _, err := get(s, "/readyz")
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, status, "ready before the signal")
		require.NoError(t, s.cmd.Process.Signal(syscall.SIGTERM))
		var body string
		apitest.Eventually(t, 30*time.Second, func() bool {
			var status int
			status, body, err = get(s, "/readyz")
			require.NoError(t, err, "/readyz is served while the process drains")
			return status == http.StatusServiceUnavailable
		}, "/readyz answers 503 once the process was told to stop")
		require.Contains(t, body, `"code":"not_ready"`)
		status, body, err = get(s, "/api/workflows/")
		require.NoError(t, err, "requests are still served while /readyz answers 503")
		require.Equal(t, http.StatusOK, status, body)
		require.False(t, exited(s), "still running after answering")
	}

	t.Run("the drain ends by itself after SHUTDOWN_DRAIN", func(t *testing.T) {
		s := procStart(t, bin, "api", f.url, "SHUTDOWN_DRAIN=2s")
		draining(s)
		select {
		case <-s.exited:
		case <-time.After(time.Minute):
			t.Fatal("the process did not exit after its drain")
		}
		_, _, err := get(s, "/healthz")
		require.Error(t, err, "nothing accepts requests once the process has stopped")
		require.Contains(t, s.log.String(), `"msg":"draining`)
	})
	t.Run("a second signal ends a long drain", func(t *testing.T) {
		s := procStart(t, bin, "api", f.url, "SHUTDOWN_DRAIN=10m")
		draining(s)
		require.NoError(t, s.cmd.Process.Signal(syscall.SIGTERM))
		select {
		case <-s.exited:
		case <-time.After(time.Minute):
			t.Fatal("the process did not exit at the second signal")
		}
		require.Contains(t, s.log.String(), "second signal")
	})
}
