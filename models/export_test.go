package models

import (
	"time"

	"github.com/valruns/valruns/idempotency"
)

// StartBatch sends the starts ps (with their key rows ks, nil for none) as
// one statement of the start's fast path, as a batcher's writer would, and
// returns each start's result: for tests of startBatchSQL.
func (s *RunStore) StartBatch(ps []StartParams, ks []*idempotency.Key) ([]idempotency.Result, error) {
	batch := make([]*startReq, len(ps))
	for i := range ps {
		batch[i] = &startReq{p: ps[i], k: ks[i], done: make(chan struct{})}
	}
	_, err := s.batcher.exec(batch)
	out := make([]idempotency.Result, len(ps))
	for i, r := range batch {
		out[i] = r.res
	}
	return out, err
}

// SendBatchForTest sends the starts ps (with their key rows ks) as one
// statement, as a writer does, and returns each start's result and error.
func (s *RunStore) SendBatchForTest(ps []StartParams, ks []*idempotency.Key) ([]idempotency.Result, []error) {
	batch := make([]*startReq, len(ps))
	for i := range ps {
		batch[i] = &startReq{p: ps[i], k: ks[i], done: make(chan struct{})}
	}
	s.batcher.send(batch)
	res, errs := make([]idempotency.Result, len(ps)), make([]error, len(ps))
	for i, r := range batch {
		<-r.done
		res[i], errs[i] = r.res, r.err
	}
	return res, errs
}

// StartWritersForTest is the most statements of starts under way at once.
const StartWritersForTest = startWriters

// StartBatchMaxForTest is the most starts one statement carries.
const StartBatchMaxForTest = startBatchMax

// SetStartStallForTest sets how long a statement of starts runs before its
// writer counts as stalled (startStall).
func (s *RunStore) SetStartStallForTest(d time.Duration) { s.batcher.stallAfter = d }

// QueuedStartsForTest is how many starts wait in the batcher's queue for a
// writer (not those being written).
func (s *RunStore) QueuedStartsForTest() int {
	s.batcher.mu.Lock()
	defer s.batcher.mu.Unlock()
	return len(s.batcher.queue)
}

// OrgForeignKeysForTest are the constraints translate reads as ErrOrgGone.
var OrgForeignKeysForTest = orgForeignKeys
