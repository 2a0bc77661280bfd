package tasks

import (
	"context"
	"time"
)

// releaser tells the gate that runs left the queue in batches: concurrent
// tasks' releases of one organisation share one call of the gate's script
// (and one enqueue of the runs it lets in), as their final writes share one
// statement in the finisher.
type releaser struct {
	b batcher[releaseReq]
}

type releaseReq struct {
	ctx  context.Context
	org  string
	ids  []string
	cost time.Duration
}

const (
	releaseBatchMax = 256
	releaseWriters  = 2
)

// newReleaser batches the calls of flush, which releases ids of org that
// took cost each on average.
func newReleaser(flush func(ctx context.Context, org string, ids []string, cost time.Duration)) *releaser {
	return &releaser{b: batcher[releaseReq]{max: releaseBatchMax, writers: releaseWriters, flush: func(batch []releaseReq) {
		// One call per organisation, in the order they came; its cost is
		// the runs' average.
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
			flush(g.ctx, org, g.ids, cost)
		}
	}}}
}

// release releases ids of org (cost each) and returns once the gate knows.
func (r *releaser) release(ctx context.Context, org string, ids []string, cost time.Duration) {
	r.b.do(releaseReq{ctx: ctx, org: org, ids: ids, cost: cost})
}
