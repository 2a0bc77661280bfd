package idempotency

import (
	"bytes"
	"container/list"
	"net/http"
	"sync"
	"time"
)

// The bounds of answerCache. A replay the cache answers reads nothing from
// PostgreSQL; one it misses costs the one read (KeyStore.Lookup) a replay
// always cost, so the bounds trade memory for reads, never correctness.
const (
	// answerCacheEntries and answerCacheBytes bound the cache: at most this
	// many answers and this many bytes (bodies, keys, headers, plus
	// answerOverhead each); past either, the oldest answers go first.
	answerCacheEntries = 1 << 14
	answerCacheBytes   = 32 << 20
	// answerCacheMaxAnswer: an answer whose entry is larger than this is
	// never cached (a start's 201 is well under 1 KiB).
	answerCacheMaxAnswer = 64 << 10
	// answerCacheMaxAge: an entry is served at most this long after this
	// process saved or read its answer, so that a key an operator deleted
	// (an organisation's removal, docs/operations.md) is seen within it.
	answerCacheMaxAge = 2 * time.Minute
	// answerCacheSkew: an entry is never served later than this before
	// its key's expires_at (the database's clock) by this process's clock,
	// a margin for the two clocks' difference.
	answerCacheSkew = time.Minute
)

// answerOverhead is what an entry is counted beyond its variable parts: the
// struct, its list element and map slot.
const answerOverhead = 256

// answerCache holds, by lock id, the stored answers of finished keys that
// this process saved (the first answer) or read (a replay from the
// database) lately, so that a retry is answered from memory: the replay
// fast path without its read.
//
// It is safe because a live key's row never changes: save_key.sql only
// overwrites a row past expires_at, and a row is deleted only past it (the
// cleanup) or by an operator removing its organisation. So an entry is
// served only before expires_at (less answerCacheSkew) and for at most
// answerCacheMaxAge; it holds only final answers (2xx and 4xx committed with
// their key), never a key in flight or an answer that is not stored (a 5xx,
// a refusal before the handler, a rate limit answered before the wrapper).
type answerCache struct {
	mu      sync.Mutex
	entries map[int64]*list.Element // of *storedAnswer
	order   *list.List              // oldest first
	bytes   int
	// The bounds and the clock: the constants above and time.Now, except
	// in the package's own tests.
	maxEntries, maxBytes, maxAnswer int
	maxAge, skew                    time.Duration
	now                             func() time.Time
}

// storedAnswer is a finished key's stored answer as a replay needs it (see
// call.replayAnswer).
type storedAnswer struct {
	lockID             int64
	tenant, scope, key string
	requestHash        []byte
	// method and path are the first request's, as stored with its key
	// (the path as sent), to say what a mismatch changed.
	method, path string
	status       int
	header       http.Header // the stored headers (storedHeaders)
	body         []byte
	requestID    string // the first request's X-Request-Id
	expiresAt    time.Time
	// cached is when the answer entered the cache; size what it counts.
	cached time.Time
	size   int
}

func newAnswerCache() *answerCache {
	return &answerCache{entries: map[int64]*list.Element{}, order: list.New(),
		maxEntries: answerCacheEntries, maxBytes: answerCacheBytes, maxAnswer: answerCacheMaxAnswer,
		maxAge: answerCacheMaxAge, skew: answerCacheSkew, now: time.Now}
}

// get returns the answer of (tenant, scope, key), whose lock id is id, if
// the cache holds it and may still serve it; nil otherwise.
func (a *answerCache) get(id int64, tenant, scope, key string) *storedAnswer {
	if a == nil {
		return nil
	}
	now := a.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	el, ok := a.entries[id]
	if !ok {
		return nil
	}
	ans := el.Value.(*storedAnswer)
	if !a.servable(ans, now) {
		a.remove(el)
		return nil
	}
	if ans.tenant != tenant || ans.scope != scope || ans.key != key {
		return nil // another key with the same lock id: never its answer
	}
	return ans
}

// servable reports whether ans may still answer a replay at now.
func (a *answerCache) servable(ans *storedAnswer, now time.Time) bool {
	return now.Before(ans.expiresAt.Add(-a.skew)) && now.Before(ans.cached.Add(a.maxAge))
}

// put caches ans (replacing the entry of its lock id), unless it is too
// large or already too close to its expiry, then drops the oldest entries
// while the cache is over its bounds or they are past their age. It keeps
// its own copy of the body and fingerprint: a handler's body may not stay
// as it is.
func (a *answerCache) put(ans *storedAnswer) {
	if a == nil {
		return
	}
	ans.size = answerOverhead + len(ans.tenant) + len(ans.scope) + len(ans.key) + len(ans.requestHash) +
		len(ans.method) + len(ans.path) + len(ans.body) + len(ans.requestID)
	for name, vs := range ans.header {
		for _, v := range vs {
			ans.size += len(name) + len(v)
		}
	}
	ans.cached = a.now()
	if ans.size > a.maxAnswer || !a.servable(ans, ans.cached) {
		return
	}
	ans.body, ans.requestHash = bytes.Clone(ans.body), bytes.Clone(ans.requestHash)
	a.mu.Lock()
	defer a.mu.Unlock()
	if el, ok := a.entries[ans.lockID]; ok {
		a.remove(el)
	}
	a.entries[ans.lockID] = a.order.PushBack(ans)
	a.bytes += ans.size
	for el := a.order.Front(); el != nil; el = a.order.Front() {
		old := el.Value.(*storedAnswer)
		if len(a.entries) <= a.maxEntries && a.bytes <= a.maxBytes && ans.cached.Before(old.cached.Add(a.maxAge)) {
			break
		}
		a.remove(el)
	}
}

func (a *answerCache) remove(el *list.Element) {
	ans := a.order.Remove(el).(*storedAnswer)
	delete(a.entries, ans.lockID)
	a.bytes -= ans.size
}

// len and size are how many entries and bytes the cache holds.
func (a *answerCache) len() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.entries)
}

func (a *answerCache) size() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.bytes
}

// replayHeader is the header of a replay holding the stored headers.
func replayHeader(stored map[string]string) http.Header {
	h := make(http.Header, len(stored))
	for name, v := range stored {
		h.Set(name, v)
	}
	return h
}
