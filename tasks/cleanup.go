package tasks

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/hibiken/asynq"

	"github.com/valruns/valruns/models"
)

// Cleanup handles TypeCleanup: it makes the idempotency keys' partitions
// ahead and drops those whose whole range has expired (KeyStore.Clean);
// then it deletes the webhook deliveries done (delivered or failed) past
// their retention, in batches, each its own short transaction.
type Cleanup struct {
	keys  *models.KeyStore
	hooks *models.WebhookStore
	// retention is how long a delivery done is kept (0: for ever).
	retention time.Duration
	batch     int
	// ttl is IDEMPOTENCY_TTL: how far ahead the partitions must reach.
	ttl time.Duration
	log *slog.Logger
	m   *metrics
}

// ProcessTask runs one cleanup.
func (c *Cleanup) ProcessTask(ctx context.Context, _ *asynq.Task) error {
	start := time.Now()
	k, err := c.keys.Clean(ctx, c.ttl)
	c.m.keysDeleted.Add(float64(k.Keys))
	if err != nil {
		return fmt.Errorf("cleanup after %d partitions (%d keys): %w", k.Dropped, k.Keys, err)
	}
	c.m.partitionsAhead.Set(float64(k.Ahead))
	if !k.Oldest.IsZero() {
		c.m.oldestPartition.Set(float64(k.Oldest.Unix()))
	}
	c.log.InfoContext(ctx, "expired idempotency keys deleted", "deleted", k.Keys, "at_least", k.AtLeast, "partitions_dropped", k.Dropped,
		"partitions_made", k.Made, "partitions_ahead", k.Ahead, "duration_ms", time.Since(start).Milliseconds())
	if c.hooks == nil || c.retention <= 0 {
		return nil
	}
	start = time.Now()
	d, err := c.hooks.DeleteDoneDeliveries(ctx, start.Add(-c.retention), c.batch)
	if err != nil {
		return fmt.Errorf("cleanup after %d webhook deliveries: %w", d, err)
	}
	c.log.InfoContext(ctx, "old webhook deliveries deleted", "deleted", d, "duration_ms", time.Since(start).Milliseconds())
	return nil
}

// cleanupTaskIDPrefix + the tick's time is the TaskID of one tick's cleanup.
const cleanupTaskIDPrefix = "idempotency:cleanup:"

// tickID names a tick of the cleanup's schedule: every worker computes the
// same name for the same tick (see Worker.scheduleCleanup).
func tickID(tick time.Time) string { return cleanupTaskIDPrefix + tick.UTC().Format(time.RFC3339) }
