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

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
)

// The worker's side of keeping accepted runs alive: the lease a delivery
// renews while it executes a run (Heartbeat, Release, FailAttempt), the
// sweep that finds runs nothing will deliver again (Stranded, MarkSwept),
// and the test of which database errors are worth retrying at once.

// ErrAttemptsExhausted: the run has been started as often as it may be; it
// is not started again (Claim), and should end in error.
var ErrAttemptsExhausted = errors.New("run started too many times")

// The statements of a delivery's lease and of the sweep. Every write of a
// delivery (heartbeat, release, fail_attempt, finish_run) is fenced by the
// attempt's live lease: the run is still running, by this attempt, and its
// lease has not run out. clock_timestamp, not now(): the time the row is
// looked at, not when a transaction began. A delivery whose lease ran out
// may have been stopped or starved for any time, and the sweeper may
// already have re-enqueued the run: it writes nothing, whether or not
// another delivery has claimed the run yet.
var (
	heartbeatSQL       = statement("heartbeat")
	releaseSQL         = statement("release")
	failAttemptSQL     = statement("fail_attempt")
	strandedRunningSQL = statement("stranded_running")
	queuedSinceSQL     = statement("queued_since")
	markRedeliveredSQL = statement("mark_redelivered")
	queuedOfSQL        = statement("queued_of")
	notPendingSQL      = statement("not_pending")
)

// Heartbeat renews the lease of the attempt-th execution of a running run
// for another lease. It returns false, changing nothing, when that attempt
// no longer holds a live lease: another delivery took the run over, it
// finished, or the lease ran out (a heartbeat never revives an expired
// lease: the run may be re-enqueued already).
func (s *RunStore) Heartbeat(ctx context.Context, runID string, attempt int, lease time.Duration) (bool, error) {
	res := s.db.WithContext(ctx).Exec(heartbeatSQL, lease.Microseconds(), runID, attempt)
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
	res := s.db.WithContext(ctx).Exec(releaseSQL, runID, attempt)
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
	ended, err := s.endRun(ctx, failAttemptSQL, reason, runID, attempt)
	if err != nil {
		return false, fmt.Errorf("fail run %s: %w", runID, err)
	}
	return ended, nil
}

// StrandedRun is a run that is not final and may have nothing left to
// deliver it: queued with its task lost, or running with a lease that ran
// out (its worker died).
type StrandedRun struct {
	ID, OrgID string
	Status    string
	// Redeliveries is how often a sweep has re-enqueued the run so far.
	Redeliveries int
	CreatedAt    time.Time
}

// StrandedRunning lists up to limit running runs whose lease ran out,
// oldest first (the ids are UUIDv7). Reading takes no lock: several
// sweepers may list the same run, and MarkRedelivered lets one of them
// count its redelivery. The runs not final are found in unfinished_runs
// (migration 0010): no index of validation_runs holds its status.
func (s *RunStore) StrandedRunning(ctx context.Context, limit int) ([]StrandedRun, error) {
	var rs []StrandedRun
	err := s.db.WithContext(ctx).Raw(strandedRunningSQL, limit).Scan(&rs).Error
	if err != nil {
		return nil, fmt.Errorf("list stranded runs: %w", translate(err))
	}
	return rs, nil
}

// RunCursor is where a page of QueuedSince ends: the last id it read.
type RunCursor struct {
	ID string
}

// QueuedSince reads a page of up to limit runs listed as unfinished, in id
// order from after the cursor (nil: the start), and returns those queued
// and created more than after ago, with the cursor of the next page (nil:
// this was the last). A listed run that is final, or gone, leaves the
// list: a statement that ended a run and missed it (one sent by an older
// valruns) costs a row until the next pass.
func (s *RunStore) QueuedSince(ctx context.Context, after time.Duration, from *RunCursor, limit int) ([]StrandedRun, *RunCursor, error) {
	var page []struct {
		StrandedRun
		Due bool
	}
	cursor := uuid.Nil.String() // below every UUIDv7: the first page
	if from != nil {
		cursor = from.ID
	}
	args := map[string]any{"after": after.Microseconds(), "limit": limit, "from": cursor}
	err := s.db.WithContext(ctx).Raw(queuedSinceSQL, args).Scan(&page).Error
	if err != nil {
		return nil, nil, fmt.Errorf("list queued runs: %w", translate(err))
	}
	var rs []StrandedRun
	for _, p := range page {
		if p.Due {
			rs = append(rs, p.StrandedRun)
		}
	}
	if len(page) < limit {
		return rs, nil, nil
	}
	return rs, &RunCursor{ID: page[len(page)-1].ID}, nil
}

// MarkRedelivered counts a redelivery of run r, which had r.Redeliveries.
// It returns false when another sweep counted it first: a redelivery is
// counted once. A run its redelivery already finished is counted too (under
// load that delivery can be quicker than this statement).
//
// It never waits: a run whose row another statement holds (its delivery is
// writing it) is left alone, and false returned; the sweep looks again later.
func (s *RunStore) MarkRedelivered(ctx context.Context, r StrandedRun) (bool, error) {
	res := s.db.WithContext(ctx).Exec(markRedeliveredSQL,
		r.ID, r.Redeliveries)
	if res.Error != nil {
		return false, fmt.Errorf("mark run %s redelivered: %w", r.ID, translate(res.Error))
	}
	return res.RowsAffected == 1, nil
}

// QueuedOf returns the runs of ids that are queued: of the runs a stopped
// worker's tasks carry, those it had not claimed (the sweeper takes them
// over). Ids that are no run's are left out.
func (s *RunStore) QueuedOf(ctx context.Context, ids []string) ([]StrandedRun, error) {
	var valid []string
	for _, id := range ids {
		if _, err := uuid.Parse(id); err == nil {
			valid = append(valid, id)
		}
	}
	if len(valid) == 0 {
		return nil, nil
	}
	var rs []StrandedRun
	err := s.db.WithContext(ctx).Raw(queuedOfSQL, strings.Join(valid, ",")).Scan(&rs).Error
	if err != nil {
		return nil, fmt.Errorf("read held runs: %w", translate(err))
	}
	return rs, nil
}

// NotPending returns the runs of ids that are neither queued nor running:
// final, or unknown. The sweeper releases them from the fair gate's
// admitted sets, where a release that never reached Redis (a failover to a
// replica that had not seen it) would otherwise hold their place.
func (s *RunStore) NotPending(ctx context.Context, ids []string) ([]string, error) {
	var out, valid []string
	for _, id := range ids {
		if _, err := uuid.Parse(id); err != nil {
			out = append(out, id) // no run has it
		} else {
			valid = append(valid, id)
		}
	}
	if len(valid) == 0 {
		return out, nil
	}
	var ended []string
	err := s.db.WithContext(ctx).Raw(notPendingSQL, strings.Join(valid, ",")).Scan(&ended).Error
	if err != nil {
		return nil, fmt.Errorf("read runs' states: %w", translate(err))
	}
	return append(out, ended...), nil
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
