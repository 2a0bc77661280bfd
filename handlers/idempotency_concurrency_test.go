package handlers_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/config"
	"github.com/valruns/valruns/handlers"
	"github.com/valruns/valruns/idempotency"
	"github.com/valruns/valruns/internal/apitest"
	"github.com/valruns/valruns/models"
	"github.com/valruns/valruns/problem"
)

// idemAnswer is one answer of a storm.
type idemAnswer struct {
	Status   int
	Body     string
	Replayed bool
	Code     string // problem code, when a problem
	Retry    string // Retry-After
	Err      error  // transport error
}

// idemStorm sends n requests at once (released together by a barrier) over
// real HTTP; req(i) says what request i sends. An answer whose status is in
// retryOn is retried, the same request with the same key, as a client
// does; any other 5xx fails the test.
func idemStorm(t *testing.T, srv *httptest.Server, n int, req func(i int) (path, token, key, body string), retryOn ...int) []idemAnswer {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n}}
	t.Cleanup(client.CloseIdleConnections)
	answers := make([]idemAnswer, n)
	var ready, done sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		ready.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			path, token, key, body := req(i)
			ready.Done()
			<-start
			for attempt := 0; ; attempt++ {
				answers[i] = idemSend(client, srv.URL+path, token, key, body)
				if !slices.Contains(retryOn, answers[i].Status) || attempt == 50 {
					return
				}
				time.Sleep(50 * time.Millisecond)
			}
		}()
	}
	ready.Wait()
	close(start)
	done.Wait()
	for i, a := range answers {
		require.NoError(t, a.Err, "request %d", i)
		require.Less(t, a.Status, 500, "request %d: no 5xx in a storm: %s", i, a.Body)
	}
	return answers
}

