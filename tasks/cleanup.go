package tasks

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/hibiken/asynq"
	"github.com/robfig/cron/v3"

	"github.com/valruns/valruns/models"
)

// Cleanup handles TypeCleanup: it deletes expired idempotency keys in
// batches, each batch its own short transaction, until none remain.
type Cleanup struct {
	keys  *models.KeyStore
	batch int
	log   *slog.Logger
	m     *metrics
}

// ProcessTask runs one cleanup.
func (c *Cleanup) ProcessTask(ctx context.Context, _ *asynq.Task) error {
	start := time.Now()
	n, err := c.keys.DeleteExpired(ctx, c.batch)
	c.m.keysDeleted.Add(float64(n))
	if err != nil {
		return fmt.Errorf("cleanup after %d keys: %w", n, err)
	}
	c.log.InfoContext(ctx, "expired idempotency keys deleted", "deleted", n, "duration_ms", time.Since(start).Milliseconds())
	return nil
}

// cleanupTaskIDPrefix + the tick's time is the TaskID of one tick's cleanup.
const cleanupTaskIDPrefix = "idempotency:cleanup:"

// tickID names the scheduled tick a scheduler fires for at now. Every worker
// computes the same name for the same tick, so with several workers (each
// with its own asynq Scheduler) a tick enqueues one task: the others get
// ErrTaskIDConflict. asynq.Unique is not enough on its own: its lock is
// released when the task completes, so a scheduler that ticks a moment
// later would enqueue a second cleanup.
func tickID(sched cron.Schedule, now time.Time) string {
	// The scheduler calls us just after the tick: the tick is the first
	// scheduled time after (now - half a second). CLEANUP_SCHEDULE's
	// interval is at least one second, so there is exactly one.
	tick := sched.Next(now.Add(-500 * time.Millisecond))
	if tick.After(now.Add(500 * time.Millisecond)) { // called off-schedule: name it by the second
		tick = now.Truncate(time.Second)
	}
	return cleanupTaskIDPrefix + tick.UTC().Format(time.RFC3339)
}
