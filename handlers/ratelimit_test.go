package handlers_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/config"
	"github.com/valruns/valruns/handlers"
	"github.com/valruns/valruns/idempotency"
	"github.com/valruns/valruns/internal/apitest"
	"github.com/valruns/valruns/internal/tcpproxy"
	"github.com/valruns/valruns/models"
	"github.com/valruns/valruns/problem"
)

// rateFixture is the API with the start rate limit on (Redis:
// TEST_REDIS_URL) at defaultRate starts per second per organisation.
type rateFixture struct {
	e   *apitest.Env
	rdb redis.UniversalClient
}

func newRateFixture(t *testing.T, defaultRate int, rdb redis.UniversalClient) *rateFixture {
	t.Helper()
	var timeout time.Duration // the harness's generous one
	if rdb == nil {
		rdb = apitest.Redis(t)
	} else {
		timeout = handlers.RateLimitTimeout // as serve runs: a Redis that does not answer is given up on
	}
	e := apitest.New(t, apitest.Options{Redis: rdb, RateLimitTimeout: timeout,
		Config: func(c *config.Config) { c.OrgStartRate = defaultRate }})
	return &rateFixture{e: e, rdb: rdb}
}

// org is a new organisation with a workflow, and its own start rate when
// rate is not nil.
func (f *rateFixture) org(t *testing.T, name string, rate *int) (apitest.Org, string) {
	t.Helper()
	o := f.e.NewOrg(name)
	if rate != nil {
		require.NoError(t, models.NewOrgStore(f.e.DB).SetStartRate(context.Background(), o.ID, rate))
	}
	return o, f.e.NewWorkflow(o, map[string]any{"name": name})
}

func (f *rateFixture) start(o apitest.Org, wf, key string, i int) apitest.Response {
	return f.e.Do(http.MethodPost, "/api/workflows/"+wf+"/start/", o.Token,
		fmt.Sprintf(`{"submission": {"i": %d}}`, i), idempotency.HeaderKey, key)
}

// flood sends n starts of o at once, each with its own key (prefix-i), and
// returns the answers by key.
func (f *rateFixture) flood(o apitest.Org, wf, prefix string, n int) map[string]apitest.Response {
	var mu sync.Mutex
	out := make(map[string]apitest.Response, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			key := fmt.Sprintf("%s-%d", prefix, i)
			r := f.start(o, wf, key, i)
			mu.Lock()
			out[key] = r
			mu.Unlock()
		})
	}
	wg.Wait()
	return out
}

// bucketExists reports whether Redis holds o's start rate bucket.
func (f *rateFixture) bucketExists(t *testing.T, o apitest.Org) bool {
	t.Helper()
	n, err := f.rdb.Exists(context.Background(), "rate:valruns:start:"+o.ID).Result()
	require.NoError(t, err)
	return n == 1
}

var (
	rateLimitHeader  = regexp.MustCompile(`^"org";r=(\d+);t=(\d+)$`)
	rateLimitedRetry = regexp.MustCompile(`^[1-9][0-9]*$`)
)

// requireRateHeaders checks the rate limit headers of an answer of an
// organisation whose rate is q.
func requireRateHeaders(t *testing.T, r apitest.Response, q int) {
	t.Helper()
	require.Equal(t, fmt.Sprintf(`"org";q=%d;w=1`, q), r.Header.Get(handlers.HeaderRateLimitPolicy), "status %d", r.Status)
	m := rateLimitHeader.FindStringSubmatch(r.Header.Get(handlers.HeaderRateLimit))
	require.NotNil(t, m, "RateLimit %q", r.Header.Get(handlers.HeaderRateLimit))
	remaining, _ := strconv.Atoi(m[1])
	require.LessOrEqual(t, remaining, q)
	if r.Status == http.StatusTooManyRequests {
		require.Zero(t, remaining)
	}
}

// requireNothingStored checks that the start with key left no trace: no
// key row, no run.
func (f *rateFixture) requireNothingStored(t *testing.T, o apitest.Org, key string) {
	t.Helper()
	require.Zero(t, f.e.Count("idempotency_keys", "org_id = ? AND key = ?", o.ID, key), "a key row for %s", key)
	require.Zero(t, f.e.Count("validation_runs", "org_id = ? AND idempotency_key = ?", o.ID, key), "a run for %s", key)
}