// idemSend posts body to url and decodes the answer.
func idemSend(client *http.Client, url, token, key, body string) idemAnswer {
	hr, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return idemAnswer{Err: err}
	}
	hr.Header.Set("Content-Type", "application/json")
	hr.Header.Set("Authorization", "Bearer "+token)
	if key != "" {
		hr.Header.Set(idempotency.HeaderKey, key)
	}
	resp, err := client.Do(hr)
	if err != nil {
		return idemAnswer{Err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	a := idemAnswer{Status: resp.StatusCode, Body: string(b), Err: err,
		Replayed: resp.Header.Get(idempotency.HeaderReplayed) == "true", Retry: resp.Header.Get("Retry-After")}
	if resp.Header.Get("Content-Type") == problem.ContentType {
		var d struct {
			Code string `json:"code"`
		}
		_ = json.Unmarshal(b, &d)
		a.Code = d.Code
	}
	return a
}

// idemTally counts answers by status.
func idemTally(answers []idemAnswer) map[int]int {
	m := map[int]int{}
	for _, a := range answers {
		m[a.Status]++
	}
	return m
}

// requireOneExecution checks a storm of one key with one body: every
// answer is the one 201 (first or replayed, byte for byte) or a 409 in
// progress, and exactly one request executed. It returns the 201's body.
func requireOneExecution(t *testing.T, answers []idemAnswer) string {
	t.Helper()
	tally := idemTally(answers)
	t.Logf("answers by status: %v", tally)
	require.Equal(t, len(answers), tally[201]+tally[409], "only 201 or 409: %v", tally)
	var body string
	fresh := 0
	for _, a := range answers {
		switch a.Status {
		case 201:
			if body == "" {
				body = a.Body
			}
			require.Equal(t, body, a.Body, "every 201 is the same answer")
			if !a.Replayed {
				fresh++
			}
		case 409:
			require.Equal(t, idempotency.CodeKeyInProgress, a.Code)
			require.Equal(t, "1", a.Retry)
		}
	}
	require.Equal(t, 1, fresh, "exactly one request executed")
	return body
}

// TestStartStormSameKey: 50 clients send the same new key at once, five
// times over: each round creates exactly one run, bills once, stages one
// job, stores one key; every answer is the one 201 (first or replayed, byte
// for byte) or a 409.
func TestStartStormSameKey(t *testing.T) {
	t.Parallel()
	f := newIdemFixture(t, nil)
	srv := f.e.Server()
	const clients, rounds = 50, 5
	for round := 1; round <= rounds; round++ {
		t.Run(fmt.Sprintf("round %d", round), func(t *testing.T) {
			key := fmt.Sprintf("storm-%d", round)
			answers := idemStorm(t, srv, clients, func(int) (string, string, string, string) {
				return idemStartPath(f.wf), f.org.Token, key, idemBody
			})
			body := requireOneExecution(t, answers)
			require.Equal(t, idemCounts{Runs: int64(round), Usage: int64(round), Audits: int64(round), Keys: int64(round)},
				f.counts(t, f.org.ID))
			k := idemKeyRow(t, f.e, f.org.ID, handlers.ScopeWorkflowStart, key)
			require.NotNil(t, k)
			require.Equal(t, body, string(k.ResponseBody))
			require.EqualValues(t, 1, idemCount(t, f.e, `SELECT count(*) FROM validation_runs WHERE org_id = ? AND idempotency_key = ?`, f.org.ID, key))
			// Once the storm is over, everyone gets the replay.
			r := f.start(idemBody, idemKey(key)...)
			require.Equal(t, http.StatusCreated, r.Status)
			require.Equal(t, body, string(r.Body))
			require.Equal(t, "true", r.Header.Get(idempotency.HeaderReplayed))
		})
	}
}

// TestStartStormExpiredKey: 50 clients send a key whose row has expired,
// five times over (the newest row expired again before each round): each
// round writes one new row beside the expired ones (which stay until their
// partition is dropped, migration 0012), so one run more, billed once, and
// the key's newest row points to it; every answer is that 201 (first or
// replayed) or a 409.
func TestStartStormExpiredKey(t *testing.T) {
	t.Parallel()
	f := newIdemFixture(t, nil)
	const clients, rounds, key = 50, 5, "storm-expired"
	first := f.start(idemBody, idemKey(key)...)
	require.Equal(t, http.StatusCreated, first.Status, "%s", first.Body)
	for round := 1; round <= rounds; round++ {
		t.Run(fmt.Sprintf("round %d", round), func(t *testing.T) {
			require.NoError(t, f.e.DB.Exec(`UPDATE idempotency_keys SET created_at = now() - interval '25 hours',
				expires_at = now() - interval '1 hour' WHERE org_id = ? AND key = ? AND expires_at > now()`, f.org.ID, key).Error)
			// Through another process each round: the last round's caches
			// the answer it stored, for which no time passed
			// (anotherProcess).
			srv := f.anotherProcess().Server()
			answers := idemStorm(t, srv, clients, func(int) (string, string, string, string) {
				return idemStartPath(f.wf), f.org.Token, key, idemBody
			})
			body := requireOneExecution(t, answers)
			runs := int64(round + 1)
			require.Equal(t, idemCounts{Runs: runs, Usage: runs, Audits: runs, Keys: runs}, f.counts(t, f.org.ID), "a key row per run")
			var live int64
			require.NoError(t, f.e.DB.Raw(`SELECT count(*) FROM idempotency_keys WHERE org_id = ? AND key = ? AND expires_at > now()`,
				f.org.ID, key).Scan(&live).Error)
			require.EqualValues(t, 1, live, "one live row")
			k := idemKeyRow(t, f.e, f.org.ID, handlers.ScopeWorkflowStart, key)
			require.NotNil(t, k)
			require.Equal(t, body, string(k.ResponseBody))
			require.True(t, k.ExpiresAt.After(time.Now()), "the row lives again")
			var newest string
			require.NoError(t, f.e.DB.Raw(`SELECT id FROM validation_runs WHERE org_id = ? ORDER BY created_at DESC, id DESC LIMIT 1`,
				f.org.ID).Scan(&newest).Error)
			require.NotNil(t, k.ValidationRunID)
			require.Equal(t, newest, *k.ValidationRunID, "the key points to this round's run")
		})
	}
}

// TestStartStormSameKeyTwoBodies: half the storm sends another body under the
// same key: still one run; answers are 201 (the winner's body), 409 or 422.
func TestStartStormSameKeyTwoBodies(t *testing.T) {
	t.Parallel()
	f := newIdemFixture(t, nil)
	answers := idemStorm(t, f.e.Server(), 40, func(i int) (string, string, string, string) {
		if i%2 == 0 {
			return idemStartPath(f.wf), f.org.Token, "mixed", idemBody
		}
		return idemStartPath(f.wf), f.org.Token, "mixed", idemBodyB
	})
	tally := idemTally(answers)
	t.Logf("answers by status: %v", tally)
	require.Equal(t, 40, tally[201]+tally[409]+tally[422], "only 201, 409 or 422: %v", tally)
	fresh := 0
	for _, a := range answers {
		if a.Status == 201 && !a.Replayed {
			fresh++
		}
		if a.Status == 422 {
			require.Equal(t, idempotency.CodeKeyReused, a.Code)
		}
	}
	require.Equal(t, 1, fresh)
	require.Equal(t, idemCounts{Runs: 1, Usage: 1, Audits: 1, Keys: 1}, f.counts(t, f.org.ID))
}

// TestStartStormDistinctKeys: 50 clients with a key each: 50 runs, billed 50
// times, none replayed.
func TestStartStormDistinctKeys(t *testing.T) {
	t.Parallel()
	f := newIdemFixture(t, nil)
	const clients = 50
	answers := idemStorm(t, f.e.Server(), clients, func(i int) (string, string, string, string) {
		return idemStartPath(f.wf), f.org.Token, fmt.Sprintf("own-%d", i), idemBody
	})
	ids := map[string]bool{}
	for _, a := range answers {
		require.Equal(t, http.StatusCreated, a.Status, a.Body)
		require.False(t, a.Replayed)
		ids[a.Body] = true
	}
	require.Len(t, ids, clients, "50 different runs")
	require.Equal(t, idemCounts{Runs: clients, Usage: clients, Audits: clients, Keys: clients}, f.counts(t, f.org.ID))
}

// TestStartStormQuota: quota 10, 40 keys at once: exactly 10 runs and 30
// stored 429s; the counter never passes the quota.
func TestStartStormQuota(t *testing.T) {
	t.Parallel()
	f := newIdemFixture(t, func(c *config.Config) { c.DefaultMonthlyRunQuota = 10 })
	answers := idemStorm(t, f.e.Server(), 40, func(i int) (string, string, string, string) {
		return idemStartPath(f.wf), f.org.Token, fmt.Sprintf("quota-%d", i), idemBody
	})
	tally := idemTally(answers)
	require.Equal(t, map[int]int{201: 10, 429: 30}, tally)
	for _, a := range answers {
		if a.Status == 429 {
			require.Equal(t, "quota_exceeded", a.Code)
		}
	}
	require.Equal(t, idemCounts{Runs: 10, Usage: 10, Audits: 10, Keys: 40}, f.counts(t, f.org.ID))
	require.EqualValues(t, 30, idemCount(t, f.e, `SELECT count(*) FROM idempotency_keys WHERE response_status = 429`))
}

// The quota is exact under concurrency: quota Q and 3Q concurrent starts
// with distinct keys over 64 database connections give exactly Q answers
// of 201 and 2Q of 429 quota_exceeded, and usage equals Q. Then the quota
// is raised (the slots are rebalanced for the new quota) and exactly the
// difference is admitted; then lowered below what was used, and nothing is.
//
// Not parallel: its 64 connections, with other tests', could pass the
// server's max_connections (100 by default). Other packages' tests may still
// take some, so a 503 service_unavailable is retried with the same key, as
// a client does; the counts prove that retries changed nothing.
func TestQuotaExactUnder64Connections(t *testing.T) {
	const q = 100
	// No token cache: a quota set below applies to the next request.
	f := &idemFixture{e: apitest.New(t, apitest.Options{MaxOpenConns: 64, Config: func(c *config.Config) { c.AuthCacheTTL = 0 }})}
	f.org = f.e.NewOrg("acme")
	f.wf = f.e.NewWorkflow(f.org, idemWorkflowBody)
	setQuota := func(n int64) {
		require.NoError(t, models.NewOrgStore(f.e.DB).SetQuota(context.Background(), f.org.ID, &n))
	}
	srv := f.e.Server()
	storm := func(round string, n int) map[int]int {
		answers := idemStorm(t, srv, n, func(i int) (string, string, string, string) {
			return idemStartPath(f.wf), f.org.Token, fmt.Sprintf("%s-%d", round, i), idemBody
		}, http.StatusServiceUnavailable)
		for _, a := range answers {
			require.NoError(t, a.Err)
			if a.Status == http.StatusTooManyRequests {
				require.Equal(t, "quota_exceeded", a.Code)
			}
		}
		return idemTally(answers)
	}

	setQuota(q)
	require.Equal(t, map[int]int{201: q, 429: 2 * q}, storm("first", 3*q))
	require.Equal(t, idemCounts{Runs: q, Usage: q, Audits: q, Keys: 3 * q}, f.counts(t, f.org.ID))

	setQuota(q + 30)
	require.Equal(t, map[int]int{201: 30, 429: 90}, storm("raised", 120))
	require.Equal(t, idemCounts{Runs: q + 30, Usage: q + 30, Audits: q + 30, Keys: 3*q + 120}, f.counts(t, f.org.ID))

	setQuota(q / 2)
	require.Equal(t, map[int]int{429: 40}, storm("lowered", 40))
	require.EqualValues(t, q+30, f.counts(t, f.org.ID).Usage, "lowering the quota keeps what was used")

	r := f.e.Do(http.MethodGet, "/api/usage", f.org.Token, nil)
	require.Equal(t, http.StatusOK, r.Status, "body %s", r.Body)
	var u struct {
		Runs, Quota int64
		Remaining   *int64
		Unlimited   bool
	}
	r.JSON(t, &u)
	require.EqualValues(t, q+30, u.Runs)
	require.EqualValues(t, q/2, u.Quota)
	require.False(t, u.Unlimited)
	require.NotNil(t, u.Remaining)
	require.Zero(t, *u.Remaining)
}

// idemScenarioTxTimeout: a request whose transaction outlives
// IDEMPOTENCY_TX_TIMEOUT (blocked on the usage counter row the test holds)
// answers 503 request_timeout and commits nothing; once the row is free the
// retry executes, exactly once. Run by TestIdempotencyContract.
//
// Only the blocked request goes through an API with a 300 ms transaction
// deadline, which it outlives whatever the machine's speed (it waits on a
// lock held until its answer); every other request has the default budget,
// so a slow machine cannot time it out.
func idemScenarioTxTimeout(t *testing.T) {
	t.Parallel()
	f := newIdemFixture(t, nil)
	short := f.e.WithConfig(func(c *config.Config) { c.IdempotencyTxTimeout = 300 * time.Millisecond })
	require.Equal(t, http.StatusCreated, f.start(idemBody).Status, "a prior run creates the usage slots")
	release := idemLockUsage(t, f.e, f.org.ID)

	r := short.Do(http.MethodPost, idemStartPath(f.wf), f.org.Token, idemBody, idemKey("timeout-1")...)
	require.Equal(t, http.StatusServiceUnavailable, r.Status, "body %s", r.Body)
	require.Equal(t, idempotency.CodeTimeout, idemProblem(t, r).Code)
	require.NotEmpty(t, r.Header.Get("Retry-After"))
	require.Equal(t, idemCounts{Runs: 1, Usage: 1, Audits: 1, Keys: 0}, f.counts(t, f.org.ID), "nothing stored, no run")

	release()
	r = f.start(idemBody, idemKey("timeout-1")...)
	require.Equal(t, http.StatusCreated, r.Status, "body %s", r.Body)
	require.Empty(t, r.Header.Get(idempotency.HeaderReplayed), "executed afresh")
	requireReplay(t, r, f.start(idemBody, idemKey("timeout-1")...), r.Header.Get("X-Request-Id"))
	require.Equal(t, idemCounts{Runs: 2, Usage: 2, Audits: 2, Keys: 1}, f.counts(t, f.org.ID))
}

// idemScenarioClientHangUp: the client hangs up while its request is blocked
// inside its transaction; the work still commits with its answer, and the
// retry replays it: one run. Run by TestIdempotencyContract.
func idemScenarioClientHangUp(t *testing.T) {
	t.Parallel()
	f := newIdemFixture(t, nil)
	require.Equal(t, http.StatusCreated, f.start(idemBody).Status, "a prior run creates the usage slots")
	release := idemLockUsage(t, f.e, f.org.ID)

	// The server tells when the request's context is cancelled, and when
	// its handler has returned.
	cancelled, served := make(chan struct{}), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		watched := r.Header.Get(idempotency.HeaderKey) == "hangup-1" && r.Header.Get("X-Watch") == "1"
		if watched {
			go func() { <-r.Context().Done(); close(cancelled) }()
		}
		f.e.Handler.ServeHTTP(w, r)
		if watched {
			close(served)
		}
	}))
	t.Cleanup(srv.Close)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+idemStartPath(f.wf), strings.NewReader(idemBody))
		req.Header.Set("Authorization", "Bearer "+f.org.Token)
		req.Header.Set(idempotency.HeaderKey, "hangup-1")
		req.Header.Set("X-Watch", "1")
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()

	idemWaitLockWaiter(t, f.e) // the request is inside its transaction
	cancel()
	require.ErrorIs(t, <-errc, context.Canceled)
	select {
	case <-cancelled: // the server saw the hang-up while the work was blocked
	case <-time.After(10 * time.Second):
		t.Fatal("the server never saw the client hang up")
	}
	require.Zero(t, idemCount(t, f.e, `SELECT count(*) FROM idempotency_keys`), "still in flight")

	release()
	apitest.Eventually(t, 10*time.Second, func() bool {
		return idemCount(t, f.e, `SELECT count(*) FROM idempotency_keys WHERE key = 'hangup-1'`) == 1
	}, "the hung-up request's answer is stored")
	// Its row committed, the first request is still in flight until its
	// handler returns (it caches and writes its answer, then lets go of the
	// key): a retry meanwhile gets 409, as the contract says. Under load
	// that moment lasted long enough for the retry to see it.
	select {
	case <-served:
	case <-time.After(10 * time.Second):
		t.Fatal("the hung-up request's handler never returned")
	}

	r := f.start(idemBody, idemKey("hangup-1")...)
	require.Equal(t, http.StatusCreated, r.Status, "body %s", r.Body)
	require.Equal(t, "true", r.Header.Get(idempotency.HeaderReplayed), "the retry gets the stored answer")
	k := idemKeyRow(t, f.e, f.org.ID, handlers.ScopeWorkflowStart, "hangup-1")
	require.Equal(t, *k.ValidationRunID, idemRunID(t, r))
	require.Equal(t, idemCounts{Runs: 2, Usage: 2, Audits: 2, Keys: 1}, f.counts(t, f.org.ID), "exactly one new run")
}
