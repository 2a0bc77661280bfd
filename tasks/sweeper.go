package tasks

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/hibiken/asynq"

	"github.com/valruns/valruns/models"
)

// Sweeper keeps every accepted run re-deliverable until it is final. The
// enqueuer deletes a staged job once Redis has its task, so from then on
// Redis alone remembers the run: a restart without persistence or a
// failover loses it, and a worker that dies mid-run leaves its task active
// in asynq for minutes. PostgreSQL knows better: every few seconds the
// sweeper lists the runs that are not final and that nothing seems to be
// delivering (queued for a while, or running with a lease that ran out),
// asks asynq whether the run's latest task is still waiting to be
// delivered, and if not, enqueues a new task for it.
//
// Each redelivery has the TaskID validation_run:<id>:redeliver:<n>, n
// counted in the run's row: a new ID each time (a completed task keeps its
// ID for its retention, so reusing one would be refused), the same ID for
// every sweeper that redelivers the same run at the same moment (asynq
// refuses the duplicates). Executing a run twice is prevented by the
// claim's attempt fencing, not by TaskIDs: a redundant delivery finds the
// run finished or held, and does nothing.
type Sweeper struct {
	runs   *models.RunStore
	insp   *asynq.Inspector
	client *asynq.Client
	// opts are the options of a run task (retries, timeout, retention).
	opts func() []asynq.Option
	// interval between sweeps; after is how old a queued run must be, and
	// how long since a sweep last looked at a run, before it is looked at.
	interval, after time.Duration
	batch           int
	log             *slog.Logger
	m               *metrics
}

// Run sweeps every interval until ctx is done.
func (s *Sweeper) Run(ctx context.Context) {
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := s.Sweep(ctx); err != nil && ctx.Err() == nil {
			s.m.sweeps.WithLabelValues("error").Inc()
			s.log.WarnContext(ctx, "sweep for stranded runs failed; will retry", "error", err, "retry_in", s.interval)
			continue
		}
		s.m.sweeps.WithLabelValues("ok").Inc()
	}
}

// Sweep looks at every stranded run once and re-enqueues those whose task
// is gone; it returns how many it re-enqueued.
func (s *Sweeper) Sweep(ctx context.Context) (int, error) {
	redelivered := 0
	for {
		rs, err := s.runs.Stranded(ctx, s.after, models.RunTaskIDPrefix, s.batch)
		if err != nil {
			return redelivered, err
		}
		for _, r := range rs {
			sent, err := s.redeliver(ctx, r)
			if err != nil {
				return redelivered, fmt.Errorf("redeliver run %s: %w", r.ID, err)
			}
			counted, err := s.runs.MarkSwept(ctx, r, sent)
			if err != nil {
				return redelivered, err
			}
			if sent && counted {
				redelivered++
				reason := "queued"
				if r.Status == models.RunRunning {
					reason = "lease_expired"
				}
				s.m.redelivered.WithLabelValues(reason).Inc()
				s.log.InfoContext(ctx, "stranded run re-enqueued", "run_id", r.ID, "status", r.Status,
					"reason", reason, "redelivery", r.Redeliveries+1)
			}
		}
		if len(rs) < s.batch {
			return redelivered, nil
		}
	}
}

// redeliver enqueues a new task for r unless its latest task is still
// waiting in the queue; it reports whether it enqueued one. A task that is
// active counts as gone: its worker may have died with it, and if not, the
// extra delivery finds the run held or finished.
func (s *Sweeper) redeliver(ctx context.Context, r models.StrandedRun) (bool, error) {
	info, err := s.insp.GetTaskInfo(queue, runTaskID(r.ID, r.Redeliveries))
	switch {
	case errors.Is(err, asynq.ErrTaskNotFound), errors.Is(err, asynq.ErrQueueNotFound):
	case err != nil:
		return false, err
	case info.State == asynq.TaskStatePending, info.State == asynq.TaskStateScheduled, info.State == asynq.TaskStateRetry:
		return false, nil
	}
	task, _, err := NewRunTask(r.ID)
	if err != nil {
		return false, err
	}
	opts := append(s.opts(), asynq.TaskID(runTaskID(r.ID, r.Redeliveries+1)))
	_, err = s.client.EnqueueContext(ctx, task, opts...)
	if err != nil && !errors.Is(err, asynq.ErrTaskIDConflict) { // a conflict: another sweeper sent it
		return false, err
	}
	return true, nil
}

// queue is the asynq queue every task of valruns goes to.
const queue = "default"

// runTaskID is the TaskID of a run's n-th redelivery; the 0th is the
// enqueuer's task.
func runTaskID(runID string, n int) string {
	if n == 0 {
		return models.RunTaskIDPrefix + runID
	}
	return fmt.Sprintf("%s%s:redeliver:%d", models.RunTaskIDPrefix, runID, n)
}
