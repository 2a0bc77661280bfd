package models

import (
	"context"
	"slices"
	"sync"
)

// turns is the admission gate of a pool's request connections: at most its
// size of requests ask the pool at once, and the next free turn goes to
// the tenants waiting in rotation, each tenant's requests in the order they
// came. One organisation's flood then delays another organisation's
// request by about one request's statements, not by the whole flood queued
// before it, and an organisation alone still gets every turn.
//
// database/sql alone hands a freed connection to a random waiter
// (connRequests.TakeRandom): under overload a request could wait many
// times longer than the ones that came after it (with 128 clients on 12
// connections, the p99 of a start was six times its p50).
type turns struct {
	mu     sync.Mutex
	free   int
	queues map[string][]*turnWait // tenant -> its requests waiting, in order
	ring   []string               // tenants with requests waiting, in turn order
}

type turnWait struct {
	ready   chan struct{}
	granted bool // set as ready is closed, under turns.mu
}

func newTurns(n int) *turns { return &turns{free: n, queues: map[string][]*turnWait{}} }

// take waits for a turn for tenant; false when ctx ended first (nothing
// held).
func (t *turns) take(ctx context.Context, tenant string) bool {
	t.mu.Lock()
	if t.free > 0 && len(t.ring) == 0 {
		t.free--
		t.mu.Unlock()
		return true
	}
	w := &turnWait{ready: make(chan struct{})}
	if len(t.queues[tenant]) == 0 {
		t.ring = append(t.ring, tenant)
	}
	t.queues[tenant] = append(t.queues[tenant], w)
	t.mu.Unlock()

	select {
	case <-w.ready:
		return true
	case <-ctx.Done():
	}
	t.mu.Lock()
	if w.granted { // the turn came as ctx ended: pass it on
		t.mu.Unlock()
		t.give()
		return false
	}
	q := slices.DeleteFunc(t.queues[tenant], func(x *turnWait) bool { return x == w })
	if len(q) == 0 {
		delete(t.queues, tenant)
		t.ring = slices.DeleteFunc(t.ring, func(o string) bool { return o == tenant })
	} else {
		t.queues[tenant] = q
	}
	t.mu.Unlock()
	return false
}

// give hands the turn to the next tenant waiting, which then goes to the
// back of the rotation, or frees it.
func (t *turns) give() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.ring) == 0 {
		t.free++
		return
	}
	tenant := t.ring[0]
	q := t.queues[tenant]
	w := q[0]
	if len(q) == 1 {
		delete(t.queues, tenant)
		t.ring = t.ring[1:]
	} else {
		t.queues[tenant] = q[1:]
		t.ring = append(t.ring[1:], tenant)
	}
	w.granted = true
	close(w.ready)
}

type tenantKey struct{}

// WithTenant returns ctx carrying the organisation a request belongs to:
// its statements take the pool's turns in rotation with other
// organisations' (the auth middleware sets it).
func WithTenant(ctx context.Context, orgID string) context.Context {
	return context.WithValue(ctx, tenantKey{}, orgID)
}

func tenantOf(ctx context.Context) string {
	s, _ := ctx.Value(tenantKey{}).(string)
	return s
}