// A flood over A's rate is answered 429 rate_limited with Retry-After and
// the RateLimit headers, and nothing is stored for those starts (no key
// row, no run): the same key retried after Retry-After executes and
// creates the run. B, with the same rate in its own bucket, starts during
// A's flood within its burst and is never limited. At 2 starts per second
// (burst 2), 40 starts at once cannot all pass: that would take 19 seconds.
func TestStartRateLimitFlood(t *testing.T) {
	t.Parallel()
	f := newRateFixture(t, 2, nil)
	a, wfA := f.org(t, "flooder", nil)
	b, wfB := f.org(t, "neighbour", nil)

	var answers map[string]apitest.Response
	var bAnswers []apitest.Response
	var wg sync.WaitGroup
	wg.Go(func() { answers = f.flood(a, wfA, "a", 40) })
	wg.Go(func() {
		for i := range 2 {
			bAnswers = append(bAnswers, f.start(b, wfB, fmt.Sprintf("b-%d", i), i))
		}
	})
	wg.Wait()
	for i, r := range bAnswers {
		require.Equal(t, http.StatusCreated, r.Status, "B start %d: %s", i, r.Body)
		requireRateHeaders(t, r, 2)
	}

	var limited []string
	created := 0
	for key, r := range answers {
		requireRateHeaders(t, r, 2)
		switch r.Status {
		case http.StatusCreated:
			created++
			require.EqualValues(t, 1, f.e.Count("validation_runs", "id = ?", r.Map(t)["id"]))
		case http.StatusTooManyRequests:
			requireProblem(t, r, http.StatusTooManyRequests, problem.RateLimited.String())
			require.Regexp(t, rateLimitedRetry, r.Header.Get("Retry-After"))
			f.requireNothingStored(t, a, key)
			limited = append(limited, key)
		default:
			t.Fatalf("%s: %d %s", key, r.Status, r.Body)
		}
	}
	require.NotEmpty(t, limited, "40 starts at once at 2 per second: some are limited")
	require.EqualValues(t, created, f.e.Count("validation_runs", "org_id = ?", a.ID), "one run per 201, none per 429")
	require.EqualValues(t, created, f.e.Count("idempotency_keys", "org_id = ?", a.ID), "one key row per 201, none per 429")

	// The limited key, retried once the limit allows it, executes: its
	// 429 was not stored.
	key := limited[0]
	var i int
	fmt.Sscanf(key, "a-%d", &i)
	deadline := time.Now().Add(time.Minute)
	for {
		r := f.start(a, wfA, key, i)
		requireRateHeaders(t, r, 2)
		if r.Status == http.StatusCreated {
			require.Empty(t, r.Header.Get(idempotency.HeaderReplayed), "executed, not replayed")
			require.EqualValues(t, 1, f.e.Count("validation_runs", "id = ? AND idempotency_key = ?", r.Map(t)["id"], key))
			break
		}
		requireProblem(t, r, http.StatusTooManyRequests, problem.RateLimited.String())
		require.True(t, time.Now().Before(deadline), "the retry never got through")
		s, _ := strconv.Atoi(r.Header.Get("Retry-After"))
		time.Sleep(time.Duration(s) * time.Second)
	}
}

