package models

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
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
	res := s.db.WithContext(ctx).Raw(claimRunSQL, lease.Microseconds(), runID, maxAttempts).Scan(&r)
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
	res = s.db.WithContext(ctx).Raw(claimStateSQL, runID).Scan(&cur)
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
// failed) and its findings, in one statement. It writes nothing and returns
// false when that attempt no longer owns the run (another delivery took it
// over, its lease ran out, or it already finished): findings are written
// once.
func (s *RunStore) Finish(ctx context.Context, runID string, attempt int, status string, findings []Finding) (bool, error) {
	fs, err := findingsJSON(findings)
	if err != nil {
		return false, fmt.Errorf("finish run %s: %w", runID, err)
	}
	ended, err := s.endRun(ctx, finishRunSQL, status, fs, runID, attempt)
	if err != nil {
		return false, fmt.Errorf("finish run %s: %w", runID, err)
	}
	return ended, nil
}

// The statements that end runs (sql/finish_run.sql, fail_run.sql,
// fail_attempt.sql, finish_unclaimed.sql), and the claim's. Each that ends
// runs does, in the same statement as the final state (so all commit or
// none does): the run leaves unfinished_runs, and a delivery of its
// validation_run.finished event is recorded for each endpoint of its
// organisation that subscribes to it (the outbox; ON CONFLICT keeps an
// event once; for an organisation without endpoints it costs one index
// probe). The endpoints are read FOR KEY SHARE (the lock the foreign key's
// check takes anyway), so an endpoint deleted at that moment is left out
// instead of failing the run's final write. Each returns what endedRun
// reads of the runs it ended.
var (
	claimRunSQL        = statement("claim_run")
	claimStateSQL      = statement("claim_state")
	finishRunSQL       = statement("finish_run")
	failRunSQL         = statement("fail_run")
	finishUnclaimedSQL = statement("finish_unclaimed")
	readBacklogSQL     = statement("read_backlog")
)

// endRun runs end, a statement that ends at most one run, and tells the
// end observer about it; ended says whether it ended a run.
func (s *RunStore) endRun(ctx context.Context, end string, args ...any) (bool, error) {
	var ended []endedRun
	err := s.db.WithContext(ctx).Raw(end, args...).Scan(&ended).Error
	if err != nil {
		return false, translate(err)
	}
	s.observeEnded(ended)
	return len(ended) == 1, nil
}

// endedRun is a run a statement ended.
type endedRun struct {
	ID      string
	Status  string
	Seconds float64
}

// SetEndObserver makes the store tell f about each run one of its
// statements ended: the run's final status and the time from its start
// (created_at) to its final state (finished_at). Every statement that ends
// runs reports them, each run once (only the statement that ended it
// returns it). Set it before the store is used; nil: nobody is told.
func (s *RunStore) SetEndObserver(f func(status string, startToFinal time.Duration)) { s.ended = f }

func (s *RunStore) observeEnded(runs []endedRun) {
	if s.ended == nil {
		return
	}
	for _, r := range runs {
		s.ended(r.Status, time.Duration(r.Seconds*float64(time.Second)))
	}
}

// findingsJSON is the findings column's value: what the columns of a
// finding could hold before (a finding about a huge submission must not
// make the run impossible to finish), as a JSON array.
func findingsJSON(findings []Finding) (string, error) {
	out := make([]Finding, len(findings))
	for i, f := range findings {
		f.Step = truncate(f.Step, 200)
		f.Path = truncate(f.Path, 2000)
		f.Message = truncate(f.Message, 4000)
		out[i] = f
	}
	b, err := json.Marshal(out)
	return string(b), err
}

// Outcome is the end of a run that no delivery claimed: it was validated
// straight from the queue (see FinishUnclaimed).
type Outcome struct {
	RunID string
	// Status is passed, failed or error (with Error).
	Status   string
	Findings []Finding
	Error    string
	// StartedAt is when its validation began.
	StartedAt time.Time
}

