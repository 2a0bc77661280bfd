package handlers_test

import (
	"context"
	"database/sql"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/config"
	"github.com/valruns/valruns/handlers"
	"github.com/valruns/valruns/idempotency"
	"github.com/valruns/valruns/internal/apitest"
)

// TestFirstRequestWins: of two requests with one key, the one sent first is
// the original, whatever it waits on. Here the first start waits on a table
// lock of validation_runs (held from another connection, as a migration or
// an operator's LOCK TABLE would); meanwhile a duplicate, in this process
// or in another API process on the same database, is answered 409 at once
// (while the lock is still held), and one sent with `Prefer: wait` is
// answered with the first's replay once it has committed. A request after
// that gets the replay. The independent trial that found it: the duplicate
// waited silently, then won with a fresh 201, and the first got a stale 409.
func TestFirstRequestWins(t *testing.T) {
	t.Parallel()
	e := apitest.New(t, apitest.Options{Config: func(c *config.Config) { c.IdempotencyMaxWait = 60 * time.Second }})
	org := e.NewOrg("acme")
	wf := e.NewWorkflow(org, idemWorkflowBody)
	path := idemStartPath(wf)
	// A second API process on the same database: its own batcher and its
	// own view of the keys in flight.
	other := handlers.New(handlers.Deps{Config: e.Config, DB: e.DB})
	send := func(h http.Handler, headers ...string) <-chan apitest.Response {
		ch := make(chan apitest.Response, 1)
		go func() {
			req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(idemBody))
			req.Header.Set("Authorization", "Bearer "+org.Token)
			for i := 0; i+1 < len(headers); i += 2 {
				req.Header.Set(headers[i], headers[i+1])
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			ch <- apitest.Response{Status: rec.Code, Header: rec.Header(), Body: rec.Body.Bytes()}
		}()
		return ch
	}
	// Both processes have started runs before (usage slots, statements).
	require.Equal(t, http.StatusCreated, (<-send(e.Handler)).Status)
	require.Equal(t, http.StatusCreated, (<-send(other, idemKey("warm")...)).Status)

	lockDB, err := sql.Open("pgx", e.DBURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = lockDB.Close() })
	lock, err := lockDB.BeginTx(context.Background(), nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = lock.Rollback() })
	_, err = lock.Exec(`LOCK TABLE validation_runs IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)

	first := send(e.Handler, idemKey("K")...)
	idemWaitLockWaiter(t, e) // the first start waits on the table lock

	// answeredWhileLocked is the answer of a duplicate, which must come
	// while the first still waits: a generous bound, not a timing.
	answeredWhileLocked := func(ch <-chan apitest.Response, who string) apitest.Response {
		t.Helper()
		select {
		case r := <-ch:
			return r
		case <-time.After(20 * time.Second):
			t.Fatalf("%s: no answer while the first request waits (a silent wait on the first's lock)", who)
			return apitest.Response{}
		}
	}
	for _, d := range []struct {
		who string
		h   http.Handler
	}{{"a duplicate in another process", other}, {"a duplicate in the same process", e.Handler}} {
		r := answeredWhileLocked(send(d.h, idemKey("K")...), d.who)
		require.Equal(t, http.StatusConflict, r.Status, "%s: %s", d.who, r.Body)
		require.Equal(t, idempotency.CodeKeyInProgress, idemProblem(t, r).Code, d.who)
		require.NotEmpty(t, r.Header.Get("Retry-After"), d.who)
	}
	// Duplicates that wait for the first's answer, in both processes.
	waitOther := send(other, idemKey("K", idempotency.HeaderPrefer, "wait=60")...)
	waitSame := send(e.Handler, idemKey("K", idempotency.HeaderPrefer, "wait=60")...)
	select {
	case r := <-first:
		t.Fatalf("the first request was answered %d while the table was locked: %s", r.Status, r.Body)
	case r := <-waitOther:
		t.Fatalf("a waiting duplicate was answered %d before the first: %s", r.Status, r.Body)
	case r := <-waitSame:
		t.Fatalf("a waiting duplicate was answered %d before the first: %s", r.Status, r.Body)
	case <-time.After(500 * time.Millisecond): // they wait
	}
	require.NoError(t, lock.Rollback())

	a := <-first
	requireExecuted(t, a, "the first request sent is the one that executes")
	for name, ch := range map[string]<-chan apitest.Response{"other process": waitOther, "same process": waitSame} {
		r := <-ch
		require.Equal(t, http.StatusCreated, r.Status, "%s: %s", name, r.Body)
		require.Equal(t, "true", r.Header.Get(idempotency.HeaderReplayed), "%s: the first's replay", name)
		require.JSONEq(t, string(a.Body), string(r.Body), name)
	}
	// After the first committed, every request gets its replay, never a
	// 409: many at once, in each process (none of them executes, so none
	// holds the key for the others).
	for _, h := range []http.Handler{other, e.Handler} {
		answers := make([]<-chan apitest.Response, 20)
		for i := range answers {
			answers[i] = send(h, idemKey("K")...)
		}
		for _, ch := range answers {
			r := <-ch
			require.Equal(t, http.StatusCreated, r.Status, "after the first committed: %s", r.Body)
			require.Equal(t, "true", r.Header.Get(idempotency.HeaderReplayed), "after the first committed: its replay")
		}
	}
	require.Equal(t, int64(1), idemCount(t, e, `SELECT count(*) FROM validation_runs WHERE idempotency_key = 'K'`), "one run for the key")
}
