package handlers_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/config"
	"github.com/valruns/valruns/idempotency"
	"github.com/valruns/valruns/internal/apitest"
)

// idemInFlight starts a keyed request that blocks inside its transaction
// (holding the key's lock) until release, and returns its answer's channel.
func idemInFlight(t *testing.T, f *idemFixture, key, body string) (release func(), first <-chan apitest.Response) {
	t.Helper()
	require.Equal(t, http.StatusCreated, f.start(idemBody).Status, "a prior run creates the usage slots")
	release = idemLockUsage(t, f.e, f.org.ID)
	ch := make(chan apitest.Response, 1)
	go func() { ch <- f.start(body, idemKey(key)...) }()
	idemWaitLockWaiter(t, f.e)
	return release, ch
}

// waitFor sends the request in the background: its answer arrives on the channel.
func waitFor(send func() apitest.Response) <-chan apitest.Response {
	ch := make(chan apitest.Response, 1)
	go func() { ch <- send() }()
	return ch
}

// requireWaiting fails if the answer arrives within d: the request is waiting.
func requireWaiting(t *testing.T, ch <-chan apitest.Response, d time.Duration) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("answered %d while the first request was in flight: %s", r.Status, r.Body)
	case <-time.After(d):
	}
}

func idemScenarioWaitReplay(t *testing.T) {
	t.Parallel()
	f := newIdemFixture(t, nil)
	release, first := idemInFlight(t, f, "wait-1", idemBody)
	dup := waitFor(func() apitest.Response { return f.start(idemBody, idemKey("wait-1", "Prefer", "wait=5")...) })
	requireWaiting(t, dup, 300*time.Millisecond)
	release()

	a := <-first
	requireExecuted(t, a)
	r := <-dup
	requireReplay(t, a, r, a.Header.Get("X-Request-Id"))
	require.Equal(t, "wait=5", r.Header.Get(idempotency.HeaderPreferenceApplied))
	require.Equal(t, idemCounts{Runs: 2, Usage: 2, Audits: 2, Keys: 1}, f.counts(t, f.org.ID))
}

func idemScenarioWaitMismatch(t *testing.T) {
	t.Parallel()
	f := newIdemFixture(t, nil)
	release, first := idemInFlight(t, f, "wait-2", idemBody)
	// RFC 7240: several preferences, parameters and spaces; IDEMPOTENCY_MAX_WAIT (10s) caps 60.
	dup := waitFor(func() apitest.Response {
		return f.start(idemBodyB, idemKey("wait-2", "Prefer", "respond-async, wait = 60; x=1")...)
	})
	requireWaiting(t, dup, 300*time.Millisecond)
	release()
	requireExecuted(t, <-first)
	r := <-dup
	require.Equal(t, http.StatusUnprocessableEntity, r.Status, "body %s", r.Body)
	require.Equal(t, idempotency.CodeKeyReused, idemProblem(t, r).Code)
	require.Equal(t, "wait=10", r.Header.Get(idempotency.HeaderPreferenceApplied), "the wait applied: the cap")
	require.NotEmpty(t, r.Header.Get(idempotency.HeaderKeyExpires))
}

func idemScenarioWaitNotAsked(t *testing.T) {
	t.Parallel()
	f := newIdemFixture(t, nil)
	release := idemHoldKeyLock(t, f.e, f.org.ID, "workflow_start", "wait-3")
	defer release()
	for _, prefer := range []string{"", "respond-async", "wait=0", "wait=-3", "wait=soon"} {
		headers := idemKey("wait-3")
		if prefer != "" {
			headers = append(headers, "Prefer", prefer)
		}
		r := f.start(idemBody, headers...)
		require.Equal(t, http.StatusConflict, r.Status, "Prefer %q: %s", prefer, r.Body)
		require.Empty(t, r.Header.Get(idempotency.HeaderPreferenceApplied))
	}

	disabled := newIdemFixture(t, func(c *config.Config) { c.IdempotencyMaxWait = 0 })
	defer idemHoldKeyLock(t, disabled.e, disabled.org.ID, "workflow_start", "wait-3")()
	r := disabled.start(idemBody, idemKey("wait-3", "Prefer", "wait=5")...)
	require.Equal(t, http.StatusConflict, r.Status, "IDEMPOTENCY_MAX_WAIT=0 disables waiting: %s", r.Body)
	require.Empty(t, r.Header.Get(idempotency.HeaderPreferenceApplied))
}

