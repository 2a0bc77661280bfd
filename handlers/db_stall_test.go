package handlers_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/handlers"
	"github.com/valruns/valruns/idempotency"
	"github.com/valruns/valruns/internal/apitest"
	"github.com/valruns/valruns/internal/tcpproxy"
	"github.com/valruns/valruns/models"
)

// freezer is a TCP proxy to PostgreSQL that the test can freeze: while
// frozen it passes no byte either way, as a SIGSTOPped server answers
// nothing (the kernel still accepts connections).
type freezer struct {
	proxy  *tcpproxy.Proxy
	mu     sync.Mutex
	cond   *sync.Cond
	frozen bool
}

func newFreezer(t *testing.T, upstream string) *freezer {
	f := &freezer{}
	f.cond = sync.NewCond(&f.mu)
	f.proxy = tcpproxy.New(t, upstream, func(c, u net.Conn) {
		go f.pipe(c, u)
		go f.pipe(u, c)
	})
	t.Cleanup(func() { f.set(false) }) // before the connections close (cleanups run last first)
	return f
}

func (f *freezer) pipe(from, to net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := from.Read(buf)
		f.mu.Lock()
		for f.frozen {
			f.cond.Wait()
		}
		f.mu.Unlock()
		if n > 0 {
			if _, werr := to.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			_ = to.Close()
			return
		}
	}
}

func (f *freezer) set(frozen bool) {
	f.mu.Lock()
	f.frozen = frozen
	f.mu.Unlock()
	f.cond.Broadcast()
}

// answerWithin sends the request in the background and returns its answer,
// failing if none comes within bound: a bound on a loaded machine, far
// below what a hung request would wait (IDEMPOTENCY_TX_TIMEOUT is 10 min).
func answerWithin(t *testing.T, bound time.Duration, send func() apitest.Response) apitest.Response {
	t.Helper()
	ch := waitFor(send)
	select {
	case r := <-ch:
		return r
	case <-time.After(bound):
		t.Fatalf("no answer within %s: the request hangs on the database", bound)
		return apitest.Response{}
	}
}

func requireUnavailable(t *testing.T, r apitest.Response, what string) {
	t.Helper()
	require.Equal(t, http.StatusServiceUnavailable, r.Status, "%s: %s", what, r.Body)
	require.Equal(t, idempotency.CodeUnavailable, r.Map(t)["code"], what)
	require.NotEmpty(t, r.Header.Get("Retry-After"), what)
}

// A hung PostgreSQL (every byte held by a frozen proxy, as SIGSTOP does)
// answers 503 service_unavailable with Retry-After while it is still hung:
// the first answer has its own deadline (DATABASE_ANSWER_TIMEOUT), and so
// has getting a connection (DATABASE_ACQUIRE_TIMEOUT), whatever the
// request transaction's (10 min here). Nothing is stored: once the database
// answers again, the same key executes, once. Before, requests waited for
// IDEMPOTENCY_TX_TIMEOUT.
func TestHungDatabaseIs503(t *testing.T) {
	t.Parallel()
	e := apitest.New(t)
	acme, globex := e.NewOrg("acme"), e.NewOrg("globex")
	wf := e.NewWorkflow(acme, idemWorkflowBody)

	u, err := url.Parse(e.DBURL)
	require.NoError(t, err)
	fz := newFreezer(t, u.Host)
	u.Host = fz.proxy.Addr()
	db, err := models.Open(context.Background(), u.String(), models.DBOptions{
		MaxOpenConns: 4, AcquireTimeout: time.Second, AnswerTimeout: time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = models.SQLDB(db).Close() })
	cfg := e.Config
	cfg.IdempotencyTxTimeout = 10 * time.Minute
	h := handlers.New(handlers.Deps{Config: cfg, DB: db})
	stalled := &apitest.Env{T: t, DB: db, Config: cfg, Handler: h}

	start := func(key string) apitest.Response {
		return stalled.Do(http.MethodPost, "/api/workflows/"+wf+"/start/", acme.Token, `{"submission":1}`, idempotency.HeaderKey, key)
	}
	// acme's token is verified (and cached), the pool holds connections.
	require.Equal(t, http.StatusOK, stalled.Do(http.MethodGet, "/api/workflows/"+wf, acme.Token, nil).Status)

	fz.set(true)
	for _, tt := range []struct {
		what string
		send func() apitest.Response
	}{
		{"a start with a key", func() apitest.Response { return start("stall-1") }},
		{"a start without a key", func() apitest.Response {
			return stalled.Do(http.MethodPost, "/api/workflows/"+wf+"/start/", acme.Token, `{"submission":1}`)
		}},
		{"a read", func() apitest.Response {
			return stalled.Do(http.MethodGet, "/api/runs/?workflow_id="+wf, acme.Token, nil)
		}},
		{"a token not yet verified", func() apitest.Response { return stalled.Do(http.MethodGet, "/api/usage", globex.Token, nil) }},
	} {
		for range 3 { // more than the pool holds: some wait for a connection
			requireUnavailable(t, answerWithin(t, 30*time.Second, tt.send), tt.what)
		}
	}
	fz.set(false)

	require.Zero(t, e.Count("idempotency_keys", ""), "nothing stored")
	require.Zero(t, e.Count("validation_runs", ""), "nothing started")
	var r apitest.Response
	apitest.Eventually(t, 30*time.Second, func() bool {
		r = start("stall-1") // a connection broken by the stall may take one 503
		return r.Status != http.StatusServiceUnavailable
	}, "the database answers again")
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	require.Equal(t, http.StatusCreated, start("stall-1").Status)
	require.EqualValues(t, 1, e.Count("validation_runs", ""))
}

