package models

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"gorm.io/gorm"
)

// WakeInterval is the shortest time between two NOTIFYs a JobWaker sends:
// under load, the wakes of many starts become one NOTIFY per interval.
const WakeInterval = 5 * time.Millisecond

// JobWaker wakes the staged-job enqueuers once jobs have committed. It
// sends NOTIFY on StagedJobsChannel after the request's commit, in a
// statement of its own, and at most once per WakeInterval per process:
// PostgreSQL serialises the commits of all transactions that notify,
// cluster-wide, so a NOTIFY inside every start transaction made every start
// wait for every other. A Wake is never lost: one that arrives while a
// NOTIFY is being sent causes another after the interval.
type JobWaker struct {
	db       *gorm.DB
	interval time.Duration
	local    func()
	log      *slog.Logger
	pending  atomic.Bool
	running  atomic.Bool
}

// NewJobWaker returns a waker notifying on db. local, when set, is also
// called on every Wake: an enqueuer in the same process is woken at once,
// without a round trip through PostgreSQL. interval 0 means WakeInterval.
func NewJobWaker(db *gorm.DB, interval time.Duration, local func(), log *slog.Logger) *JobWaker {
	if interval <= 0 {
		interval = WakeInterval
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &JobWaker{db: db, interval: interval, local: local, log: log}
}

// Wake asks for the enqueuers to be woken. It never blocks.
func (w *JobWaker) Wake() {
	if w.local != nil {
		w.local()
	}
	w.pending.Store(true)
	if w.running.CompareAndSwap(false, true) {
		go w.run()
	}
}

func (w *JobWaker) run() {
	for {
		for w.pending.Swap(false) {
			w.notify()
			time.Sleep(w.interval)
		}
		w.running.Store(false)
		// A Wake between the last Swap and the Store saw running and left
		// its pending flag to us: take it, unless a new runner already has.
		if !w.pending.Load() || !w.running.CompareAndSwap(false, true) {
			return
		}
	}
}

func (w *JobWaker) notify() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := w.db.WithContext(ctx).Exec(`SELECT pg_notify(?, '')`, StagedJobsChannel).Error; err != nil {
		// The enqueuers poll as well: a lost wake delays, never loses, a job.
		w.log.Warn("could not wake the staged-job enqueuers", "error", err)
	}
}