func idemScenarioWaitCap(t *testing.T) {
	t.Parallel()
	f := newIdemFixture(t, func(c *config.Config) { c.IdempotencyMaxWaiters = 1 })
	release := idemHoldKeyLock(t, f.e, f.org.ID, "workflow_start", "wait-4")
	waiter := waitFor(func() apitest.Response { return f.start(idemBody, idemKey("wait-4", "Prefer", "wait=5")...) })
	requireWaiting(t, waiter, 300*time.Millisecond)

	r := f.start(idemBody, idemKey("wait-4", "Prefer", "wait=5")...)
	require.Equal(t, http.StatusConflict, r.Status, "past the cap: %s", r.Body)
	require.Equal(t, "1", r.Header.Get("Retry-After"))
	require.Empty(t, r.Header.Get(idempotency.HeaderPreferenceApplied))

	release() // the holder rolled back: the one waiter executes
	requireExecuted(t, <-waiter)
	require.EqualValues(t, 1, f.counts(t, f.org.ID).Runs)
}

func idemScenarioWaitTimeout(t *testing.T) {
	t.Parallel()
	f := newIdemFixture(t, nil)
	defer idemHoldKeyLock(t, f.e, f.org.ID, "workflow_start", "wait-5")()
	r := f.start(idemBody, idemKey("wait-5", "Prefer", "wait=1")...)
	require.Equal(t, http.StatusConflict, r.Status, "body %s", r.Body)
	require.Equal(t, idempotency.CodeKeyInProgress, idemProblem(t, r).Code)
	require.Equal(t, "1", r.Header.Get("Retry-After"))
	require.Empty(t, r.Header.Get(idempotency.HeaderPreferenceApplied), "waited in vain: not applied")
	require.Equal(t, idemCounts{}, f.counts(t, f.org.ID))
}

// The first request times out (503, rolled back) while two duplicates wait:
// one of them executes, the other replays it. Exactly one run.
func idemScenarioWaitFirstRollsBack(t *testing.T) {
	t.Parallel()
	f := newIdemFixture(t, func(c *config.Config) { c.IdempotencyTxTimeout = 500 * time.Millisecond })
	release, first := idemInFlight(t, f, "wait-6", idemBody)
	var dups [2]<-chan apitest.Response
	for i := range dups {
		dups[i] = waitFor(func() apitest.Response { return f.start(idemBody, idemKey("wait-6", "Prefer", "wait=10")...) })
	}
	a := <-first
	require.Equal(t, http.StatusServiceUnavailable, a.Status, "the first timed out: %s", a.Body)
	// A duplicate now executes, and blocks on the usage slots the test holds:
	// let it through once it does.
	idemWaitLockWaiter(t, f.e)
	release()

	var executed, replayed int
	var firstAnswer apitest.Response
	for _, ch := range dups {
		r := <-ch
		require.Equal(t, http.StatusCreated, r.Status, "body %s", r.Body)
		require.Equal(t, "wait=10", r.Header.Get(idempotency.HeaderPreferenceApplied))
		if r.Header.Get(idempotency.HeaderReplayed) == "true" {
			replayed++
		} else {
			executed++
			firstAnswer = r
		}
	}
	require.Equal(t, 1, executed, "exactly one duplicate executed")
	require.Equal(t, 1, replayed, "the other replayed it")
	require.NotEmpty(t, firstAnswer.Body)
	require.Equal(t, idemCounts{Runs: 2, Usage: 2, Audits: 2, Keys: 1}, f.counts(t, f.org.ID), "one run for the key (and the prior one)")
}