// With every connection of the pool taken (here by the test), a request is
// 503 service_unavailable once DATABASE_ACQUIRE_TIMEOUT has passed, not a
// request that waits for the transaction's deadline.
func TestNoConnectionIs503(t *testing.T) {
	t.Parallel()
	e := apitest.New(t)
	acme := e.NewOrg("acme")
	wf := e.NewWorkflow(acme, idemWorkflowBody)
	db, err := models.Open(context.Background(), e.DBURL, models.DBOptions{
		MaxOpenConns: 1, AcquireTimeout: time.Second, AnswerTimeout: time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = models.SQLDB(db).Close() })
	cfg := e.Config
	cfg.IdempotencyTxTimeout = 10 * time.Minute
	busy := &apitest.Env{T: t, DB: db, Config: cfg, Handler: handlers.New(handlers.Deps{Config: cfg, DB: db})}
	require.Equal(t, http.StatusOK, busy.Do(http.MethodGet, "/api/workflows/"+wf, acme.Token, nil).Status)

	held, err := models.SQLDB(db).Conn(context.Background())
	require.NoError(t, err)
	for _, send := range []func() apitest.Response{
		func() apitest.Response {
			return busy.Do(http.MethodPost, "/api/workflows/"+wf+"/start/", acme.Token, `{"submission":1}`, idempotency.HeaderKey, "busy-1")
		},
		func() apitest.Response { return busy.Do(http.MethodGet, "/api/runs/", acme.Token, nil) },
	} {
		requireUnavailable(t, answerWithin(t, 30*time.Second, send), "no connection")
	}
	require.NoError(t, held.Close())
	r := busy.Do(http.MethodPost, "/api/workflows/"+wf+"/start/", acme.Token, `{"submission":1}`, idempotency.HeaderKey, "busy-1")
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
}

// dropper is a TCP proxy to PostgreSQL that, once armed, lets the client's
// statements through but drops the server's answer to them: it discards
// what the server sends and, once that ends with ReadyForQuery (the
// implicit transaction is over: committed, unless a statement failed),
// closes the connection to the client, as a network that breaks after
// COMMIT was sent does. The server never notices.
type dropper struct {
	proxy *tcpproxy.Proxy
	mu    sync.Mutex
	armed bool
}

func newDropper(t *testing.T, upstream string) *dropper {
	d := &dropper{}
	d.proxy = tcpproxy.New(t, upstream, func(c, u net.Conn) {
		go func() { _, _ = io.Copy(u, c); _ = u.Close() }()
		go d.answers(u, c)
	})
	return d
}

// readyForQuery is the message that ends the server's answer to a Sync
// (idle: the transaction ended).
var readyForQuery = []byte{'Z', 0, 0, 0, 5, 'I'}