// The rate limit headers are on every answer of the start route, whatever
// its status: a 201, its replay, a 404, a 400 and a 422 (those stored
// under a key are replayed with the headers of the moment).
func TestStartRateLimitHeadersOnEveryAnswer(t *testing.T) {
	t.Parallel()
	f := newRateFixture(t, 100, nil)
	o, wf := f.org(t, "headers", nil)
	for _, c := range []struct {
		name, path, body, key string
		status                int
	}{
		{"created", "/api/workflows/" + wf + "/start/", `{"submission": 1}`, "h-1", http.StatusCreated},
		{"replayed", "/api/workflows/" + wf + "/start/", `{"submission": 1}`, "h-1", http.StatusCreated},
		{"reused", "/api/workflows/" + wf + "/start/", `{"submission": 2}`, "h-1", http.StatusUnprocessableEntity},
		{"not found", "/api/workflows/00000000-0000-4000-8000-000000000000/start/", `{"submission": 1}`, "h-2", http.StatusNotFound},
		{"bad body", "/api/workflows/" + wf + "/start/", `{"submision": 1}`, "h-3", http.StatusBadRequest},
		{"bad JSON", "/api/workflows/" + wf + "/start/", `{`, "h-4", http.StatusBadRequest},
	} {
		r := f.e.Do(http.MethodPost, c.path, o.Token, c.body, idempotency.HeaderKey, c.key)
		require.Equal(t, c.status, r.Status, "%s: %s", c.name, r.Body)
		requireRateHeaders(t, r, 100)
	}
}

// ORG_START_RATE=0 is unlimited, and so is an organisation's own rate 0
// under a default rate; an organisation's own rate beats the default both
// ways. An unlimited organisation costs no Redis call: it has no bucket.
func TestStartRateOverrides(t *testing.T) {
	t.Parallel()
	zero, one := 0, 1

	t.Run("default 0", func(t *testing.T) {
		t.Parallel()
		f := newRateFixture(t, 0, nil)
		free, wfFree := f.org(t, "free", nil)
		capped, wfCapped := f.org(t, "capped", &one)

		for key, r := range f.flood(free, wfFree, "free", 40) {
			require.Equal(t, http.StatusCreated, r.Status, "%s: %s", key, r.Body)
			require.Empty(t, r.Header.Get(handlers.HeaderRateLimitPolicy), "no policy, no headers")
			require.Empty(t, r.Header.Get(handlers.HeaderRateLimit))
		}
		require.EqualValues(t, 40, f.e.Count("validation_runs", "org_id = ?", free.ID))
		require.False(t, f.bucketExists(t, free), "no Redis call for an unlimited organisation")

		limited := 0
		for _, r := range f.flood(capped, wfCapped, "capped", 40) {
			requireRateHeaders(t, r, 1)
			if r.Status == http.StatusTooManyRequests {
				limited++
			}
		}
		require.Positive(t, limited, "the organisation's own rate applies over the unlimited default")
	})

	t.Run("own rate 0 under a default", func(t *testing.T) {
		t.Parallel()
		f := newRateFixture(t, 1, nil)
		free, wf := f.org(t, "free", &zero)
		for key, r := range f.flood(free, wf, "free", 40) {
			require.Equal(t, http.StatusCreated, r.Status, "%s: %s", key, r.Body)
			require.Empty(t, r.Header.Get(handlers.HeaderRateLimitPolicy))
		}
		require.False(t, f.bucketExists(t, free))
	})
}

// With Redis unreachable (nothing listens) or hung (it accepts and never
// answers), starts still succeed: the limit fails open after a bounded
// wait, without the RateLimit headers it cannot know.
func TestStartRateLimitFailsOpen(t *testing.T) {
	t.Parallel()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	refusedAddr := closed.Addr().String()
	require.NoError(t, closed.Close())

	hung := newHungRedis(t)

	for name, addr := range map[string]string{"unreachable": refusedAddr, "hung": hung.addr} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			// As serve builds it: timeouts of handlers.RateLimitTimeout.
			rdb := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: handlers.RateLimitTimeout,
				ReadTimeout: handlers.RateLimitTimeout, WriteTimeout: handlers.RateLimitTimeout})
			t.Cleanup(func() { _ = rdb.Close() })
			f := newRateFixture(t, 1, rdb)
			o, wf := f.org(t, name, nil)
			for i := range 10 {
				r := f.start(o, wf, fmt.Sprintf("open-%d", i), i)
				require.Equal(t, http.StatusCreated, r.Status, "start %d: %s", i, r.Body)
				require.Empty(t, r.Header.Get(handlers.HeaderRateLimit))
			}
			require.EqualValues(t, 10, f.e.Count("validation_runs", "org_id = ?", o.ID))
		})
	}
}

