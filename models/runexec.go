package models

import (
	"context"
	"fmt"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// ClaimedRun is a run a worker now owns, with what executing it needs.
type ClaimedRun struct {
	ValidationRun
	Schema     JSON
	Assertions JSON
}

// Claim takes a run for execution: a queued run, or a running one whose
// lease has expired (its worker died or stopped heartbeating), becomes
// running with attempts+1 and a lease of lease, which the executing worker
// renews with Heartbeat. The attempt number and a live lease fence
// Heartbeat, Finish, FailAttempt and Release: a delivery that lost its
// lease, taken over or not, cannot write.
// A run that has already been started maxAttempts times is not started
// again (ErrAttemptsExhausted): a submission that kills its worker every
// time must end, not be redelivered forever. ErrRunFinished / ErrRunLeased /
// ErrNotFound say why else the run cannot be taken.
func (s *RunStore) Claim(ctx context.Context, runID string, lease time.Duration, maxAttempts int) (*ClaimedRun, error) {
	return s.claim(ctx, runID, lease, maxAttempts, 2)
}

func (s *RunStore) claim(ctx context.Context, runID string, lease time.Duration, maxAttempts, tries int) (*ClaimedRun, error) {
	var r ClaimedRun
	res := s.db.WithContext(ctx).Raw(`
UPDATE validation_runs r SET status = 'running', attempts = r.attempts + 1,
	started_at = coalesce(r.started_at, now()), lease_expires_at = now() + ? * interval '1 microsecond'
FROM workflows w
WHERE r.id = ? AND w.id = r.workflow_id AND r.attempts < ?
  AND (r.status = 'queued' OR (r.status = 'running' AND coalesce(r.lease_expires_at < now(), true)))
RETURNING r.*, w.schema, w.assertions`, lease.Microseconds(), runID, maxAttempts).Scan(&r)
	if res.Error != nil {
		return nil, fmt.Errorf("claim run %s: %w", runID, translate(res.Error))
	}
	if res.RowsAffected == 1 {
		return &r, nil
	}
	var cur struct {
		Status         string
		Attempts       int
		LeaseExpiresAt *time.Time
		Expired        bool
	}
	res = s.db.WithContext(ctx).Raw(`SELECT status, attempts, lease_expires_at,
		coalesce(lease_expires_at < now(), true) AS expired FROM validation_runs WHERE id = ?`, runID).Scan(&cur)
	unfinished := cur.Status == RunQueued || cur.Status == RunRunning
	switch {
	case res.Error != nil:
		return nil, fmt.Errorf("claim run %s: %w", runID, translate(res.Error))
	case res.RowsAffected == 0:
		return nil, fmt.Errorf("claim run %s: %w", runID, ErrNotFound)
	case cur.Status == RunRunning && !cur.Expired:
		return nil, &RunLeasedError{RunID: runID, Until: *cur.LeaseExpiresAt, Attempts: cur.Attempts}
	case unfinished && cur.Attempts >= maxAttempts:
		return nil, fmt.Errorf("claim run %s: started %d times: %w", runID, cur.Attempts, ErrAttemptsExhausted)
	case unfinished && tries > 1: // the lease expired in between
		return s.claim(ctx, runID, lease, maxAttempts, tries-1)
	case unfinished:
		return nil, fmt.Errorf("claim run %s: state changed twice while claiming", runID)
	default:
		return nil, fmt.Errorf("claim run %s (%s): %w", runID, cur.Status, ErrRunFinished)
	}
}

// Finish ends the attempt-th execution of a run with status (passed or
// failed) and its findings, in one transaction. It writes nothing and
// returns false when that attempt no longer holds a live lease on the run
// (another delivery took it over, it already finished, or its lease ran
// out): findings are written once, by a delivery that still held the run.
func (s *RunStore) Finish(ctx context.Context, runID string, attempt int, status string, findings []Finding) (bool, error) {
	var owned bool
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		res := tx.Exec(`UPDATE validation_runs SET status = ?, finished_at = now(), lease_expires_at = NULL
			WHERE id = ? AND `+liveLease, status, runID, attempt)
		if res.Error != nil {
			return res.Error
		}
		if owned = res.RowsAffected == 1; !owned || len(findings) == 0 {
			return nil
		}
		for i := range findings {
			findings[i].ID = 0
			findings[i].RunID = runID
			findings[i].Position = i
			// What the columns can hold: a finding about a huge submission
			// must not make the run impossible to finish.
			findings[i].Path = truncate(findings[i].Path, 2000)
			findings[i].Message = truncate(findings[i].Message, 4000)
		}
		return tx.Clauses(clause.OnConflict{DoNothing: true}).CreateInBatches(findings, 500).Error
	})
	if err != nil {
		return false, fmt.Errorf("finish run %s: %w", runID, translate(err))
	}
	return owned, nil
}

