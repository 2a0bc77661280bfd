package idempotency

import "sync"

// recentKeys remembers, by lock id, the keys this process answered lately:
// finished, replayed, refused as reused, or found in flight. A request whose
// key is among them is probably a retry, so the wrapper first tries the
// replay fast path (one read, no transaction) instead of beginning the
// transaction that a first attempt needs. It is only a guess about which
// path is cheaper: being wrong costs a round trip, never correctness.
//
// It holds at most 2*size ids (16 bytes each), in two generations: when the
// current one is full it becomes the previous one, and the previous one is
// dropped.
type recentKeys struct {
	mu        sync.Mutex
	size      int
	cur, prev map[int64]struct{}
}

func newRecentKeys(size int) *recentKeys {
	return &recentKeys{size: size, cur: make(map[int64]struct{}, size)}
}

func (r *recentKeys) add(id int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.cur[id]; ok {
		return
	}
	if len(r.cur) >= r.size {
		r.prev, r.cur = r.cur, make(map[int64]struct{}, r.size)
	}
	r.cur[id] = struct{}{}
}

func (r *recentKeys) has(id int64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.cur[id]
	if !ok {
		_, ok = r.prev[id]
	}
	return ok
}
