package models

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"gorm.io/gorm"
)

// RunStore reads and writes validation runs.
type RunStore struct {
	db      *gorm.DB
	batcher *startBatcher
}

// NewRunStore returns a RunStore on db.
func NewRunStore(db *gorm.DB) *RunStore {
	return &RunStore{db: db, batcher: &startBatcher{db: db, timeout: 30 * time.Second}}
}

// SetStartTimeout bounds each statement of the start's fast path (the
// request transaction's IDEMPOTENCY_TX_TIMEOUT); 0 keeps 30s.
func (s *RunStore) SetStartTimeout(d time.Duration) {
	if d > 0 {
		s.batcher.timeout = d
	}
}

// StartParams is what starting a run needs. The run's id and creation time
// are made by the caller (NewRunID, NewRunTime), so that its answer can be
// rendered before it is written.
type StartParams struct {
	ID                string
	CreatedAt         time.Time
	OrgID, WorkflowID string
	// Submission is JSON text; Metadata a JSON object, nil is {}.
	Submission, Metadata []byte
	// Quota is the organisation's effective monthly quota; 0 means unlimited.
	// The usage period is CreatedAt's month (UTC).
	Quota int64
	// Who started it, for the audit trail (the audit_records view).
	TokenID, RequestID, IdempotencyKey string
}

// The asynq task that executes a run: its type, and the prefix of its
// TaskID (the prefix plus the run id: a run is handed to the queue once).
const (
	RunJobName      = "validation_run:execute"
	RunTaskIDPrefix = "validation_run:"
)

// startSlowSQL inserts the run once the slow path has claimed its slot.
const startSlowSQL = `
INSERT INTO validation_runs (id, org_id, workflow_id, status, submission, metadata, created_at,
	token_id, request_id, idempotency_key)
VALUES ($1, $2, $3, 'queued', CAST($4 AS json), CAST($5 AS json), $6, $7, $8, $9)`

// Start creates the queued run p on tx, billed to its usage of the period:
// the slow path of a start, for what the fast path (StartOne) leaves to a
// transaction. It checks the workflow, claims a usage slot, waiting for
// other starts and rebalancing the slots if need be (refused past the
// quota), and inserts the run. If it refuses, nothing is written, so the
// caller can answer 404 or 429 on the same transaction.
//
// Returns ErrNotFound when the workflow is not the organisation's, and
// ErrQuotaExceeded past the quota.
func (s *RunStore) Start(tx *RequestTx, p StartParams) error {
	meta := p.Metadata
	if len(meta) == 0 {
		meta = []byte("{}")
	}
	db := tx.DB()
	var n int64
	if err := db.Raw(`SELECT count(*) FROM workflows WHERE id = ? AND org_id = ?`, p.WorkflowID, p.OrgID).Scan(&n).Error; err != nil {
		return fmt.Errorf("start run: %w", translate(err))
	}
	if n == 0 {
		return fmt.Errorf("start run: workflow %s: %w", p.WorkflowID, ErrNotFound)
	}
	if err := claimSlot(db, p.OrgID, UsagePeriod(p.CreatedAt), p.Quota); err != nil {
		return fmt.Errorf("start run: %w", err)
	}
	ctx := tx.Context()
	err := tx.pgx(func(c *pgx.Conn) error {
		_, err := c.Exec(ctx, startSlowSQL, p.ID, p.OrgID, p.WorkflowID, string(p.Submission), string(meta), p.CreatedAt,
			nullable(p.TokenID), nullable(truncate(p.RequestID, 200)), nullable(p.IdempotencyKey))
		return err
	})
	if err != nil {
		return fmt.Errorf("start run: %w", translate(err))
	}
	return nil
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
	err := s.db.WithContext(ctx).Where("id = ? AND org_id = ?", id, orgID).Take(&r).Error
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
