package idempotency_test

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/idempotency"
	"github.com/valruns/valruns/internal/testdb"
	"github.com/valruns/valruns/models"
)

// The cache of answers: a replay of a key whose answer this process saved
// or read is answered from memory. Most of these tests make the database
// refuse every connection (testdb.Refuse) and still expect the replay: a
// request that reached the database would be a 503.

// testClock is the cache's clock, which a test moves forward.
type testClock struct{ offset atomic.Int64 }

func (c *testClock) now() time.Time          { return time.Now().Add(time.Duration(c.offset.Load())) }
func (c *testClock) advance(d time.Duration) { c.offset.Add(int64(d)) }

func withClock(c *testClock) func(*idempotency.Wrapper[*models.RequestTx]) {
	return func(w *idempotency.Wrapper[*models.RequestTx]) { idempotency.SetAnswerClock(w, c.now) }
}

func withBounds(entries, bytes, maxAnswer int) func(*idempotency.Wrapper[*models.RequestTx]) {
	return func(w *idempotency.Wrapper[*models.RequestTx]) {
		idempotency.SetAnswerBounds(w, entries, bytes, maxAnswer)
	}
}

// keyed is the headers of a request with key, and more.
func keyed(key string, more ...string) []string {
	return append([]string{idempotency.HeaderKey, key}, more...)
}

// TestAnswerCacheReplayIsTheDatabaseReplay: a replay and a 422 answered
// from the cache, while the database refuses every connection, are the
// database path's answers byte for byte (status, every header, body) and
// are counted under the same outcome; whether the cache took the answer
// when it was first saved or when a replay read it from the database.
func TestAnswerCacheReplayIsTheDatabaseReplay(t *testing.T) {
	t.Parallel()
	e := newWrapEnv(t, idempotency.Config{})
	noCache := []string{"X-No-Answer-Cache", "1"}

	// "saved" is cached by its first answer; "read" is first answered
	// without the cache (as by another process), then cached by a replay
	// that reads it from the database.
	r := e.do("/items", `{"name":"a"}`, keyed("saved", idempotency.HeaderRequestID, "first-saved")...)
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	r = e.do("/items", `{"name":"a"}`, keyed("read", append([]string{idempotency.HeaderRequestID, "first-read"}, noCache...)...)...)
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	r = e.do("/items", `{"name":"a"}`, keyed("read")...)
	require.Equal(t, "true", r.Header.Get(idempotency.HeaderReplayed), "%s", r.Body)
	calls := e.calls.Load()

	type answer struct {
		Status  int
		Header  http.Header
		Body    string
		Outcome string
	}
	ask := func(key, body string, more ...string) answer {
		r := e.do("/items", body, keyed(key, append([]string{idempotency.HeaderRequestID, "retry"}, more...)...)...)
		return answer{r.Status, r.Header, string(r.Body), e.lastOutcome()}
	}
	type retry struct{ key, body string }
	var retries []retry
	for _, key := range []string{"saved", "read"} {
		retries = append(retries, retry{key, `{ "name" : "a" }`}, retry{key, `{"name":"b"}`})
	}
	var fromDB []answer
	for _, rt := range retries {
		fromDB = append(fromDB, ask(rt.key, rt.body, noCache...))
	}
	for i, a := range fromDB {
		if i%2 == 0 {
			require.Equal(t, http.StatusCreated, a.Status, "%s", a.Body)
			require.Equal(t, "true", a.Header.Get(idempotency.HeaderReplayed))
			require.Equal(t, scopeItems+":"+idempotency.OutcomeReplayed, a.Outcome)
		} else {
			require.Equal(t, http.StatusUnprocessableEntity, a.Status, "%s", a.Body)
			require.Equal(t, scopeItems+":"+idempotency.OutcomeMismatch, a.Outcome)
		}
		require.NotEmpty(t, a.Header.Get(idempotency.HeaderKeyExpires))
	}

	allow := testdb.Refuse(t, e.db)
	for i, rt := range retries {
		require.Equal(t, fromDB[i], ask(rt.key, rt.body), "%s with %s: the cached answer is the database's", rt.key, rt.body)
	}
	allow()
	require.Equal(t, calls, e.calls.Load(), "nothing executed again")
}

