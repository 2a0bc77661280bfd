package tasks

import (
	"context"
	"time"

	"github.com/valruns/valruns/models"
)

// finisher writes the outcomes of runs validated straight from the queue
// (the fast path) in batches: concurrent tasks' final writes share one
// statement (models.RunStore.FinishUnclaimed).
type finisher struct {
	b batcher[*finishReq]
}

type finishReq struct {
	ctx   context.Context
	out   models.Outcome
	ended bool
	err   error
}

const (
	finishBatchMax = 128
	finishWriters  = 2
)

func newFinisher(runs *models.RunStore) *finisher {
	return &finisher{b: batcher[*finishReq]{max: finishBatchMax, writers: finishWriters, flush: func(batch []*finishReq) {
		outs := make([]models.Outcome, len(batch))
		for i, r := range batch {
			outs[i] = r.out
		}
		// The first run's context: its trace holds the statement.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(batch[0].ctx), 30*time.Second)
		ended, err := runs.FinishUnclaimed(ctx, outs)
		cancel()
		for _, r := range batch {
			// Two deliveries of one run can share a statement: the run
			// ended once, so one of them ended it.
			r.ended, r.err = ended[r.out.RunID], err
			delete(ended, r.out.RunID)
		}
	}}}
}

// finish writes o and reports whether it ended the run (false: the run was
// no longer queued, another delivery has it).
func (f *finisher) finish(ctx context.Context, o models.Outcome) (bool, error) {
	r := &finishReq{ctx: ctx, out: o}
	f.b.do(r)
	return r.ended, r.err
}
