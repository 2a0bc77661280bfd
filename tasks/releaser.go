package tasks

import (
	"context"
	"sync"
	"time"
)

// releaser tells the gate that runs left the queue in batches: concurrent
// tasks' releases of one organisation share one call of the gate's script
// (and one enqueue of the runs it lets in), as their final writes share one
// statement in the finisher. Writers exist only while releases wait.
type releaser struct {
	// flush releases ids of org, which took cost each on average.
	flush  func(ctx context.Context, org string, ids []string, cost time.Duration)
	mu     sync.Mutex
	queue  []*releaseReq
	active int
}

type releaseReq struct {
	ctx  context.Context
	org  string
	ids  []string
	cost time.Duration
	done chan struct{}
}

const (
	releaseBatchMax = 256
	releaseWriters  = 2
)

// release releases ids of org (cost each) and returns once the gate knows.
func (r *releaser) release(ctx context.Context, org string, ids []string, cost time.Duration) {
	req := &releaseReq{ctx: ctx, org: org, ids: ids, cost: cost, done: make(chan struct{})}
	r.mu.Lock()
	r.queue = append(r.queue, req)
	spawn := r.active < releaseWriters
	if spawn {
		r.active++
	}
	r.mu.Unlock()
	if spawn {
		go r.write()
	}
	<-req.done
}

func (r *releaser) write() {
	for {
		r.mu.Lock()
		n := min(len(r.queue), releaseBatchMax)
		if n == 0 {
			r.active--
			r.mu.Unlock()
			return
		}
		batch := append([]*releaseReq(nil), r.queue[:n]...)
		clear(r.queue[:n])
		r.queue = r.queue[n:]
		r.mu.Unlock()

		// One call per organisation, in the order they came; its cost is the
		// runs' average.
		type group struct {
			ctx   context.Context
			ids   []string
			total time.Duration
			timed int
		}
		var orgs []string
		groups := map[string]*group{}
		for _, q := range batch {
			g := groups[q.org]
			if g == nil {
				g = &group{ctx: q.ctx}
				groups[q.org] = g
				orgs = append(orgs, q.org)
			}
			g.ids = append(g.ids, q.ids...)
			if q.cost > 0 {
				g.total += q.cost * time.Duration(len(q.ids))
				g.timed += len(q.ids)
			}
		}
		for _, org := range orgs {
			g := groups[org]
			var cost time.Duration
			if g.timed > 0 {
				cost = g.total / time.Duration(g.timed)
			}
			r.flush(g.ctx, org, g.ids, cost)
		}
		for _, q := range batch {
			close(q.done)
		}
	}
}
