package models

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
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

// StagedJobsChannel is the LISTEN/NOTIFY channel that wakes the enqueuers
// when jobs were staged. It is signalled after the request's commit, never
// inside it (see JobWaker): PostgreSQL serialises the commits of every
// transaction that notified, cluster-wide.
const StagedJobsChannel = "valruns_staged_jobs"

// runColumns are the columns of a ValidationRun a start returns (scanRun).
const runColumns = `id, org_id, workflow_id, status, submission, metadata, idempotency_key_id, attempts,
	lease_expires_at, error, created_at, started_at, finished_at`

func scanRun(row pgx.Row, r *ValidationRun) error {
	return row.Scan(&r.ID, &r.OrgID, &r.WorkflowID, &r.Status, &r.Submission, &r.Metadata, &r.IdempotencyKeyID,
		&r.Attempts, &r.LeaseExpiresAt, &r.Error, &r.CreatedAt, &r.StartedAt, &r.FinishedAt)
}

// insertRun is the CTE that writes a run, its audit record and its staged
// job, once per row of bump (the claimed usage slot): no slot, nothing
// written. Its parameters: org, workflow, submission, metadata, key id,
// token id, request id, job name, task id prefix (placeholders given).
func insertRun(org, workflow, submission, metadata, key, token, request, job, prefix string) string {
	return `
run AS (
	INSERT INTO validation_runs (org_id, workflow_id, status, submission, metadata, idempotency_key_id)
	SELECT ` + org + `, ` + workflow + `, 'queued', CAST(` + submission + ` AS jsonb), CAST(` + metadata + ` AS jsonb), CAST(` + key + ` AS uuid) FROM bump
	RETURNING ` + runColumns + `
), audit AS (
	INSERT INTO audit_records (org_id, action, subject_type, subject_id, token_id, request_id, data)
	SELECT ` + org + `, 'validation_run.start', 'validation_run', run.id, CAST(` + token + ` AS uuid), ` + request + `,
	       jsonb_build_object('workflow_id', run.workflow_id, 'idempotency_key_id', run.idempotency_key_id)
	FROM run
), job AS (
	INSERT INTO staged_jobs (job_name, job_args, task_id)
	SELECT ` + job + `, jsonb_build_object('run_id', run.id), ` + prefix + ` || run.id FROM run
)`
}

// startFastSQL claims a slot without waiting and inserts the run, in one
// statement (see claimSlotFast): $1 workflow, $2 org, $3 period, $4 quota,
// $5 slot offset, $6 slots, then insertRun's.
var startFastSQL = `WITH ` + claimSlotFast + `, ` +
	insertRun("$2", "$1", "$7", "$8", "$9", "$10", "$11", "$12", "$13") + ` SELECT ` + runColumns + ` FROM run`

// startSlowSQL inserts the run once the slow path has claimed its slot.
var startSlowSQL = `WITH bump AS (SELECT 1), ` +
	insertRun("$1", "$2", "$3", "$4", "$5", "$6", "$7", "$8", "$9") + ` SELECT ` + runColumns + ` FROM run`

// Start creates a queued run of the organisation's workflow on tx, billed
// to its usage of the period: a usage slot is bumped (refused past the
// quota), and the run, its audit record and its staged job are inserted.
//
// Nearly always this is one statement, one round trip, that takes no lock
// another start of the organisation needs: it claims a usage slot that no
// other transaction holds (FOR UPDATE SKIP LOCKED, see migration 0002) and
// checks the workflow in the same statement. Only when no slot could be
// claimed that way (an unknown workflow, a new month, a changed quota, the
// quota's edge, or more starts of one organisation in flight than slots)
// does it take the slow path, which may wait for other starts and
// rebalance the slots. If the quota refuses, nothing is written, so the
// caller can answer 429 on the same transaction.
//
// Returns ErrNotFound when the workflow is not the organisation's, and
// ErrQuotaExceeded past the quota.
func (s *RunStore) Start(tx *RequestTx, p StartParams) (*ValidationRun, error) {
	meta := p.Metadata
	if len(meta) == 0 {
		meta = []byte("{}")
	}
	var keyID *string
	if p.IdempotencyKeyID != "" {
		keyID = &p.IdempotencyKeyID
	}
	period := UsagePeriod(p.Now)
	insertArgs := []any{string(p.Submission), string(meta), keyID, nullable(p.TokenID), p.RequestID, p.JobName, p.TaskIDPrefix}
	ctx := tx.Context()
	var run ValidationRun
	found := false
	err := tx.pgx(func(c *pgx.Conn) error {
		args := append([]any{p.WorkflowID, p.OrgID, period, p.Quota, slotOffset(), UsageSlots}, insertArgs...)
		err := scanRun(c.QueryRow(ctx, startFastSQL, args...), &run)
		found = err == nil
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("start run: %w", translate(err))
	}
	if found {
		return &run, nil
	}

	// The slow path.
	db := tx.DB()
	var n int64
	if err := db.Raw(`SELECT count(*) FROM workflows WHERE id = ? AND org_id = ?`, p.WorkflowID, p.OrgID).Scan(&n).Error; err != nil {
		return nil, fmt.Errorf("start run: %w", translate(err))
	}
	if n == 0 {
		return nil, fmt.Errorf("start run: workflow %s: %w", p.WorkflowID, ErrNotFound)
	}
	if err := claimSlot(db, p.OrgID, period, p.Quota); err != nil {
		return nil, fmt.Errorf("start run: %w", err)
	}
	err = tx.pgx(func(c *pgx.Conn) error {
		return scanRun(c.QueryRow(ctx, startSlowSQL, append([]any{p.OrgID, p.WorkflowID}, insertArgs...)...), &run)
	})
	if err != nil {
		return nil, fmt.Errorf("start run: %w", translate(err))
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