// TestAnswerCacheNeverServesNearExpiry: an entry is served only while the
// process's clock is more than AnswerCacheSkew before its key's expires_at;
// from then on the request goes to the database (here refusing: 503), never
// to the cached answer. Past expires_at the key starts new work.
func TestAnswerCacheNeverServesNearExpiry(t *testing.T) {
	t.Parallel()
	clock := &testClock{}
	// The answer stays cacheable for ttl - skew = 30 s, well under the
	// cache's maximum age, which so cannot be what stops it.
	ttl := idempotency.AnswerCacheSkew + 30*time.Second
	require.Less(t, ttl-idempotency.AnswerCacheSkew, idempotency.AnswerCacheMaxAge)
	e := newWrapEnv(t, idempotency.Config{TTL: ttl}, withClock(clock))

	first := e.do("/items", `{"name":"a"}`, keyed("k")...)
	require.Equal(t, http.StatusCreated, first.Status, "%s", first.Body)

	allow := testdb.Refuse(t, e.db)
	r := e.do("/items", `{"name":"a"}`, keyed("k")...)
	require.Equal(t, http.StatusCreated, r.Status, "served from the cache: %s", r.Body)
	require.Equal(t, "true", r.Header.Get(idempotency.HeaderReplayed))

	// By the process's clock, expires_at is now at most the skew away.
	clock.advance(ttl - idempotency.AnswerCacheSkew)
	r = e.do("/items", `{"name":"a"}`, keyed("k")...)
	require.Equal(t, http.StatusServiceUnavailable, r.Status, "not served from the cache: %s", r.Body)
	require.Equal(t, idempotency.CodeUnavailable, code(t, r))
	r = e.do("/items", `{"name":"b"}`, keyed("k")...)
	require.Equal(t, http.StatusServiceUnavailable, r.Status, "no 422 from the cache either: %s", r.Body)
	allow()

	// Past expires_at, by both clocks: another body is new work, not 422.
	clock.advance(ttl)
	require.NoError(t, e.db.Exec(`UPDATE idempotency_keys SET created_at = now() - interval '1 day',
		expires_at = now() - interval '1 second' WHERE key = 'k'`).Error)
	r = e.do("/items", `{"name":"b"}`, keyed("k")...)
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	require.Empty(t, r.Header.Get(idempotency.HeaderReplayed))
	require.Equal(t, scopeItems+":"+idempotency.OutcomeExpiredReused, e.lastOutcome())
	require.EqualValues(t, 1, e.items("b"))
}

// TestAnswerCacheSeesDeletionWithinMaxAge: a key deleted from the database
// (as when an operator removes its organisation) is no longer replayed
// once its entry is AnswerCacheMaxAge old: the retry executes afresh.
func TestAnswerCacheSeesDeletionWithinMaxAge(t *testing.T) {
	t.Parallel()
	clock := &testClock{}
	e := newWrapEnv(t, idempotency.Config{}, withClock(clock))
	first := e.do("/items", `{"name":"a"}`, keyed("k")...)
	require.Equal(t, http.StatusCreated, first.Status, "%s", first.Body)
	require.NoError(t, e.db.Exec(`DELETE FROM idempotency_keys WHERE key = 'k'`).Error)

	clock.advance(idempotency.AnswerCacheMaxAge)
	r := e.do("/items", `{"name":"a"}`, keyed("k")...)
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	require.Empty(t, r.Header.Get(idempotency.HeaderReplayed), "executed, not replayed")
	require.Equal(t, scopeItems+":"+idempotency.OutcomeNew, e.lastOutcome())
	require.EqualValues(t, 2, e.items("a"))
}

