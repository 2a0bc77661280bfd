package idempotency

import (
	"bytes"
	"container/list"
	"net/http"
	"sync"
	"time"
)

// The bounds of answerCache. A replay the cache answers reads nothing from
// the store; one it misses costs the one read (Store.Lookup) a replay
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
	// its key's ExpiresAt (the store's clock) by this process's clock,
	// a margin for the two clocks' difference.
	answerCacheSkew = time.Minute
)

// answerOverhead is what an entry is counted beyond its variable parts: the
// struct, its list element and map slot.
const answerOverhead = 256

// answerCache holds, by lock id, the stored answers of finished keys that
// this process saved (the first answer) or read (a replay from the
// store) lately, so that a retry is answered from memory: the replay
// fast path without its read.
//
// It is safe because a live key's row never changes: a commit writes a
// key's row only when none is live (else ErrKeyTaken), and a store deletes
// one only past its ExpiresAt (a cleanup) or when an operator removes its
// tenant. So an
// entry is served only before ExpiresAt (less answerCacheSkew) and for at most
// answerCacheMaxAge; it holds only final answers (2xx and 4xx committed with
// their key), never a key in flight or an answer that is not stored (a 5xx,
// a refusal before the handler, a rate limit answered before the wrapper).
type answerCache struct {
	mu      sync.Mutex
	entries map[int64]*list.Element // of *answer
	order   *list.List              // oldest first
	bytes   int
	// The bounds and the clock: the constants above and time.Now, except
	// in the package's own tests.
	maxEntries, maxBytes, maxAnswer int
	maxAge, skew                    time.Duration
	now                             func() time.Time
}

// answer is a finished key's row as the cache holds it, its headers read,
// ready to replay (see call.replayAnswer).
type answer struct {
	row    *Key
	header http.Header // the stored headers (storedHeaders)
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
func (a *answerCache) get(id int64, tenant, scope, key string) *answer {
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
	ans := el.Value.(*answer)
	if !a.servable(ans, now) {
		a.remove(el)
		return nil
	}
	if ans.row.Tenant != tenant || ans.row.Scope != scope || ans.row.Key != key {
		return nil // another key with the same lock id: never its answer
	}
	return ans
}

// servable reports whether ans may still answer a replay at now.
func (a *answerCache) servable(ans *answer, now time.Time) bool {
	return now.Before(ans.row.ExpiresAt.Add(-a.skew)) && now.Before(ans.cached.Add(a.maxAge))
}

// put caches ans (replacing the entry of its lock id), unless it is too
// large or already too close to its expiry, then drops the oldest entries
// while the cache is over its bounds or they are past their age. It keeps
// its own copy of the row, body and fingerprint: a handler's body may not
// stay as it is.
func (a *answerCache) put(ans *answer) {
	if a == nil {
		return
	}
	r := ans.row
	ans.size = answerOverhead + len(r.Tenant) + len(r.Scope) + len(r.Key) + len(r.RequestHash) +
		len(r.Method) + len(r.Path) + len(r.Body) + len(r.RequestID)
	for name, vs := range ans.header {
		for _, v := range vs {
			ans.size += len(name) + len(v)
		}
	}
	ans.cached = a.now()
	if ans.size > a.maxAnswer || !a.servable(ans, ans.cached) {
		return
	}
	row := *r
	row.Body, row.RequestHash, row.Headers = bytes.Clone(r.Body), bytes.Clone(r.RequestHash), nil
	ans.row = &row
	a.mu.Lock()
	defer a.mu.Unlock()
	if el, ok := a.entries[row.LockID]; ok {
		a.remove(el)
	}
	a.entries[row.LockID] = a.order.PushBack(ans)
	a.bytes += ans.size
	for el := a.order.Front(); el != nil; el = a.order.Front() {
		old := el.Value.(*answer)
		if len(a.entries) <= a.maxEntries && a.bytes <= a.maxBytes && ans.cached.Before(old.cached.Add(a.maxAge)) {
			break
		}
		a.remove(el)
	}
}

func (a *answerCache) remove(el *list.Element) {
	ans := a.order.Remove(el).(*answer)
	delete(a.entries, ans.row.LockID)
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
