package handlers_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/config"
	"github.com/valruns/valruns/handlers"
	"github.com/valruns/valruns/idempotency"
	"github.com/valruns/valruns/internal/apitest"
	"github.com/valruns/valruns/models"
)

// The run long-poll (issue 19): GET /api/runs/{id}/ with Prefer: wait=N.
// The worker is played by the test, through the store's own Claim and
// Finish. A deadline here bounds a wait on a loaded machine; it is never
// what a test checks.

// lpFixture is an API with an organisation, a workflow and its metrics.
type lpFixture struct {
	e   *apitest.Env
	org apitest.Org
	wf  string
}

func newLPFixture(t *testing.T, o apitest.Options) *lpFixture {
	t.Helper()
	e := apitest.New(t, o)
	org := e.NewOrg("acme")
	return &lpFixture{e: e, org: org, wf: e.NewWorkflow(org, map[string]any{"name": "invoice"})}
}

// other is another organisation on the same API, with its own workflow.
func (f *lpFixture) other(t *testing.T, name string) *lpFixture {
	t.Helper()
	org := f.e.NewOrg(name)
	return &lpFixture{e: f.e, org: org, wf: f.e.NewWorkflow(org, map[string]any{"name": "invoice"})}
}

// queued starts a run, which stays queued: no worker runs in these tests.
func (f *lpFixture) queued(t *testing.T) string {
	t.Helper()
	return startRun(t, f.e, f.org, f.wf, map[string]any{"submission": map[string]int{"total": 1}}).ID
}

// read is GET /api/runs/{id}/ with headers (name, value pairs).
func (f *lpFixture) read(id string, headers ...string) apitest.Response {
	return f.e.Do(http.MethodGet, "/api/runs/"+id+"/", f.org.Token, nil, headers...)
}

// finish ends the run as a worker does: claimed, then finished with status.
func lpFinish(t *testing.T, e *apitest.Env, id, status string) {
	t.Helper()
	runs := models.NewRunStore(e.DB)
	c, err := runs.Claim(context.Background(), id, time.Minute, 5)
	require.NoError(t, err)
	ok, err := runs.Finish(context.Background(), id, c.Attempts, status, nil)
	require.NoError(t, err)
	require.True(t, ok, "the claim's attempt finishes the run")
}

// lpRun decodes an answer's run.
func lpRun(t *testing.T, r apitest.Response) handlers.Run {
	t.Helper()
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	var run handlers.Run
	r.JSON(t, &run)
	return run
}

// answer receives a background request's answer, failing after a bound
// far above any wait of the test.
func answer(t *testing.T, ch <-chan apitest.Response) apitest.Response {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(2 * time.Minute):
		t.Fatal("no answer within 2 minutes")
		return apitest.Response{}
	}
}

