package tasks

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/hibiken/asynq"

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

// tickID names a tick of the cleanup's schedule: every worker computes the
// same name for the same tick (see Worker.scheduleCleanup).
func tickID(tick time.Time) string { return cleanupTaskIDPrefix + tick.UTC().Format(time.RFC3339) }