// TestAnswerCacheBounds: the cache holds at most its entries and bytes,
// dropping the oldest first, and never an answer over its largest; what it
// dropped is read from the database again.
func TestAnswerCacheBounds(t *testing.T) {
	t.Parallel()
	// fill answers n new keys, k0 first, and checks the cache's bounds
	// after each.
	fill := func(t *testing.T, e *wrapEnv, n, maxEntries, maxBytes int) {
		for i := range n {
			r := e.do("/items", fmt.Sprintf(`{"name":"n%d"}`, i), keyed(fmt.Sprintf("k%d", i))...)
			require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
			entries, bytes := idempotency.AnswerCacheHolds(e.w)
			require.LessOrEqual(t, entries, maxEntries)
			require.LessOrEqual(t, bytes, maxBytes)
			require.Positive(t, entries)
		}
	}
	// cached reports, with the database refusing, which of keys k0..k(n-1)
	// the cache replays.
	cached := func(t *testing.T, e *wrapEnv, n int) []bool {
		allow := testdb.Refuse(t, e.db)
		defer allow()
		var got []bool
		for i := range n {
			r := e.do("/items", fmt.Sprintf(`{"name":"n%d"}`, i), keyed(fmt.Sprintf("k%d", i))...)
			require.Contains(t, []int{http.StatusCreated, http.StatusServiceUnavailable}, r.Status, "%s", r.Body)
			got = append(got, r.Status == http.StatusCreated)
		}
		return got
	}

	t.Run("entries", func(t *testing.T) {
		t.Parallel()
		e := newWrapEnv(t, idempotency.Config{}, withBounds(3, 1<<20, 4096))
		fill(t, e, 6, 3, 1<<20)
		require.Equal(t, []bool{false, false, false, true, true, true}, cached(t, e, 6), "the three newest")
	})
	t.Run("bytes", func(t *testing.T) {
		t.Parallel()
		// An entry here is some 450 bytes: 1500 hold three.
		e := newWrapEnv(t, idempotency.Config{}, withBounds(100, 1500, 1000))
		fill(t, e, 6, 100, 1500)
		entries, _ := idempotency.AnswerCacheHolds(e.w)
		require.Less(t, entries, 6, "the bytes bound the entries")
		got := cached(t, e, 6)
		require.Equal(t, []bool{false, false, false}, got[:3], "the oldest went first")
		require.True(t, got[5], "the newest stays")
	})
	t.Run("largest", func(t *testing.T) {
		t.Parallel()
		e := newWrapEnv(t, idempotency.Config{}, withBounds(100, 1<<20, 1000))
		big := strings.Repeat("x", 1000)
		r := e.do("/items", `{"name":"`+big+`"}`, keyed("big")...)
		require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
		entries, _ := idempotency.AnswerCacheHolds(e.w)
		require.Zero(t, entries, "an answer over the largest is not cached")
		r = e.do("/items", `{"name":"`+big+`"}`, keyed("big")...)
		require.Equal(t, "true", r.Header.Get(idempotency.HeaderReplayed), "replayed from the database")
		entries, _ = idempotency.AnswerCacheHolds(e.w)
		require.Zero(t, entries, "nor when read")
	})
}

// TestAnswerCacheConcurrentReplays: clients answering and replaying their
// own keys at once through a cache that holds fewer keys than they use, so
// that it evicts while others read: every replay is its key's first answer,
// each key executed once (and the race detector sees the cache's locking).
func TestAnswerCacheConcurrentReplays(t *testing.T) {
	t.Parallel()
	e := newWrapEnv(t, idempotency.Config{}, withBounds(3, 1<<20, 4096))
	const clients, replays = 8, 20
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body, key := fmt.Sprintf(`{"name":"c%d"}`, c), fmt.Sprintf("c%d", c)
			first := e.do("/items", body, keyed(key)...)
			if first.Status != http.StatusCreated {
				errs <- fmt.Errorf("client %d: first answer %d %s", c, first.Status, first.Body)
				return
			}
			for range replays {
				r := e.do("/items", body, keyed(key)...)
				if r.Status != first.Status || string(r.Body) != string(first.Body) || r.Header.Get(idempotency.HeaderReplayed) != "true" {
					errs <- fmt.Errorf("client %d: replay %d %s, first %s", c, r.Status, r.Body, first.Body)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	require.EqualValues(t, clients, e.calls.Load(), "each key executed once")
}
