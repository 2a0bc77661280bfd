package idempotency

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// flight is a keyed request executing in this process; done is closed once
// its transaction has committed or rolled back.
type flight struct{ done chan struct{} }

// Waiting is how many requests wait at once on a key in flight
// (`Prefer: wait`), for a gauge.
func (w *Wrapper[T]) Waiting() int { return w.waiters.count() }

// waitSlots are the places of requests waiting on a key in flight, shared
// among tenants (see Config.MaxWaiters).
type waitSlots struct {
	mu        sync.Mutex
	max, each int
	total     int
	byTenant  map[string]int
}

func newWaitSlots(max, each int) *waitSlots {
	return &waitSlots{max: max, each: each, byTenant: map[string]int{}}
}

// take reports whether tenant's request may wait, and if so holds a slot
// until give.
func (s *waitSlots) take(tenant string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.byTenant[tenant]
	if n >= s.each || (n > 0 && s.total >= s.max) {
		return false
	}
	s.byTenant[tenant] = n + 1
	s.total++
	return true
}

func (s *waitSlots) give(tenant string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.total--
	if s.byTenant[tenant]--; s.byTenant[tenant] <= 0 {
		delete(s.byTenant, tenant)
	}
}

func (s *waitSlots) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.total
}

// claim makes the key this process's to work on, unless one of its
// requests holds it: then this one is a duplicate in flight, known at
// once, whatever the first request waits on (docs/design.md, Proof: a
// later duplicate must never overtake the first while it waits). The
// claim ends with the work (unclaim), waking this process's requests
// waiting on the key.
func (k *call[T]) claim() stage[T] {
	f := &flight{done: make(chan struct{})}
	if _, held := k.w.flights.LoadOrStore(k.lockID, f); held {
		return stage[T]{kind: stageInFlight}
	}
	k.flight = f
	return stage[T]{kind: stagePrepare}
}

// unclaim ends this request's claim on its key, if it holds one.
func (k *call[T]) unclaim() {
	if k.flight == nil {
		return
	}
	k.w.flights.CompareAndDelete(k.lockID, k.flight)
	close(k.flight.done)
	k.flight = nil
}

// leave gives back what the request held while it was served: its claim
// and its waiting slot.
func (k *call[T]) leave() {
	k.unclaim()
	if k.waited > 0 {
		k.w.waiters.give(k.tenant)
	}
}

// await handles a key another request holds: 409 at once, unless the
// request asked to wait (Prefer: wait) and may; then it waits for the
// first to finish, or a while, and looks again, until its wait is over.
func (k *call[T]) await() stage[T] {
	k.unclaim()
	k.w.recent.add(k.lockID)
	if k.waited == 0 {
		wait := k.preferredWait()
		if wait == 0 || !k.w.waiters.take(k.tenant) { // no wait asked, or enough requests wait already
			k.inProgress()
			return answered[T]()
		}
		k.waited, k.deadline = wait, time.Now().Add(wait)
		k.c.Header(HeaderPreferenceApplied, AppliedWait(wait))
	}
	if !k.waitForFlight(k.deadline) {
		k.inProgress()
		return answered[T]()
	}
	return stage[T]{kind: stageLook} // the cheap look, until the key is free
}

// preferredWait is how long the request may wait for its key's first
// request: the Prefer header's wait within Config.MaxWait.
func (k *call[T]) preferredWait() time.Duration {
	return PreferredWait(k.c.Request.Header, k.w.cfg.MaxWait)
}

// PreferredWait is the wait a request asks for with RFC 7240's
// `Prefer: wait=N` (whole seconds), capped at max: 0 when it asks for none,
// when max is 0 (waiting disabled), and for a wait of 0, a negative one or a
// malformed one. Other preferences and a preference's parameters are
// ignored; an N too large for an int64 is above any cap, so it is max.
func PreferredWait(h http.Header, max time.Duration) time.Duration {
	if max <= 0 {
		return 0
	}
	for _, line := range h.Values(HeaderPrefer) {
		for pref := range strings.SplitSeq(line, ",") {
			token, _, _ := strings.Cut(pref, ";") // parameters of a preference are not ours
			name, value, ok := strings.Cut(strings.TrimSpace(token), "=")
			if !ok || !strings.EqualFold(strings.TrimSpace(name), "wait") {
				continue
			}
			v := strings.Trim(strings.TrimSpace(value), `"`)
			n, err := strconv.ParseInt(v, 10, 64)
			switch {
			case errors.Is(err, strconv.ErrRange) && !strings.HasPrefix(v, "-"):
				return max // more seconds than an int64 holds: above any cap
			case err != nil || n <= 0:
				return 0
			case n > int64(max/time.Second):
				// Compared in seconds: n*time.Second overflows past
				// 9223372036 and would wrap below the cap, or below 0.
				return max
			}
			return min(time.Duration(n)*time.Second, max)
		}
	}
	return 0
}

// AppliedWait is the Preference-Applied value for a wait of d: `wait=N`,
// N its whole seconds rounded up (a cap of 1.5s applies wait=2).
func AppliedWait(d time.Duration) string {
	return "wait=" + strconv.FormatInt(int64((d+time.Second-1)/time.Second), 10)
}

// waitForFlight waits for the key's first request to finish, or a while
// before looking again (it may be in another process), and reports
// whether there is time left.
func (k *call[T]) waitForFlight(deadline time.Time) bool {
	left := time.Until(deadline)
	if left <= 0 {
		return false
	}
	var done chan struct{}
	if f, ok := k.w.flights.Load(k.lockID); ok {
		done = f.(*flight).done
	}
	// Look again soon, then less often: each look borrows a connection
	// for one statement and gives it back.
	k.pollCount++
	pause := min(20*time.Millisecond<<min(k.pollCount, 4), 250*time.Millisecond, left)
	t := time.NewTimer(pause)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
	return true
}