// counterValue reads name{label=value} of reg (0 when absent).
func counterValue(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range families {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

const lpWaiters = "valruns_run_waiters"

func TestRunLongPoll(t *testing.T) {
	t.Parallel()
	f := newLPFixture(t, apitest.Options{})
	other := f.e.NewOrg("globex")

	t.Run("a queued run is answered once it is final", func(t *testing.T) {
		id := f.queued(t)
		ch := waitFor(func() apitest.Response { return f.read(id, "Prefer", "wait=25") })
		waitGauge(t, f.e.Registry, lpWaiters, 1)
		lpFinish(t, f.e, id, models.RunPassed)
		r := answer(t, ch)
		run := lpRun(t, r)
		require.Equal(t, "passed", run.Status, "answered at the final state, not when the 25 s ran out")
		require.NotNil(t, run.Findings, "with its findings, as a read of a finished run")
		require.Equal(t, "wait=25", r.Header.Get(idempotency.HeaderPreferenceApplied))
		waitGauge(t, f.e.Registry, lpWaiters, 0)
		require.EqualValues(t, 1, counterValue(t, f.e.Registry, "valruns_run_waits_total", "outcome", "final"))
	})

	t.Run("without Prefer a read answers at once, as always", func(t *testing.T) {
		id := f.queued(t)
		for _, prefer := range []string{"", "respond-async", "wait=0", "wait=-1", "wait=soon"} {
			var h []string
			if prefer != "" {
				h = []string{"Prefer", prefer}
			}
			r := f.read(id, h...)
			require.Equal(t, "queued", lpRun(t, r).Status, "Prefer %q", prefer)
			require.Empty(t, r.Header.Get(idempotency.HeaderPreferenceApplied), "Prefer %q", prefer)
		}
	})

	t.Run("a final run is answered at once, the preference applied", func(t *testing.T) {
		id := f.queued(t)
		lpFinish(t, f.e, id, models.RunFailed)
		// If it waited, it would wait the cap (30 s): no waiter joins.
		r := f.read(id, "Prefer", "wait=30")
		require.Equal(t, "failed", lpRun(t, r).Status)
		require.Equal(t, "wait=30", r.Header.Get(idempotency.HeaderPreferenceApplied),
			"the wait was honoured: the run is final already")
		r = f.read(id, "Prefer", "wait=3600")
		require.Equal(t, "wait=30", r.Header.Get(idempotency.HeaderPreferenceApplied), "N after the cap")
		r = f.read(id)
		require.Empty(t, r.Header.Get(idempotency.HeaderPreferenceApplied), "no preference, nothing applied")
	})

	t.Run("another organisation's run is 404, at once", func(t *testing.T) {
		id := f.queued(t)
		r := f.e.Do(http.MethodGet, "/api/runs/"+id+"/", other.Token, nil, "Prefer", "wait=30")
		require.Equal(t, http.StatusNotFound, r.Status, "%s", r.Body)
		require.Empty(t, r.Header.Get(idempotency.HeaderPreferenceApplied))
		r = f.read("00000000-0000-4000-8000-000000000000", "Prefer", "wait=30")
		require.Equal(t, http.StatusNotFound, r.Status, "%s", r.Body)
	})
}

// TestRunLongPollWokenWhenRunsEnd: a message that runs ended without
// naming them (Deps.RunsEnded, which serve feeds from the workers' Redis
// channel) makes the poller look at once. Its tick here is an hour:
// without the message the waiter would run out its 25 s and be answered
// "queued".
func TestRunLongPollWokenWhenRunsEnd(t *testing.T) {
	t.Parallel()
	ended := make(chan []string, 1)
	f := newLPFixture(t, apitest.Options{RunsEnded: ended, RunPollEvery: time.Hour})
	id := f.queued(t)
	ch := waitFor(func() apitest.Response { return f.read(id, "Prefer", "wait=25") })
	waitGauge(t, f.e.Registry, lpWaiters, 1)
	lpFinish(t, f.e, id, models.RunPassed)
	ended <- nil
	r := answer(t, ch)
	require.Equal(t, "passed", lpRun(t, r).Status, "answered when told runs ended, not when its 25 s ran out")
	require.EqualValues(t, 1, counterValue(t, f.e.Registry, "valruns_run_waits_total", "outcome", "final"))
}

// TestRunLongPollJoinAfterTheEnd: a run that ends between the handler's
// read and its join is answered at once, though its end's message was spent
// on a look that did not ask for it: the join makes the poller look. The
// tick is an hour: without the join's look each wait would run out its
// 20 s and end "timeout".
func TestRunLongPollJoinAfterTheEnd(t *testing.T) {
	t.Parallel()
	f := newLPFixture(t, apitest.Options{})
	store := models.NewRunStore(f.e.DB)
	var mu sync.Mutex
	looks := 0
	finished := func(ctx context.Context, ids []string) ([]string, error) {
		mu.Lock()
		looks++
		mu.Unlock()
		return store.Finished(ctx, ids)
	}
	looked := func() int {
		mu.Lock()
		defer mu.Unlock()
		return looks
	}
	ended := make(chan []string, 1)
	h := handlers.NewRunWaits(finished, time.Hour, ended)
	org := f.org.ID

	t.Run("no request waits: the message went unheard", func(t *testing.T) {
		id := f.queued(t) // read: queued
		lpFinish(t, f.e, id, models.RunPassed)
		require.Equal(t, "final", h.Wait(org, id, 20*time.Second))
	})

	t.Run("another request waits: the message was spent before the join", func(t *testing.T) {
		other := f.queued(t) // stays queued: its waiter keeps the poller running
		otherDone := make(chan string, 1)
		go func() { otherDone <- h.Wait(org, other, 30*time.Second) }()
		apitest.Eventually(t, time.Minute, func() bool { return h.Waiting() == 1 }, "the other request waits")

		id := f.queued(t) // read: queued
		lpFinish(t, f.e, id, models.RunPassed)
		before := looked()
		ended <- nil // the worker's message: a look without id
		apitest.Eventually(t, time.Minute, func() bool { return looked() > before }, "the poller looks")
		require.Equal(t, "final", h.Wait(org, id, 20*time.Second))

		lpFinish(t, f.e, other, models.RunPassed)
		ended <- nil
		require.Equal(t, "final", <-otherDone)
	})
}

// TestRunLongPollWokenByTheRunsNamed: a message naming runs (a worker
// sends it after their final commit) wakes their waiters at once, without
// a statement: PostgreSQL here never says a run is final, and the tick is
// an hour, so only the message can end the wait. A run it does not name
// waits on.
func TestRunLongPollWokenByTheRunsNamed(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	looks := 0
	finished := func(context.Context, []string) ([]string, error) {
		mu.Lock()
		defer mu.Unlock()
		looks++
		return nil, nil
	}
	ended := make(chan []string, 1)
	h := handlers.NewRunWaits(finished, time.Hour, ended)
	const named, other = "run-named", "run-other"
	outcome := make(chan string, 2)
	go func() { outcome <- h.Wait("org", other, 2*time.Second) }()
	go func() { outcome <- h.Wait("org", named, time.Minute) }()
	apitest.Eventually(t, time.Minute, func() bool { return h.Waiting() == 2 }, "both wait")
	ended <- []string{"run-nobody-waits-on", named}
	require.Equal(t, "final", <-outcome, "the named run's waiter is answered")
	require.Equal(t, "timeout", <-outcome, "the other run's waiter waits on")
	mu.Lock()
	defer mu.Unlock()
	require.LessOrEqual(t, looks, 2, "a look per join at most: the message asks nothing")
}

// TestRunLongPollCap: the wait applied is at most RUN_MAX_WAIT, however
// large N is; a run still queued when it runs out is answered as it is,
// 200 and not an error; RUN_MAX_WAIT=0 answers at once.
func TestRunLongPollCap(t *testing.T) {
	t.Parallel()
	f := newLPFixture(t, apitest.Options{Config: func(c *config.Config) { c.RunMaxWait = time.Second }})
	id := f.queued(t)
	for _, n := range []string{"3600", "18446744074", "9223372037"} {
		r := f.read(id, "Prefer", "wait="+n)
		require.Equal(t, "queued", lpRun(t, r).Status, "wait=%s: the run as it is when the wait ran out", n)
		require.Equal(t, "wait=1", r.Header.Get(idempotency.HeaderPreferenceApplied), "wait=%s: the wait applied is the cap", n)
	}
	require.EqualValues(t, 3, counterValue(t, f.e.Registry, "valruns_run_waits_total", "outcome", "timeout"))

	off := f.e.WithConfig(func(c *config.Config) { c.RunMaxWait = 0 })
	r := off.Do(http.MethodGet, "/api/runs/"+id+"/", f.org.Token, nil, "Prefer", "wait=3600")
	require.Equal(t, "queued", lpRun(t, r).Status)
	require.Empty(t, r.Header.Get(idempotency.HeaderPreferenceApplied), "RUN_MAX_WAIT=0: no read waits")
	require.Zero(t, counterValue(t, off.Registry, "valruns_run_waits_total", "outcome", "timeout"))
}

// TestRunLongPollMaxWaiters: past its organisation's share of
// RUN_MAX_WAITERS (a quarter), or past RUN_MAX_WAITERS, a read answers at
// once, its preference ignored, while the waiters go on waiting.
func TestRunLongPollMaxWaiters(t *testing.T) {
	t.Parallel()
	a := newLPFixture(t, apitest.Options{Config: func(c *config.Config) { c.RunMaxWaiters = 8 }})
	type waiting struct {
		id string
		ch <-chan apitest.Response
	}
	var all []waiting
	wait2 := func(f *lpFixture) string {
		id := f.queued(t)
		for range 2 {
			all = append(all, waiting{id, waitFor(func() apitest.Response { return f.read(id, "Prefer", "wait=30") })})
		}
		waitGauge(t, a.e.Registry, lpWaiters, float64(len(all)))
		return id
	}
	atOnce := func(f *lpFixture, id, why string) {
		r := f.read(id, "Prefer", "wait=30")
		require.Equal(t, "queued", lpRun(t, r).Status)
		require.Empty(t, r.Header.Get(idempotency.HeaderPreferenceApplied), why)
	}

	idA := wait2(a)
	atOnce(a, idA, "a third read of one organisation: its quarter (2 of 8) waits already")
	for _, name := range []string{"b", "c", "d"} {
		wait2(a.other(t, name))
	}
	e := a.other(t, "e")
	atOnce(e, e.queued(t), "a ninth read: 8 wait already")
	require.EqualValues(t, 8, gaugeValue(t, a.e.Registry, lpWaiters), "the eight waiters still wait")

	for i := 0; i < len(all); i += 2 { // two waiters per run
		lpFinish(t, a.e, all[i].id, models.RunPassed)
	}
	for _, w := range all {
		r := answer(t, w.ch)
		require.Equal(t, "passed", lpRun(t, r).Status)
		require.Equal(t, "wait=30", r.Header.Get(idempotency.HeaderPreferenceApplied))
	}
}

// TestRunLongPollHoldsNoSlot: 200 long-polls wait at once on a process
// that serves 8 requests and has 12 database connections: they hold
// neither a request slot of the overload guard nor a connection, so a
// start still gets its 201 while they wait, and then every one of them
// gets the final run. A request finding no slot waits up to 20 s for one:
// far longer than 200 reads take to pass through 8 slots on a loaded box,
// far shorter than the long-polls wait (30 s), so waiters that held their
// slots would get the 9th answered 503 before the run ended.
func TestRunLongPollHoldsNoSlot(t *testing.T) {
	t.Parallel()
	const waiters = 200
	f := newLPFixture(t, apitest.Options{Config: func(c *config.Config) {
		c.MaxRequestsInFlight = 8
		c.OverloadWait = 20 * time.Second
	}})
	id := f.queued(t)
	answers := make(chan apitest.Response, waiters)
	for range waiters {
		go func() { answers <- f.read(id, "Prefer", "wait=30") }()
	}
	apitest.Eventually(t, time.Minute, func() bool {
		if n := len(answers); n > 0 {
			r := <-answers
			t.Fatalf("a waiter was answered %d before the run ended (%d answered): %s", r.Status, n, r.Body)
		}
		return gaugeValue(t, f.e.Registry, lpWaiters) == waiters
	}, "all 200 long-polls wait")

	require.Equal(t, "queued", lpRun(t, f.read(id)).Status, "a read without Prefer is served")
	started := startRun(t, f.e, f.org, f.wf, map[string]any{"submission": map[string]int{"total": 2}})
	require.Equal(t, "queued", started.Status)
	require.EqualValues(t, waiters, gaugeValue(t, f.e.Registry, lpWaiters), "they still wait")

	lpFinish(t, f.e, id, models.RunPassed)
	for range waiters {
		r := answer(t, answers)
		require.Equal(t, "passed", lpRun(t, r).Status)
		require.Equal(t, "wait=30", r.Header.Get(idempotency.HeaderPreferenceApplied))
	}
	require.Zero(t, gaugeValue(t, f.e.Registry, "valruns_http_requests_in_flight"), "every slot given back, once")
}

// lpTracer records the statements the API's pool sends, with their
// arguments.
type lpTracer struct {
	mu    sync.Mutex
	stmts []lpStmt
}

type lpStmt struct {
	sql  string
	args []any
}

func (tr *lpTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.stmts = append(tr.stmts, lpStmt{d.SQL, d.Args})
	return ctx
}

func (tr *lpTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (tr *lpTracer) take() []lpStmt {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	s := tr.stmts
	tr.stmts = nil
	return s
}

// TestRunLongPollOneStatementPerTick: while requests wait, the process
// sends PostgreSQL nothing but the poller's statement, and each of those
// asks for every run waited on at once (no statement per waiter); once no
// request waits, it sends nothing at all.
func TestRunLongPollOneStatementPerTick(t *testing.T) {
	t.Parallel()
	tr := &lpTracer{}
	f := newLPFixture(t, apitest.Options{Tracer: tr})
	ids := make([]string, 6)
	for i := range ids {
		ids[i] = f.queued(t)
	}
	var chans []<-chan apitest.Response
	for i, id := range ids {
		for range i%2 + 1 { // one or two waiters per run: 9 waiters on 6 runs
			chans = append(chans, waitFor(func() apitest.Response { return f.read(id, "Prefer", "wait=30") }))
		}
	}
	waitGauge(t, f.e.Registry, lpWaiters, float64(len(chans)))

	// The poller's next statement may hold the ids it gathered before the
	// last waiter joined; every one after it was gathered later.
	tr.take()
	var first []lpStmt
	apitest.Eventually(t, time.Minute, func() bool {
		first = append(first, tr.take()...)
		return len(first) > 0
	}, "the poller asks PostgreSQL")
	var seen []lpStmt
	apitest.Eventually(t, time.Minute, func() bool {
		seen = append(seen, tr.take()...)
		return len(seen) >= 5
	}, "the poller asks PostgreSQL again")
	for _, s := range seen {
		require.Contains(t, s.sql, "ANY(", "only the poller's statement while requests wait: %s", s.sql)
		require.NotEmpty(t, s.args)
		var asked string // the ids, one text parameter (pgx may put options before it)
		for _, a := range s.args {
			if v, ok := a.(string); ok {
				asked = v
				break
			}
		}
		for _, id := range ids {
			require.Contains(t, asked, id, "each statement asks for every run waited on")
		}
		require.Equal(t, len(ids), len(strings.Split(asked, ",")), "once per run, however many wait on it")
	}

	for _, id := range ids {
		lpFinish(t, f.e, id, models.RunPassed)
	}
	for _, ch := range chans {
		require.Equal(t, "passed", lpRun(t, answer(t, ch)).Status)
	}
	waitGauge(t, f.e.Registry, lpWaiters, 0)

	// No request waits: nothing is sent, for as many ticks as this window
	// holds (a quiet window is the claim; its length proves nothing more).
	tr.take()
	time.Sleep(time.Second)
	require.Empty(t, tr.take(), "no statement while no request waits")
}

// TestRunLongPollEnds: a waiter whose client hangs up leaves at once, and
// closing Deps.Stop (serve's shutdown) answers every waiter with its run
// as it is.
func TestRunLongPollEnds(t *testing.T) {
	t.Parallel()
	f := newLPFixture(t, apitest.Options{})
	id := f.queued(t)

	t.Run("the client hangs up", func(t *testing.T) {
		srv := f.e.Server()
		ctx, cancel := context.WithCancel(context.Background())
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/api/runs/"+id+"/", nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+f.org.Token)
		req.Header.Set("Prefer", "wait=30")
		done := make(chan error, 1)
		go func() {
			resp, err := srv.Client().Do(req)
			if err == nil {
				_ = resp.Body.Close()
			}
			done <- err
		}()
		waitGauge(t, f.e.Registry, lpWaiters, 1)
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)
		waitGauge(t, f.e.Registry, lpWaiters, 0)
		apitest.Eventually(t, 30*time.Second, func() bool {
			return counterValue(t, f.e.Registry, "valruns_run_waits_total", "outcome", "gone") == 1
		}, "the wait ended as gone")
	})

	t.Run("the process stops", func(t *testing.T) {
		stop := make(chan struct{})
		reg := prometheus.NewRegistry()
		api := handlers.New(handlers.Deps{Config: f.e.Config, DB: f.e.DB, Registry: reg, Stop: stop})
		srv := func(id, prefer string) apitest.Response {
			req := httptest.NewRequest(http.MethodGet, "/api/runs/"+id+"/", nil)
			req.Header.Set("Authorization", "Bearer "+f.org.Token)
			req.Header.Set("Prefer", prefer)
			rec := httptest.NewRecorder()
			api.ServeHTTP(rec, req)
			return apitest.Response{Status: rec.Code, Header: rec.Header(), Body: rec.Body.Bytes()}
		}
		ch := waitFor(func() apitest.Response { return srv(id, "wait=30") })
		waitGauge(t, reg, lpWaiters, 1)
		close(stop)
		r := answer(t, ch)
		require.Equal(t, "queued", lpRun(t, r).Status, "the run as it is")
		require.Equal(t, "wait=30", r.Header.Get(idempotency.HeaderPreferenceApplied))
		r = srv(id, "wait=30")
		require.Equal(t, "queued", lpRun(t, r).Status)
		require.Empty(t, r.Header.Get(idempotency.HeaderPreferenceApplied), "a stopping process makes no read wait")
		require.EqualValues(t, 1, counterValue(t, reg, "valruns_run_waits_total", "outcome", "shutdown"))
	})
}
