package models

import (
	"database/sql/driver"
	"errors"
	"time"
)

// JSON is raw JSON stored in a jsonb column; nil or empty is SQL NULL.
type JSON []byte

// Value sends the JSON as text, which PostgreSQL parses into jsonb.
func (j JSON) Value() (driver.Value, error) {
	if len(j) == 0 {
		return nil, nil
	}
	return string(j), nil
}

// Scan reads a jsonb (or NULL) column.
func (j *JSON) Scan(src any) error {
	switch v := src.(type) {
	case nil:
		*j = nil
	case []byte:
		*j = append((*j)[:0], v...)
	case string:
		*j = JSON(v)
	default:
		return errors.New("models.JSON: unsupported type")
	}
	return nil
}

// MarshalJSON writes the raw JSON (null when empty).
func (j JSON) MarshalJSON() ([]byte, error) {
	if len(j) == 0 {
		return []byte("null"), nil
	}
	return j, nil
}

// Organization is a tenant: every other row belongs to one.
type Organization struct {
	ID   string `gorm:"primaryKey;type:uuid;default:gen_random_uuid()"`
	Name string
	Slug string
	// MonthlyRunQuota overrides DEFAULT_MONTHLY_RUN_QUOTA; nil means the default, 0 unlimited.
	MonthlyRunQuota *int64
	// StartRate overrides ORG_START_RATE (starts per second); nil means the default, 0 unlimited.
	StartRate *int
	// RunShare overrides ORG_RUN_SHARE (runs in the queue at once); nil means the default, 0 unlimited.
	RunShare  *int
	CreatedAt time.Time `gorm:"default:now()"`
}

// APIToken authenticates requests for one organisation. Only the SHA-256
// of the token is stored.
type APIToken struct {
	ID        string `gorm:"primaryKey;type:uuid;default:gen_random_uuid()"`
	OrgID     string
	TokenHash []byte
	Display   string
	CreatedAt time.Time `gorm:"default:now()"`
	RevokedAt *time.Time
}

// Workflow is a named set of validation rules.
type Workflow struct {
	ID         string `gorm:"primaryKey;type:uuid;default:gen_random_uuid()"`
	OrgID      string
	Name       string
	Schema     JSON      `gorm:"type:jsonb"`
	Assertions JSON      `gorm:"type:jsonb"`
	CreatedAt  time.Time `gorm:"default:now()"`
}

// Run statuses. A run goes queued -> running -> passed | failed, or error
// when the worker itself failed after its retries.
const (
	RunQueued  = "queued"
	RunRunning = "running"
	RunPassed  = "passed"
	RunFailed  = "failed"
	RunError   = "error"
)

// ValidationRun is one execution of a workflow over a submission.
type ValidationRun struct {
	ID             string `gorm:"primaryKey;type:uuid;default:gen_random_uuid()"`
	OrgID          string
	WorkflowID     string
	Status         string
	Submission     JSON `gorm:"type:json"`
	Metadata       JSON `gorm:"type:json"`
	Attempts       int
	LeaseExpiresAt *time.Time
	Error          *string
	CreatedAt      time.Time
	StartedAt      *time.Time
	FinishedAt     *time.Time
	// Findings is the JSON array of the run's findings ([]Finding), once
	// it has finished; NULL before.
	Findings JSON `gorm:"type:json"`
	// Who started the run, for the audit trail: the API token, the
	// request's X-Request-Id and the Idempotency-Key (nil without one).
	TokenID        *string
	RequestID      *string
	IdempotencyKey *string
}

// Final reports whether the run has ended: passed, failed or error. A
// final run never changes again.
func (r *ValidationRun) Final() bool {
	return r.Status == RunPassed || r.Status == RunFailed || r.Status == RunError
}

// Finding is one problem a run found in its submission, as stored in the
// run's findings column.
type Finding struct {
	Step     string `json:"step"`
	Severity string `json:"severity"`
	Path     string `json:"path"`
	Message  string `json:"message"`
}

// AuditRecord notes who did what: the audit_records view over the runs
// (migration 0004), one record per run started.
type AuditRecord struct {
	OrgID       string
	Action      string
	SubjectType string
	SubjectID   string
	TokenID     *string
	RequestID   *string
	Data        JSON `gorm:"type:json"`
	CreatedAt   time.Time
}
