package client

import (
	"encoding/json"
	"time"
)

// Run statuses. A run goes queued -> running -> passed | failed, or error
// when the worker itself failed after its retries.
const (
	StatusQueued  = "queued"
	StatusRunning = "running"
	StatusPassed  = "passed"
	StatusFailed  = "failed"
	StatusError   = "error"
)

// Run is a validation run as the API shows it (the JSON of GET /api/runs/{id}/).
type Run struct {
	ID         string `json:"id"`
	WorkflowID string `json:"workflow_id"`
	Status     string `json:"status"`
	// Submission and Metadata are nil in list results (ListRuns): GetRun
	// reads them.
	Submission json.RawMessage `json:"submission"`
	Metadata   json.RawMessage `json:"metadata"`
	// Findings are present once the run has finished (not in list results).
	Findings []Finding `json:"findings"`
	// Error says why the worker itself failed (status error).
	Error      *string    `json:"error,omitempty"`
	Attempts   int        `json:"attempts"`
	CreatedAt  time.Time  `json:"created_at"`
	StartedAt  *time.Time `json:"started_at,omitempty"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
	// Raw is the run's JSON exactly as the API sent it, for printing what
	// the API said (the fields above are decoded from it): set by
	// StartRun, GetRun and WaitRun, nil in list results.
	Raw json.RawMessage `json:"-"`
}

// Final reports whether the run has reached a status it never leaves:
// passed, failed or error.
func (r *Run) Final() bool {
	switch r.Status {
	case StatusPassed, StatusFailed, StatusError:
		return true
	}
	return false
}

// Finding is one problem a run found. Step is "schema" or
// "assertion:<name>"; Path is a JSON pointer into the submission for schema
// findings.
type Finding struct {
	Step     string `json:"step"`
	Severity string `json:"severity"`
	Path     string `json:"path"`
	Message  string `json:"message"`
}

// Assertion is a CEL rule of a workflow over `submission` and `metadata`.
type Assertion struct {
	// Name is 1-100 characters, unique within the workflow.
	Name string `json:"name"`
	// Expr is CEL that must evaluate to bool.
	Expr string `json:"expr"`
	// Severity is error (the default when empty), warning or info.
	Severity string `json:"severity,omitempty"`
	// Message is shown when the expression is false.
	Message string `json:"message,omitempty"`
}

// Workflow is a workflow as the API shows it.
type Workflow struct {
	ID   string `json:"id"`
	Name string `json:"name"`
	// Schema and Assertions are nil in list results (ListWorkflows):
	// GetWorkflow reads them.
	Schema     json.RawMessage `json:"schema,omitempty"`
	Assertions []Assertion     `json:"assertions"`
	CreatedAt  time.Time       `json:"created_at"`
}

// NewWorkflow is the body of CreateWorkflow.
type NewWorkflow struct {
	// Name of the workflow, 1-200 characters.
	Name string `json:"name"`
	// Schema is an optional JSON Schema the submission must satisfy.
	Schema json.RawMessage `json:"schema,omitempty"`
	// Assertions are optional CEL rules.
	Assertions []Assertion `json:"assertions,omitempty"`
}

// page is one page of a list answer.
type page[T any] struct {
	Data       []T    `json:"data"`
	NextCursor string `json:"next_cursor,omitempty"`
}