// answers passes the server's bytes to the client, or drops them while armed.
func (d *dropper) answers(server, client net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := server.Read(buf)
		d.mu.Lock()
		armed := d.armed
		if armed && n > 0 && bytes.HasSuffix(buf[:n], readyForQuery) {
			d.armed = false // one answer dropped
			_ = client.Close()
		}
		d.mu.Unlock()
		if n > 0 && !armed {
			if _, werr := client.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			_ = client.Close()
			return
		}
	}
}

func (d *dropper) arm() {
	d.mu.Lock()
	d.armed = true
	d.mu.Unlock()
}

// A start whose statement reached PostgreSQL and committed, but whose answer
// never came back (the connection broke after COMMIT was sent, as in a
// failover or a frozen server), is a 503 that says the outcome is unknown,
// never that nothing was done: the independent trial saw clients told
// "nothing was done" for runs that had committed. The retry with the same
// key replays the run, and the run waits in its row for the sweeper.
func TestCommitInDoubtIs503OutcomeUnknown(t *testing.T) {
	t.Parallel()
	e := apitest.New(t)
	acme := e.NewOrg("acme")
	wf := e.NewWorkflow(acme, idemWorkflowBody)

	u, err := url.Parse(e.DBURL)
	require.NoError(t, err)
	dr := newDropper(t, u.Host)
	u.Host = dr.proxy.Addr()
	// One connection: the warm-up prepares the start's statements on it.
	db, err := models.Open(context.Background(), u.String(), models.DBOptions{MaxOpenConns: 1})
	require.NoError(t, err)
	t.Cleanup(func() { _ = models.SQLDB(db).Close() })
	handed := make(chan string, 16)
	h := handlers.New(handlers.Deps{Config: e.Config, DB: db, HandOff: func(q *models.QueuedRun) { handed <- q.ID }})
	api := &apitest.Env{T: t, DB: db, Config: e.Config, Handler: h}
	start := func(headers ...string) apitest.Response {
		return api.Do(http.MethodPost, "/api/workflows/"+wf+"/start/", acme.Token, idemBody, headers...)
	}
	for i, tc := range []struct {
		name    string
		headers []string
		detail  string
	}{
		{"with a key", idemKey("doubt-1"), idempotency.OutcomeUnknownDetail},
		{"without a key", nil, idempotency.OutcomeUnknownNoKeyDetail},
	} {
		// The connection (a new one after a drop: the broken one may cost
		// a 503 first) has prepared the start's statements.
		var warm apitest.Response
		apitest.Eventually(t, 30*time.Second, func() bool {
			warm = start(idemKey(fmt.Sprintf("warm-%d", i))...)
			return warm.Status != http.StatusServiceUnavailable
		}, "a start is answered")
		requireExecuted(t, warm)
		<-handed
		if tc.headers == nil {
			requireExecuted(t, start())
			<-handed
		}
		before := e.Count("validation_runs", "")
		dr.arm()
		r := start(tc.headers...)
		requireUnavailable(t, r, tc.name)
		require.Equal(t, tc.detail, idemProblem(t, r).Detail, tc.name)
		require.NotContains(t, idemProblem(t, r).Detail, "nothing was done", tc.name)
		require.Equal(t, before+1, e.Count("validation_runs", ""), "%s: the start committed", tc.name)
		var last struct{ ID, Status string }
		require.NoError(t, e.DB.Raw(`SELECT id, status FROM validation_runs ORDER BY id DESC LIMIT 1`).Scan(&last).Error)
		id := last.ID
		// Its row is the outbox: the sweeper hands it on, as any run the
		// API could not hand off.
		require.Equal(t, "queued", last.Status, "%s: the committed run waits in its row", tc.name)
		if tc.headers == nil {
			continue
		}
		// The pool's broken connection may cost the retry one 503 more.
		var again apitest.Response
		apitest.Eventually(t, 30*time.Second, func() bool {
			again = start(tc.headers...)
			return again.Status != http.StatusServiceUnavailable
		}, "the retry is answered")
		require.Equal(t, http.StatusCreated, again.Status, "%s", again.Body)
		require.Equal(t, "true", again.Header.Get(idempotency.HeaderReplayed), "the retry replays the run that committed")
		require.Equal(t, id, idemRunID(t, again))
		require.Equal(t, before+1, e.Count("validation_runs", ""), "one run")
	}
}