// hungRedis is a Redis that hangs: a listener that accepts connections,
// reads what is sent, and never answers, until the end of the test.
type hungRedis struct {
	addr string

	mu sync.Mutex
	// reads: when each connection's reads returned, by connection (in
	// the order accepted). A connection is counted when it sends, not
	// when it is dialled: go-redis (v9.23) dials in a goroutine of its
	// own that outlives the command that asked, and puts a connection
	// that arrives after its command gave up into the pool, where the
	// next command takes it without a dial of its own.
	reads [][]time.Time
	// accepted: when each connection was accepted.
	accepted []time.Time
}

func newHungRedis(t *testing.T) *hungRedis {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	h := &hungRedis{addr: ln.Addr().String()}
	var conns sync.WaitGroup
	t.Cleanup(conns.Wait)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			h.mu.Lock()
			id := len(h.reads)
			h.reads = append(h.reads, nil)
			h.accepted = append(h.accepted, time.Now())
			h.mu.Unlock()
			conns.Go(func() { // reads, never answers, until the end of the test
				buf := make([]byte, 512)
				for {
					if _, err := c.Read(buf); err != nil {
						return
					}
					h.mu.Lock()
					h.reads[id] = append(h.reads[id], time.Now())
					h.mu.Unlock()
				}
			})
			t.Cleanup(func() { _ = c.Close() })
		}
	}()
	return h
}

// connections counts the connections that sent something from since
// (inclusive) to until (exclusive): the asks that reached Redis, each on a
// connection of its own (an ask that gets no answer makes its connection
// unusable). A read's time is taken once it returned: what it read was
// sent at that time or earlier.
func (h *hungRedis) connections(since, until time.Time) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, reads := range h.reads {
		if slices.ContainsFunc(reads, func(at time.Time) bool { return !at.Before(since) && at.Before(until) }) {
			n++
		}
	}
	return n
}

// reached says whether a connection was dialled, or sent something, since
// then: an ask that reached Redis, or whose dial did while the ask timed
// out before it could send (a loaded machine).
func (h *hungRedis) reached(since time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for id, at := range h.accepted {
		if !at.Before(since) || slices.ContainsFunc(h.reads[id], func(r time.Time) bool { return !r.Before(since) }) {
			return true
		}
	}
	return false
}

// docs/api.md: "If Redis fails or answers slower than 250 ms, starts go
// ahead unlimited ..., Redis is left alone for a second". Here Redis hangs,
// and its client has no bound of its own (no read or write timeout; it
// honours its context's deadline): only the limit's own bound can answer a
// start, and every start is answered (a stuck one would wait forever; the
// test waits half a minute). A start that failed open failed at
// t0+RateLimitTimeout at the earliest (t0: before it was sent), so Redis is
// left alone until t0+RateLimitTimeout+RateLimitPause at least: no other
// connection sends to the hung server before then, however many starts come
// meanwhile. Once the pause is surely over (RateLimitPause after the last
// start returned), the next start asks Redis again, and fails open again.
// Two rounds at least, until at least 5 starts were answered inside a pause.
func TestStartRateLimitHungRedisIsBoundedThenLeftAlone(t *testing.T) {
	t.Parallel()
	hung := newHungRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: hung.addr, ContextTimeoutEnabled: true, ReadTimeout: -1, WriteTimeout: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	f := newRateFixture(t, 1, rdb)
	o, wf := f.org(t, "hung", nil)

	i := 0
	start := func() {
		t.Helper()
		i++
		answered := make(chan apitest.Response, 1)
		go func() { answered <- f.start(o, wf, fmt.Sprintf("hung-%d", i), i) }()
		select {
		case r := <-answered:
			require.Equal(t, http.StatusCreated, r.Status, "start %d: %s", i, r.Body)
			require.Empty(t, r.Header.Get(handlers.HeaderRateLimit), "start %d: no RateLimit it cannot know", i)
		case <-time.After(30 * time.Second):
			t.Fatalf("start %d unanswered after 30 s: the limit waits on a hung Redis beyond its bound (%s)", i, handlers.RateLimitTimeout)
		}
	}

	inPause := 0
	deadline := time.Now().Add(3 * time.Minute)
	for round := 1; round <= 2 || inPause < 5; round++ {
		require.True(t, time.Now().Before(deadline), "after %d rounds, only %d starts answered inside a pause", round-1, inPause)
		t0 := time.Now()
		start() // the pause is over (or none began): it asks Redis
		require.Eventually(t, func() bool { return hung.reached(t0) },
			30*time.Second, 10*time.Millisecond, "round %d: the first start did not ask Redis", round)
		paused := t0.Add(handlers.RateLimitTimeout + handlers.RateLimitPause) // Redis is left alone until then at least
		for time.Now().Before(paused) {
			start()
			if time.Now().Before(paused) {
				inPause++
			}
		}
		require.LessOrEqual(t, hung.connections(t0, paused), 1,
			"round %d: Redis was asked again within the pause after the first start failed open", round)
		time.Sleep(handlers.RateLimitPause) // surely over: the last start failed (if it asked Redis) before it returned
	}
	require.EqualValues(t, i, f.e.Count("validation_runs", "org_id = ?", o.ID), "every start created its run")
}