// FinishUnclaimed ends queued runs with their outcomes, in one statement:
// the fast path of a run, written once, from queued to final, without a
// claim. A run that is no longer queued (a delivery claimed it, or it
// finished) is left alone: the returned set holds the runs this call ended.
func (s *RunStore) FinishUnclaimed(ctx context.Context, outs []Outcome) (map[string]bool, error) {
	n := len(outs)
	ids, statuses, fss, errs := make([]pgtype.UUID, n), make([]string, n), make([]string, n), make([]*string, n)
	started := make([]time.Time, n)
	for i, o := range outs {
		fs, err := findingsJSON(o.Findings)
		if err != nil {
			return nil, fmt.Errorf("finish runs: %w", err)
		}
		ids[i], statuses[i], fss[i], started[i] = uuidArg(o.RunID), o.Status, fs, o.StartedAt
		if o.Status == RunError {
			e := truncate(o.Error, 2000)
			errs[i] = &e
		}
	}
	ended := make(map[string]bool, n)
	var runs []endedRun
	// Prepared once per connection, and planned with sequential scans off
	// (for its own implicit transaction): a plan made while the table was
	// nearly empty would scan it whole (no index of runs holds status), and
	// a cached one would keep doing so as the table grows, while planning
	// it at each execution costs PostgreSQL about as much as running it
	// (the backlog drain's CPU per run grew half again with it).
	err := withConn(ctx, s.db, func(c *pgx.Conn) error {
		q := startPipe(ctx, c, !optionsOf(s.db).TransactionPooler)
		err := q.query(`SELECT set_config('enable_seqscan', 'off', true)`, nil, func(pgx.Rows) error { return nil }, false)
		if err == nil {
			err = q.query(finishUnclaimedSQL, []any{ids, statuses, fss, errs, started}, func(rows pgx.Rows) error {
				for rows.Next() {
					var r endedRun
					if err := rows.Scan(&r.ID, &r.Status, &r.Seconds); err != nil {
						return err
					}
					ended[r.ID] = true
					runs = append(runs, r)
				}
				return rows.Err()
			}, false)
		}
		return q.sync(err)
	})
	if err != nil {
		return nil, fmt.Errorf("finish runs: %w", translate(err))
	}
	s.observeEnded(runs)
	return ended, nil
}

// QueuedRun is what executing a run needs, besides its workflow's rules.
type QueuedRun struct {
	ID, WorkflowID       string
	Submission, Metadata JSON
	CreatedAt            time.Time
	// OrgID and RunShare (the organisation's own share of the queue; nil:
	// the default) are what the queue's fair admission needs.
	OrgID    string
	RunShare *int
	// RequestID is the id of the request that started the run, and Trace
	// its W3C trace context (traceparent, tracestate; nil when not traced):
	// the queue carries both to the run's execution, for its logs and spans.
	// Trace is no column: GORM, which scans Queued's row into this struct,
	// cannot map a map (it logged "failed to parse field: Trace" each time).
	RequestID string
	Trace     map[string]string `gorm:"-"`
}

// Queued reads what executing a run needs; ErrNotFound if there is no run.
func (s *RunStore) Queued(ctx context.Context, runID string) (*QueuedRun, error) {
	var r QueuedRun
	res := s.db.WithContext(ctx).Raw(`SELECT id, workflow_id, submission, metadata, created_at FROM validation_runs WHERE id = ?`, runID).Scan(&r)
	if res.Error != nil {
		return nil, fmt.Errorf("run %s: %w", runID, translate(res.Error))
	}
	if res.RowsAffected == 0 {
		return nil, fmt.Errorf("run %s: %w", runID, ErrNotFound)
	}
	return &r, nil
}

// Rules reads a workflow's schema and assertions, whoever owns it (the
// worker's read: a workflow never changes once created).
func (s *RunStore) Rules(ctx context.Context, workflowID string) (schema, assertions JSON, err error) {
	var w struct{ Schema, Assertions JSON }
	res := s.db.WithContext(ctx).Raw(`SELECT schema, assertions FROM workflows WHERE id = ?`, workflowID).Scan(&w)
	if res.Error != nil {
		return nil, nil, fmt.Errorf("workflow %s: %w", workflowID, translate(res.Error))
	}
	if res.RowsAffected == 0 {
		return nil, nil, fmt.Errorf("workflow %s: %w", workflowID, ErrNotFound)
	}
	return w.Schema, w.Assertions, nil
}

// Fail ends a run that no delivery holds (it is queued, or its lease has
// run out) with status error and the reason: its task failed for good
// before it could claim the run, or the run was started too many times.
// A run that finished, or that a live delivery holds, is left alone (that
// delivery ends it); ended says whether this call ended it.
func (s *RunStore) Fail(ctx context.Context, runID, reason string) (ended bool, err error) {
	reason = truncate(reason, 2000)
	ended, err = s.endRun(ctx, failRunSQL, reason, runID)
	if err != nil {
		return false, fmt.Errorf("fail run %s: %w", runID, err)
	}
	return ended, nil
}

// Backlog is what is not final yet: how many runs, and how long ago the
// oldest of them was started.
type Backlog struct {
	// Unfinished counts the runs listed in unfinished_runs; a run that
	// ended by a statement that missed the list (one sent by a valruns
	// older than migration 0010) counts until the sweeper's next pass.
	Unfinished int64
	// Oldest is the age of the oldest run queued or running (0: none).
	Oldest time.Duration
}

// ReadBacklog reads the backlog in one statement: a count of the narrow
// unfinished_runs, and its smallest id (UUIDv7: the oldest) whose run is
// still queued or running, read in id order, with its row's created_at.
// For the metrics, read on a timer, never per scrape.
func (s *RunStore) ReadBacklog(ctx context.Context) (Backlog, error) {
	var b struct {
		Unfinished int64
		Seconds    float64
	}
	err := s.db.WithContext(ctx).Raw(readBacklogSQL).Scan(&b).Error
	if err != nil {
		return Backlog{}, fmt.Errorf("read the backlog: %w", translate(err))
	}
	return Backlog{Unfinished: b.Unfinished, Oldest: time.Duration(b.Seconds * float64(time.Second))}, nil
}