// Fail ends a run that no delivery holds (it is queued, or its lease has
// run out) with status error and the reason: its task failed for good
// before it could claim the run, or the run was started too many times.
// A run that finished, or that a live delivery holds, is left alone (that
// delivery ends it); ended says whether this call ended it.
func (s *RunStore) Fail(ctx context.Context, runID, reason string) (ended bool, err error) {
	reason = truncate(reason, 2000)
	res := s.db.WithContext(ctx).Exec(`UPDATE validation_runs SET status = 'error', error = ?,
		finished_at = now(), lease_expires_at = NULL
		WHERE id = ? AND (status = 'queued' OR (status = 'running' AND coalesce(lease_expires_at <= now(), true)))`, reason, runID)
	if res.Error != nil {
		return false, fmt.Errorf("fail run %s: %w", runID, translate(res.Error))
	}
	return res.RowsAffected == 1, nil
}

// CountByStatus counts the runs in each status (for tests and metrics).
func (s *RunStore) CountByStatus(ctx context.Context) (map[string]int64, error) {
	var rows []struct {
		Status string
		N      int64
	}
	if err := s.db.WithContext(ctx).Raw(`SELECT status, count(*) AS n FROM validation_runs GROUP BY status`).Scan(&rows).Error; err != nil {
		return nil, fmt.Errorf("count runs: %w", translate(err))
	}
	out := map[string]int64{}
	for _, r := range rows {
		out[r.Status] = r.N
	}
	return out, nil
}

// StagedJobStore moves staged jobs out of PostgreSQL.
type StagedJobStore struct{ db *gorm.DB }

// NewStagedJobStore returns a StagedJobStore on db.
func NewStagedJobStore(db *gorm.DB) *StagedJobStore { return &StagedJobStore{db: db} }

// Drain takes up to n staged jobs in one transaction (FOR UPDATE SKIP
// LOCKED, so several enqueuers share the work without waiting on each
// other), hands them to send, and deletes those send accepted. A job send
// fails stays staged for the next drain: nothing is lost. Returns how many
// jobs were moved.
func (s *StagedJobStore) Drain(ctx context.Context, n int, send func(StagedJob) error) (int, error) {
	moved := 0
	var sendErr error
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var jobs []StagedJob
		if err := tx.Raw(`SELECT * FROM staged_jobs ORDER BY id LIMIT ? FOR UPDATE SKIP LOCKED`, n).Scan(&jobs).Error; err != nil {
			return err
		}
		var done []int64
		for _, j := range jobs {
			if sendErr = send(j); sendErr != nil {
				break // the queue is down: keep the rest staged for the next drain
			}
			done = append(done, j.ID)
		}
		moved = len(done)
		if moved == 0 {
			return nil
		}
		return tx.Exec(`DELETE FROM staged_jobs WHERE id IN ?`, done).Error
	})
	if err != nil {
		return 0, fmt.Errorf("drain staged jobs: %w", translate(err))
	}
	if sendErr != nil {
		return moved, fmt.Errorf("send staged job: %w", sendErr)
	}
	return moved, nil
}

// Backlog counts the staged jobs not yet moved to the queue.
func (s *StagedJobStore) Backlog(ctx context.Context) (int64, error) {
	var n int64
	if err := s.db.WithContext(ctx).Raw(`SELECT count(*) FROM staged_jobs`).Scan(&n).Error; err != nil {
		return 0, fmt.Errorf("staged backlog: %w", translate(err))
	}
	return n, nil
}
