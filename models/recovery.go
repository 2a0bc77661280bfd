package models

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// The worker's side of keeping accepted runs alive: the lease a delivery
// renews while it executes a run (Heartbeat, Release, FailAttempt), the
// sweep that finds runs nothing will deliver again (Stranded, MarkSwept),
// and the test of which database errors are worth retrying at once.

// ErrAttemptsExhausted: the run has been started as often as it may be; it
// is not started again (Claim), and should end in error.
var ErrAttemptsExhausted = errors.New("run started too many times")

// liveLease is the fence of every write of a delivery: the run is still
// running, by this attempt, and its lease has not run out. clock_timestamp,
// not now(): the time the row is looked at, not when a transaction began.
// A delivery whose lease ran out may have been stopped or starved for any
// time, and the sweeper may already have re-enqueued the run: it writes
// nothing, whether or not another delivery has claimed the run yet.
const liveLease = `status = 'running' AND attempts = ? AND lease_expires_at > clock_timestamp()`

// Heartbeat renews the lease of the attempt-th execution of a running run
// for another lease. It returns false, changing nothing, when that attempt
// no longer holds a live lease: another delivery took the run over, it
// finished, or the lease ran out (a heartbeat never revives an expired
// lease: the run may be re-enqueued already).
func (s *RunStore) Heartbeat(ctx context.Context, runID string, attempt int, lease time.Duration) (bool, error) {
	res := s.db.WithContext(ctx).Exec(`UPDATE validation_runs SET lease_expires_at = clock_timestamp() + ? * interval '1 microsecond'
		WHERE id = ? AND `+liveLease, lease.Microseconds(), runID, attempt)
	if res.Error != nil {
		return false, fmt.Errorf("heartbeat run %s: %w", runID, translate(res.Error))
	}
	return res.RowsAffected == 1, nil
}

// Release gives up the attempt-th execution's lease at once (its lease ends
// now), so the task's next delivery claims the run without waiting for the
// lease to run out: the execution failed, or its worker is shutting down.
// Like every write of a delivery, it needs the attempt's live lease.
func (s *RunStore) Release(ctx context.Context, runID string, attempt int) error {
	res := s.db.WithContext(ctx).Exec(`UPDATE validation_runs SET lease_expires_at = clock_timestamp()
		WHERE id = ? AND `+liveLease, runID, attempt)
	if res.Error != nil {
		return fmt.Errorf("release run %s: %w", runID, translate(res.Error))
	}
	return nil
}

// FailAttempt ends the attempt-th execution of a run with status error and
// the reason (the run went past a limit, or its task failed for good). Like
// Finish, it writes nothing and returns false when that attempt no longer
// holds a live lease on the run.
func (s *RunStore) FailAttempt(ctx context.Context, runID string, attempt int, reason string) (bool, error) {
	reason = truncate(reason, 2000)
	res := s.db.WithContext(ctx).Exec(`UPDATE validation_runs SET status = 'error', error = ?,
		finished_at = now(), lease_expires_at = NULL
		WHERE id = ? AND `+liveLease, reason, runID, attempt)
	if res.Error != nil {
		return false, fmt.Errorf("fail run %s: %w", runID, translate(res.Error))
	}
	return res.RowsAffected == 1, nil
}

// StrandedRun is a run that is not final and may have nothing left to
// deliver it: queued for a while (its task may have been lost by Redis), or
// running with a lease that ran out (its worker died).
type StrandedRun struct {
	ID     string
	Status string
	// Redeliveries is how often a sweep has re-enqueued the run so far.
	Redeliveries int
}

// Stranded lists up to limit runs a sweep should look at, oldest first:
// queued runs older than after, and running runs whose lease ran out, that
// no sweep looked at in the last after, and whose staged job (prefix + id)
// is not waiting for the enqueuer (it will deliver them). Reading takes no
// lock: several sweepers may list the same run, and MarkSwept lets one of
// them count a redelivery.
func (s *RunStore) Stranded(ctx context.Context, after time.Duration, stagedPrefix string, limit int) ([]StrandedRun, error) {
	var rs []StrandedRun
	err := s.db.WithContext(ctx).Raw(`
SELECT r.id, r.status, r.redeliveries FROM validation_runs r
WHERE r.status IN ('queued', 'running')
  AND CASE WHEN r.status = 'queued' THEN r.created_at < now() - @after * interval '1 microsecond'
           ELSE coalesce(r.lease_expires_at < now(), true) END
  AND coalesce(r.swept_at < now() - @after * interval '1 microsecond', true)
  AND NOT EXISTS (SELECT 1 FROM staged_jobs j WHERE j.task_id = @prefix || r.id::text)
ORDER BY r.created_at
LIMIT @limit`, map[string]any{"after": after.Microseconds(), "prefix": stagedPrefix, "limit": limit}).Scan(&rs).Error
	if err != nil {
		return nil, fmt.Errorf("list stranded runs: %w", translate(err))
	}
	return rs, nil
}

// MarkSwept records that a sweep looked at run r, which had r.Redeliveries
// redeliveries, and re-enqueued it (redelivered) or found its task still
// waiting in the queue. It returns false when another sweep marked the run
// first: a redelivery is counted once. A run its redelivery already
// finished is marked too (under load that delivery can be quicker than this
// statement), so every redelivery is counted.
func (s *RunStore) MarkSwept(ctx context.Context, r StrandedRun, redelivered bool) (bool, error) {
	next := r.Redeliveries
	if redelivered {
		next++
	}
	res := s.db.WithContext(ctx).Exec(`UPDATE validation_runs SET swept_at = now(), redeliveries = ?
		WHERE id = ? AND redeliveries = ?`, next, r.ID, r.Redeliveries)
	if res.Error != nil {
		return false, fmt.Errorf("mark run %s swept: %w", r.ID, translate(res.Error))
	}
	return res.RowsAffected == 1, nil
}

// IsTransient reports whether err says the database could not be reached or
// is restarting, rather than that the statement is wrong: the same work is
// expected to succeed shortly, so it is retried at once and does not count
// as a failure of the work.
func IsTransient(err error) bool {
	if err == nil {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "57P01", // admin_shutdown: the server is stopping or restarting
			"57P02", // crash_shutdown
			"57P03", // cannot_connect_now: the server is starting up
			"53300", // too_many_connections
			"40001", // serialization_failure
			"40P01": // deadlock_detected
			return true
		}
		return strings.HasPrefix(pgErr.Code, "08") // connection_exception
	}
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	return errors.As(err, &connectErr) || errors.As(err, &netErr) ||
		errors.Is(err, driver.ErrBadConn) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed) || pgconn.SafeToRetry(err)
}
