package tasks

import (
	"context"
	"sync"
	"time"

	"github.com/valruns/valruns/models"
)

// finisher writes the outcomes of runs validated straight from the queue
// (the fast path) in batches: concurrent tasks' final writes share one
// statement (models.RunStore.FinishUnclaimed). Writers exist only while
// outcomes wait, as in the start's batcher.
type finisher struct {
	runs   *models.RunStore
	mu     sync.Mutex
	queue  []*finishReq
	active int
}

type finishReq struct {
	out   models.Outcome
	done  chan struct{}
	ended bool
	err   error
}

const (
	finishBatchMax = 128
	finishWriters  = 2
)

// finish writes o and reports whether it ended the run (false: the run was
// no longer queued, another delivery has it).
func (f *finisher) finish(o models.Outcome) (bool, error) {
	r := &finishReq{out: o, done: make(chan struct{})}
	f.mu.Lock()
	f.queue = append(f.queue, r)
	spawn := f.active < finishWriters
	if spawn {
		f.active++
	}
	f.mu.Unlock()
	if spawn {
		go f.write()
	}
	<-r.done
	return r.ended, r.err
}

func (f *finisher) write() {
	for {
		f.mu.Lock()
		n := min(len(f.queue), finishBatchMax)
		if n == 0 {
			f.active--
			f.mu.Unlock()
			return
		}
		batch := append([]*finishReq(nil), f.queue[:n]...)
		clear(f.queue[:n])
		f.queue = f.queue[n:]
		f.mu.Unlock()

		outs := make([]models.Outcome, len(batch))
		for i, r := range batch {
			outs[i] = r.out
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		ended, err := f.runs.FinishUnclaimed(ctx, outs)
		cancel()
		for _, r := range batch {
			// Two deliveries of one run can share a statement: the run
			// ended once, so one of them ended it.
			r.ended, r.err = ended[r.out.RunID], err
			delete(ended, r.out.RunID)
			close(r.done)
		}
	}
}
