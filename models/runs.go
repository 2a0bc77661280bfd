package models

import (
	"context"
	"fmt"
	"time"

	"gorm.io/gorm"
)

// RunStore reads and writes validation runs.
type RunStore struct{ db *gorm.DB }

// NewRunStore returns a RunStore on db.
func NewRunStore(db *gorm.DB) *RunStore { return &RunStore{db: db} }

// StartParams is what starting a run needs.
type StartParams struct {
	OrgID, WorkflowID string
	Submission        []byte
	// Metadata is a JSON object; nil is {}.
	Metadata []byte
	// IdempotencyKeyID links the run to the key row the request will write ("" = none).
	IdempotencyKeyID string
	// Quota is the organisation's effective monthly quota; 0 means unlimited.
	Quota int64
	// Audit is recorded with the run.
	TokenID, RequestID string
	// JobName and TaskIDPrefix name the staged job that will execute the run.
	JobName, TaskIDPrefix string
	// Now decides the usage period (the calendar month, UTC).
	Now time.Time
}

// The staged job that executes a run: its name is the asynq task type, and
// its TaskID is the prefix plus the run id, so a run is queued at most once.
const (
	RunJobName      = "validation_run:execute"
	RunTaskIDPrefix = "validation_run:"
)

// StagedJobsChannel is the LISTEN/NOTIFY channel a start signals after
// staging a job, so the enqueuer wakes at once instead of at its next poll.
const StagedJobsChannel = "valruns_staged_jobs"

// Start creates a queued run on tx in one statement: the usage counter is
// bumped (refused past the quota), then the run, its audit record and its
// staged job are inserted and the enqueuer is notified. One statement is one
// round trip, and if the quota refuses, nothing else is written, so the
// caller can answer 429 on the same transaction. The usage counter row is the
// hottest lock in the system: it is taken by this last statement of the
// request's work and held only until the commit that follows.
// Returns ErrQuotaExceeded past the quota.
func (s *RunStore) Start(tx *gorm.DB, p StartParams) (*ValidationRun, error) {
	meta := p.Metadata
	if len(meta) == 0 {
		meta = []byte("{}")
	}
	var keyID *string
	if p.IdempotencyKeyID != "" {
		keyID = &p.IdempotencyKeyID
	}
	period := time.Date(p.Now.UTC().Year(), p.Now.UTC().Month(), 1, 0, 0, 0, 0, time.UTC)
	var run ValidationRun
	res := tx.Raw(`
WITH usage AS (
	INSERT INTO usage_counters AS u (org_id, period, runs) VALUES (@org, @period, 1)
	ON CONFLICT (org_id, period) DO UPDATE SET runs = u.runs + 1, updated_at = now()
	WHERE @quota = 0 OR u.runs < @quota
	RETURNING runs
), run AS (
	INSERT INTO validation_runs (org_id, workflow_id, status, submission, metadata, idempotency_key_id)
	SELECT @org, @workflow, 'queued', CAST(@submission AS jsonb), CAST(@metadata AS jsonb), CAST(@key AS uuid) FROM usage
	RETURNING *
), audit AS (
	INSERT INTO audit_records (org_id, action, subject_type, subject_id, token_id, request_id, data)
	SELECT @org, 'validation_run.start', 'validation_run', run.id, CAST(@token AS uuid), @request,
	       jsonb_build_object('workflow_id', run.workflow_id, 'idempotency_key_id', run.idempotency_key_id)
	FROM run
), job AS (
	INSERT INTO staged_jobs (job_name, job_args, task_id)
	SELECT @job, jsonb_build_object('run_id', run.id), @task_prefix || run.id FROM run
)
SELECT run.*, pg_notify(@channel, '') AS notified FROM run`,
		map[string]any{
			"org": p.OrgID, "period": period, "quota": p.Quota, "workflow": p.WorkflowID,
			"submission": string(p.Submission), "metadata": string(meta), "key": keyID,
			"token": nullable(p.TokenID), "request": p.RequestID,
			"job": p.JobName, "task_prefix": p.TaskIDPrefix, "channel": StagedJobsChannel,
		}).Scan(&run)
	if res.Error != nil {
		return nil, fmt.Errorf("start run: %w", translate(res.Error))
	}
	if res.RowsAffected == 0 {
		return nil, fmt.Errorf("start run: %w", ErrQuotaExceeded)
	}
	return &run, nil
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// Get reads one run of the organisation with its findings.
func (s *RunStore) Get(ctx context.Context, orgID, id string) (*ValidationRun, error) {
	var r ValidationRun
	err := s.db.WithContext(ctx).
		Preload("Findings", func(db *gorm.DB) *gorm.DB { return db.Order("position") }).
		Where("id = ? AND org_id = ?", id, orgID).Take(&r).Error
	if err != nil {
		return nil, fmt.Errorf("run %s: %w", id, translate(err))
	}
	return &r, nil
}

// List returns one page of the organisation's runs, newest first, optionally
// of one workflow, and the cursor of the next page.
func (s *RunStore) List(ctx context.Context, orgID, workflowID string, p Page) ([]ValidationRun, string, error) {
	q := s.db.WithContext(ctx).Where("org_id = ?", orgID)
	if workflowID != "" {
		q = q.Where("workflow_id = ?", workflowID)
	}
	rs, next, err := listPage(q, p, func(r *ValidationRun) (time.Time, string) { return r.CreatedAt, r.ID })
	if err != nil {
		return nil, "", fmt.Errorf("list runs: %w", err)
	}
	return rs, next, nil
}