// evalCounter counts the Lua calls (the rate limit's) a Redis client
// sends, each delayed by delay, as a slow Redis would answer.
type evalCounter struct {
	delay time.Duration
	n     atomic.Int64
}

func (h *evalCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *evalCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *evalCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := cmd.Name(); name == "evalsha" || name == "eval" {
			h.n.Add(1)
			time.Sleep(h.delay)
		}
		return next(ctx, cmd)
	}
}

// A flood over the rate costs Redis about one call per token, not one per
// start: once a start is refused, or has taken the last token, the others
// of its organisation are refused in the process until a token can be
// back, and then one start asks Redis while the rest are refused. Redis
// answers each call 50 ms late here, so that without that one asker every
// start arriving while the first asks would ask too: 16 clients in a
// closed loop would send about 16 calls per token.
func TestStartRateLimitAsksRedisOncePerToken(t *testing.T) {
	t.Parallel()
	rdb := apitest.Redis(t)
	calls := &evalCounter{delay: 50 * time.Millisecond}
	rdb.AddHook(calls)
	const rate, clients = 4, 16
	e := apitest.New(t, apitest.Options{Redis: rdb, Config: func(c *config.Config) {
		c.OrgStartRate = rate
		c.RateLimitHold = 0 // refused at once: the loop sends as fast as it can
	}})
	f := &rateFixture{e: e, rdb: rdb}
	o, wf := f.org(t, "flooder", nil)

	var created, limited atomic.Int64
	t0 := time.Now()
	stop := t0.Add(2 * time.Second)
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			for i := 0; time.Now().Before(stop); i++ {
				r := f.start(o, wf, fmt.Sprintf("c%d-%d", c, i), i)
				switch r.Status {
				case http.StatusCreated:
					created.Add(1)
				case http.StatusTooManyRequests:
					limited.Add(1)
				default:
					t.Errorf("%d %s", r.Status, r.Body)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(t0)
	tokens := float64(rate) * (elapsed.Seconds() + 1) // the burst, then the rate
	require.Positive(t, limited.Load(), "a flood over the rate is limited")
	require.LessOrEqual(t, float64(created.Load()), tokens, "no more starts than the tokens")
	// Before the first refusal is known every client may ask (clients);
	// then one call per token, and one refused ask as each denial ends.
	// A stall of the process (a loaded machine, -race) lets more than one
	// token come back at once: the grant that leaves some ends the
	// denial, and every client may ask again (clients more, for one such
	// stall in the flood).
	bound := 2*clients + int64(3*tokens)
	require.LessOrEqual(t, calls.n.Load(), bound,
		"%d Redis calls for %d starts (%d created) in %s: more than one per token", calls.n.Load(), created.Load()+limited.Load(), created.Load(), elapsed)
	t.Logf("%d Redis calls for %d starts (%d created) in %s", calls.n.Load(), created.Load()+limited.Load(), created.Load(), elapsed)
}

// A refused start is held RATE_LIMIT_HOLD before its 429, and its
// Retry-After counts from the answer (at least 1).
func TestStartRateLimitHoldsARefusal(t *testing.T) {
	t.Parallel()
	const hold = 500 * time.Millisecond
	f := newRateFixture(t, 1, nil)
	f.e = f.e.WithConfig(func(c *config.Config) { c.RateLimitHold = hold })
	a, wf := f.org(t, "flooder", nil)
	require.Equal(t, http.StatusCreated, f.start(a, wf, "a-0", 0).Status, "the burst")
	t0 := time.Now()
	r := f.start(a, wf, "a-1", 1)
	took := time.Since(t0)
	requireProblem(t, r, http.StatusTooManyRequests, problem.RateLimited.String())
	require.GreaterOrEqual(t, took, hold, "the refusal was held")
	require.Regexp(t, rateLimitedRetry, r.Header.Get("Retry-After"))
	requireRateHeaders(t, r, 1)
	f.requireNothingStored(t, a, "a-1")
}

// Each refusal is held between RATE_LIMIT_HOLD and twice it, at random:
// with one fixed hold, the clients of a flood refused together came back
// together, and the tokens went to bursts of them at once, which another
// organisation's starts waited behind (the bench's noisy neighbour).
func TestStartRateLimitHoldsAreSpread(t *testing.T) {
	t.Parallel()
	const hold = 250 * time.Millisecond
	low, high := 2*hold, time.Duration(0)
	for range 1000 {
		d := handlers.RateLimitHoldFor(hold)
		require.GreaterOrEqual(t, d, hold, "held at least RATE_LIMIT_HOLD")
		require.Less(t, d, 2*hold, "held less than twice RATE_LIMIT_HOLD")
		low, high = min(low, d), max(high, d)
	}
	// 1,000 uniform draws all in one half of the range: odds of 2^-999.
	require.Less(t, low, hold+hold/2, "no hold in the range's lower half: the holds are not spread")
	require.GreaterOrEqual(t, high, hold+hold/2, "no hold in the range's upper half: the holds are not spread")
}

// At most RateLimitHoldMax refusals are held at once (the rest are
// answered at once), a held one gives its room under
// MAX_REQUESTS_IN_FLIGHT back (another organisation's start gets through
// a bound of 1 while two are held), and a client that hangs up is let go.
func TestStartRateLimitHoldIsBounded(t *testing.T) {
	t.Parallel()
	rdb := apitest.Redis(t)
	e := apitest.New(t, apitest.Options{Redis: rdb, RateLimitHoldMax: 2, Config: func(c *config.Config) {
		c.OrgStartRate = 1
		c.RateLimitHold = time.Hour // held until the client hangs up
		c.MaxRequestsInFlight = 1
		c.OverloadWait = 30 * time.Second // the three arrive at once: they take turns at the one slot
	}})
	f := &rateFixture{e: e, rdb: rdb}
	a, wfA := f.org(t, "flooder", nil)
	b, wfB := f.org(t, "neighbour", nil)
	srv := e.Server()
	// post is one start of A's, answered with its status, or -1 when the
	// client hung up first.
	post := func(ctx context.Context, key string) int {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/api/workflows/"+wfA+"/start/",
			strings.NewReader(`{"submission": {}}`))
		req.Header.Set("Authorization", "Bearer "+a.Token)
		req.Header.Set(idempotency.HeaderKey, key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return -1
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	send := func(ctx context.Context, try int) chan int {
		answers := make(chan int, 3)
		for i := range 3 {
			go func() { answers <- post(ctx, fmt.Sprintf("a-held-%d-%d", try, i)) }()
		}
		return answers
	}
	// Each try spends A's token, then sends three starts at once: two are
	// held for an hour; the third is answered. On a loaded machine A's
	// token may come back before they arrive and let one through: that try
	// proves nothing, and the next begins once its clients are let go and
	// A's token is back (a refused burst would be held for the hour; it is
	// sent with a bound, so that fails the test instead of hanging it).
	var answers chan int
	var cancel context.CancelFunc
	for try := 0; ; try++ {
		require.Less(t, try, 10, "A's token came back before its starts arrived, every try")
		if try > 0 {
			time.Sleep(1100 * time.Millisecond) // OrgStartRate 1: one token a second
		}
		burst, stop := context.WithTimeout(context.Background(), 30*time.Second)
		status := post(burst, fmt.Sprintf("a-%d", try))
		stop()
		require.Equal(t, http.StatusCreated, status, "the burst start (-1: held, A's token had not come back)")
		var ctx context.Context
		ctx, cancel = context.WithCancel(context.Background())
		answers = send(ctx, try)
		select {
		case status = <-answers:
		case <-time.After(30 * time.Second):
			t.Fatal("no refusal answered: more than RateLimitHoldMax held")
		}
		if status != http.StatusCreated {
			require.Equal(t, http.StatusTooManyRequests, status)
			break
		}
		cancel()
		for range 2 {
			<-answers
		}
		require.Eventually(t, func() bool { return gaugeValue(t, e.Registry, "valruns_rate_limit_held") == 0 },
			30*time.Second, 5*time.Millisecond)
	}
	defer cancel()
	require.Eventually(t, func() bool { return gaugeValue(t, e.Registry, "valruns_rate_limit_held") == 2 },
		30*time.Second, 5*time.Millisecond)
	r := f.start(b, wfB, "b-0", 0)
	require.Equal(t, http.StatusCreated, r.Status, "B's start while two of A's refusals are held: %s", r.Body)
	require.Zero(t, counterValue(t, e.Registry, "valruns_http_overloaded_total", "bound", "requests"),
		"no request waited out OVERLOAD_WAIT for the slot")

	cancel() // the held clients hang up: the process lets them go
	for range 2 {
		require.Equal(t, -1, <-answers)
	}
	require.Eventually(t, func() bool { return gaugeValue(t, e.Registry, "valruns_rate_limit_held") == 0 },
		30*time.Second, 5*time.Millisecond)
}

// lateRedis is the tests' Redis behind a proxy that can make it late or
// down: each answer is held for delay before it is passed on (0: at once),
// and once down it refuses connections and has closed those it had.
type lateRedis struct {
	proxy *tcpproxy.Proxy
	delay atomic.Int64 // nanoseconds
}

// newLateRedis starts the proxy, and returns it with a client of it built
// as serve builds the rate limit's (timeouts of handlers.RateLimitTimeout).
func newLateRedis(t *testing.T) (*lateRedis, redis.UniversalClient) {
	t.Helper()
	up := apitest.Redis(t).(*redis.Client).Options()
	l := &lateRedis{}
	l.proxy = tcpproxy.New(t, up.Addr, tcpproxy.Late(func() time.Duration { return time.Duration(l.delay.Load()) }))
	to := handlers.RateLimitTimeout
	rdb := redis.NewClient(&redis.Options{Addr: l.proxy.Addr(), DB: up.DB, Username: up.Username, Password: up.Password,
		DialTimeout: to, ReadTimeout: to, WriteTimeout: to})
	t.Cleanup(func() { _ = rdb.Close() })
	return l, rdb
}

// goDown refuses connections from now on and closes those open.
func (l *lateRedis) goDown() {
	l.proxy.Close()
}

// closedLoops runs clients loops of starts of o, each with a key of its
// own, until stop says so (given the 429s so far), and counts the answers
// 201 and 429 (anything else fails the test).
func (f *rateFixture) closedLoops(t *testing.T, o apitest.Org, wf, prefix string, clients int, stop func(limited int64) bool) (created, limited int64) {
	t.Helper()
	var c, l atomic.Int64
	var wg sync.WaitGroup
	for n := range clients {
		wg.Go(func() {
			for i := 0; !stop(l.Load()); i++ {
				r := f.start(o, wf, fmt.Sprintf("%s-%d-%d", prefix, n, i), i)
				switch r.Status {
				case http.StatusCreated:
					c.Add(1)
				case http.StatusTooManyRequests:
					l.Add(1)
				default:
					t.Errorf("%d %s", r.Status, r.Body)
					return
				}
			}
		})
	}
	wg.Wait()
	return c.Load(), l.Load()
}

// overItsRate floods o while Redis answers in time, until one of its
// starts is refused: the organisation is known to be over its rate.
func (f *rateFixture) overItsRate(t *testing.T, o apitest.Org, wf string, clients int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	_, limited := f.closedLoops(t, o, wf, "before", clients, func(limited int64) bool {
		return limited > 0 || time.Now().After(deadline)
	})
	require.Positive(t, limited, "no start refused in a minute of flood")
}

// A flood over its organisation's rate stays at about its rate when Redis
// turns slow, answering past the limit's deadline (RateLimitTimeout): the
// organisation is known to be over its rate, so the process counts its
// tokens itself rather than letting every start through (failing open let
// a flood of 200 clients start twice its rate). Its starts still pass, at
// its rate.
func TestStartRateLimitLateRedisKeepsAFloodAtItsRate(t *testing.T) {
	t.Parallel()
	late, rdb := newLateRedis(t)
	const rate, clients = 2, 32
	e := apitest.New(t, apitest.Options{Redis: rdb, RateLimitTimeout: handlers.RateLimitTimeout, Config: func(c *config.Config) {
		c.OrgStartRate = rate
		c.RateLimitHold = 0 // refused at once: the clients send as fast as they can
	}})
	f := &rateFixture{e: e, rdb: rdb}
	o, wf := f.org(t, "flooder", nil)
	f.overItsRate(t, o, wf, clients)

	late.delay.Store(int64(time.Second)) // every answer from now on comes 4 x RateLimitTimeout late
	t0 := time.Now()
	stop := t0.Add(3 * time.Second)
	created, limited := f.closedLoops(t, o, wf, "late", clients, func(int64) bool { return time.Now().After(stop) })
	elapsed := time.Since(t0)
	allowed := float64(rate) * (elapsed.Seconds() + 1) // the burst, then the rate
	t.Logf("Redis late: %d starts created, %d limited in %s (%.0f allowed)", created, limited, elapsed, allowed)
	require.Positive(t, created, "a late Redis shuts the organisation out")
	require.LessOrEqual(t, float64(created), 2*allowed,
		"Redis late: %d starts created in %s at %d per second (%d limited): the limit opened", created, elapsed, rate, limited)
	require.EqualValues(t, f.e.Count("validation_runs", "org_id = ? AND idempotency_key LIKE 'late-%'", o.ID), created, "one run per 201")
}

// docs/api.md: a Redis that fails (here: it went down, connections
// refused) lets starts through unlimited, even those of an organisation
// known to be over its rate a moment before.
func TestStartRateLimitDownRedisFailsOpenAfterAFlood(t *testing.T) {
	t.Parallel()
	late, rdb := newLateRedis(t)
	const rate = 1
	e := apitest.New(t, apitest.Options{Redis: rdb, RateLimitTimeout: handlers.RateLimitTimeout, Config: func(c *config.Config) {
		c.OrgStartRate = rate
		c.RateLimitHold = 0
	}})
	f := &rateFixture{e: e, rdb: rdb}
	o, wf := f.org(t, "flooder", nil)
	f.overItsRate(t, o, wf, 8)

	late.goDown()
	// Down means the process has seen a dial fail (its hook marks Redis
	// unreachable); on a loaded machine a start may otherwise time out before
	// any dial, which is what a late Redis looks like.
	require.Eventually(t, func() bool {
		var op *net.OpError
		return errors.As(rdb.Ping(context.Background()).Err(), &op) && op.Op == "dial"
	}, 30*time.Second, 10*time.Millisecond, "no dial to the downed Redis failed")
	deadline := time.Now().Add(30 * time.Second)
	i := 0
	for ; ; i++ { // refused until the denial the process knows of ends
		r := f.start(o, wf, fmt.Sprintf("down-%d", i), i)
		if r.Status == http.StatusCreated {
			break
		}
		requireProblem(t, r, http.StatusTooManyRequests, problem.RateLimited.String())
		require.True(t, time.Now().Before(deadline), "no start let through with Redis down")
		time.Sleep(50 * time.Millisecond)
	}
	for n := range 20 { // 20 starts in a row at 1 per second: only failing open lets them all through
		r := f.start(o, wf, fmt.Sprintf("down-%d", i+1+n), n)
		require.Equal(t, http.StatusCreated, r.Status, "start %d with Redis down: %s", n, r.Body)
	}
}
