package tasks

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"

	"github.com/valruns/valruns/models"
)

// Enqueuer moves staged jobs from PostgreSQL to asynq: Brandur's
// transactionally staged job drain. A job is staged in the transaction that
// needs it, so it exists if and only if that transaction committed; the
// enqueuer sends it with a TaskID derived from it (a crash between sending
// and deleting re-sends the same TaskID, which asynq refuses as a
// duplicate), then deletes it. It wakes on NOTIFY from the start
// transaction, and polls as a fallback. If Redis is down, jobs stay staged
// and drain when it returns; requests never wait on Redis.
//
// While Redis is down, the enqueuer pings it every failingPoll (no
// doubling backoff: a backoff grown during a long outage would make the
// backlog wait long after Redis is back, with no traffic to wake it) and
// only drains once it answers, so a retry costs one ping and no database
// transaction.
type Enqueuer struct {
	staged *models.StagedJobStore
	client *asynq.Client
	// ping checks that Redis answers, within ctx's deadline.
	ping  func(ctx context.Context) error
	dbURL string
	batch int
	poll  time.Duration
	opts  func(models.StagedJob) []asynq.Option
	log   *slog.Logger
	m     *metrics
	// wake makes Run drain now: a NOTIFY arrived, or Wake was called.
	wake chan struct{}
}

// Wake makes the enqueuer drain at once, without waiting for a NOTIFY or
// its poll: an API in the same process calls it when a start commits.
func (e *Enqueuer) Wake() {
	select {
	case e.wake <- struct{}{}:
	default: // a drain is already due
	}
}

// failingPoll is the most the enqueuer waits between two looks at Redis
// while it is unreachable.
const failingPoll = 250 * time.Millisecond

// Run drains until ctx is done.
func (e *Enqueuer) Run(ctx context.Context) {
	go e.listen(ctx, e.wake)
	failing := false
	for {
		err := e.attempt(ctx, failing)
		wait := e.poll
		switch {
		case ctx.Err() != nil:
			return
		case err != nil && !failing:
			e.log.WarnContext(ctx, "staged jobs not enqueued; retrying until Redis takes them", "error", err)
			failing = true
		case err == nil && failing:
			e.log.InfoContext(ctx, "staged jobs are enqueued again")
			failing = false
		}
		if failing {
			wait = min(e.poll, failingPoll)
		}
		select {
		case <-ctx.Done():
			return
		case <-e.wake:
		case <-time.After(wait):
		}
	}
}

// attempt drains the staged jobs. After a failure, it first pings Redis
// (for at most failingPoll) and drains only if Redis answers.
func (e *Enqueuer) attempt(ctx context.Context, failing bool) error {
	if failing {
		pctx, cancel := context.WithTimeout(ctx, failingPoll)
		err := e.ping(pctx)
		cancel()
		if err != nil {
			return fmt.Errorf("redis does not answer: %w", err)
		}
	}
	return e.DrainAll(ctx)
}

// DrainAll moves every staged job, a batch per transaction.
func (e *Enqueuer) DrainAll(ctx context.Context) error {
	for {
		n, err := e.staged.Drain(ctx, e.batch, func(j models.StagedJob) error { return e.send(ctx, j) })
		if n > 0 {
			e.m.enqueued.Add(float64(n))
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
	}
}

func (e *Enqueuer) send(ctx context.Context, j models.StagedJob) error {
	opts := append([]asynq.Option{asynq.TaskID(j.TaskID)}, e.opts(j)...)
	_, err := e.client.EnqueueContext(ctx, asynq.NewTask(j.JobName, j.JobArgs), opts...)
	if errors.Is(err, asynq.ErrTaskIDConflict) {
		return nil // sent before a crash kept us from deleting it: already queued
	}
	return err
}

// listen signals wake on every NOTIFY of models.StagedJobsChannel. It holds
// one connection of its own and reconnects when it drops; meanwhile the poll
// keeps the backlog moving.
func (e *Enqueuer) listen(ctx context.Context, wake chan<- struct{}) {
	for ctx.Err() == nil {
		err := e.listenOnce(ctx, wake)
		if ctx.Err() != nil {
			return
		}
		e.log.WarnContext(ctx, "LISTEN connection lost; polling until it is back", "error", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(2 * time.Second):
		}
	}
}

func (e *Enqueuer) listenOnce(ctx context.Context, wake chan<- struct{}) error {
	conn, err := pgx.Connect(ctx, e.dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{models.StagedJobsChannel}.Sanitize()); err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return err
		}
		select {
		case wake <- struct{}{}:
		default: // a drain is already due
		}
	}
}
