package handlers

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"
	"gorm.io/gorm"

	"github.com/valruns/valruns/idempotency"
	"github.com/valruns/valruns/models"
	"github.com/valruns/valruns/problem"
)

// RunTaskName and RunTaskIDPrefix name the staged job that executes a run;
// the tasks package handles that task type under the same name.
const (
	RunTaskName     = "validation_run:execute"
	RunTaskIDPrefix = "validation_run:"
)

type runHandlers struct {
	runs         *models.RunStore
	workflows    *models.WorkflowStore
	defaultQuota int64
}

// StartRunRequest is the body of POST /api/workflows/{id}/start/.
type StartRunRequest struct {
	// Submission is the JSON document to validate: any JSON value.
	Submission json.RawMessage `json:"submission" swaggertype:"object"`
	// Metadata is an optional JSON object, visible to CEL assertions as `metadata`.
	Metadata json.RawMessage `json:"metadata,omitempty" swaggertype:"object"`
}

// Finding is one problem a run found.
type Finding struct {
	Step     string `json:"step" example:"schema"`
	Severity string `json:"severity" example:"error" enums:"error,warning,info"`
	Path     string `json:"path" example:"/total"`
	Message  string `json:"message" example:"got string, want number"`
}

// Run is a validation run as the API shows it.
type Run struct {
	ID         string          `json:"id" example:"5b0f6b8e-3f7c-4d2a-9a57-3b2f4c1d0e9a"`
	WorkflowID string          `json:"workflow_id" example:"0b7d3c1e-8a2f-4c55-9a51-0d6f3f1c2b7a"`
	Status     string          `json:"status" example:"queued" enums:"queued,running,passed,failed,error"`
	Submission json.RawMessage `json:"submission" swaggertype:"object"`
	Metadata   json.RawMessage `json:"metadata" swaggertype:"object"`
	// Findings are present once the run has finished.
	Findings []Finding `json:"findings"`
	// Error says why the worker itself failed (status error).
	Error      *string    `json:"error,omitempty"`
	Attempts   int        `json:"attempts" example:"0"`
	CreatedAt  time.Time  `json:"created_at"`
	StartedAt  *time.Time `json:"started_at,omitempty"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
}

// RunList is one page of runs, newest first.
type RunList struct {
	Data       []Run  `json:"data"`
	NextCursor string `json:"next_cursor,omitempty"`
}

func runOf(r *models.ValidationRun) Run {
	out := Run{
		ID: r.ID, WorkflowID: r.WorkflowID, Status: r.Status, Submission: json.RawMessage(r.Submission),
		Metadata: json.RawMessage(r.Metadata), Findings: make([]Finding, 0, len(r.Findings)), Error: r.Error,
		Attempts: r.Attempts, CreatedAt: r.CreatedAt.UTC(), StartedAt: utc(r.StartedAt), FinishedAt: utc(r.FinishedAt),
	}
	for _, f := range r.Findings {
		out.Findings = append(out.Findings, Finding{Step: f.Step, Severity: f.Severity, Path: f.Path, Message: f.Message})
	}
	return out
}

func utc(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

// start godoc
//
//	@Summary		Start a validation run
//	@Description	Creates a queued validation run of the workflow over the submission; a worker executes it. With an Idempotency-Key, retries create exactly one run and bill once.
//	@Tags			runs
//	@Accept			json
//	@Produce		json
//	@Security		BearerAuth
//	@Param			id				path		string			true	"Workflow id (UUID)"
//	@Param			Idempotency-Key	header		string			false	"Optional idempotency key (scope workflow_start)"
//	@Param			body			body		StartRunRequest	true	"The submission"
//	@Success		201				{object}	Run
//	@Router			/api/workflows/{id}/start/ [post]
func (h *runHandlers) start(tx *gorm.DB, req idempotency.Request) (idempotency.Response, error) {
	var in StartRunRequest
	if err := decodeStrict(req.Body, &in); err != nil {
		return idempotency.Problem(req, badRequest(err.Error())), nil
	}
	if in.Submission == nil {
		return idempotency.Problem(req, badRequest("submission is required: the JSON document to validate.",
			problem.FieldError{Field: "submission", Message: "required"})), nil
	}
	if len(in.Metadata) > 0 && in.Metadata[0] != '{' && string(in.Metadata) != "null" {
		return idempotency.Problem(req, badRequest("metadata must be a JSON object.",
			problem.FieldError{Field: "metadata", Message: "must be an object"})), nil
	}
	if string(in.Metadata) == "null" {
		in.Metadata = nil
	}
	p := principalOf(req.Gin)
	wfID := req.Gin.Param("id")
	if !validID(wfID) {
		return idempotency.Problem(req, notFound("Workflow")), nil
	}
	ok, err := h.workflows.Exists(tx, p.OrgID, wfID)
	if err != nil {
		return idempotency.Response{}, err
	}
	if !ok {
		return idempotency.Problem(req, notFound("Workflow")), nil
	}
	quota := h.defaultQuota
	if p.MonthlyRunQuota != nil {
		quota = *p.MonthlyRunQuota
	}
	run, err := h.runs.Start(tx, models.StartParams{
		OrgID: p.OrgID, WorkflowID: wfID, Submission: in.Submission, Metadata: in.Metadata,
		IdempotencyKeyID: req.KeyID, Quota: quota, TokenID: p.TokenID, RequestID: req.RequestID,
		JobName: RunTaskName, TaskIDPrefix: RunTaskIDPrefix, Now: time.Now(),
	})
	if errors.Is(err, models.ErrQuotaExceeded) {
		return idempotency.Problem(req, problem.New(http.StatusTooManyRequests, "quota_exceeded",
			fmt.Sprintf("The organisation has used its monthly quota of %d runs.", quota))), nil
	}
	if err != nil {
		return idempotency.Response{}, err
	}
	resp, err := idempotency.JSON(http.StatusCreated, runOf(run))
	resp.Header.Set("Location", "/api/runs/"+run.ID+"/")
	resp.ValidationRunID = run.ID
	return resp, err
}

// get godoc
//
//	@Summary		Read a run
//	@Description	A run with its status and findings; another organisation's is a 404.
//	@Tags			runs
//	@Produce		json
//	@Security		BearerAuth
//	@Param			id	path		string	true	"Run id (UUID)"
//	@Success		200	{object}	Run
//	@Router			/api/runs/{id}/ [get]
func (h *runHandlers) get(c *gin.Context) {
	id := c.Param("id")
	if !validID(id) {
		problem.Write(c, notFound("Run"))
		return
	}
	r, err := h.runs.Get(c.Request.Context(), principalOf(c).OrgID, id)
	switch {
	case errors.Is(err, models.ErrNotFound):
		problem.Write(c, notFound("Run"))
	case err != nil:
		internalError(c, err)
	default:
		c.JSON(http.StatusOK, runOf(r))
	}
}

// list godoc
//
//	@Summary		List runs
//	@Description	The organisation's runs, newest first, optionally of one workflow, a page at a time (findings are not included; read a run for them).
//	@Tags			runs
//	@Produce		json
//	@Security		BearerAuth
//	@Param			workflow_id	query		string	false	"Only runs of this workflow"
//	@Param			limit		query		int		false	"Page size, 1-100 (default 20)"
//	@Param			cursor		query		string	false	"next_cursor of the previous page"
//	@Success		200			{object}	RunList
//	@Router			/api/runs/ [get]
func (h *runHandlers) list(c *gin.Context) {
	page, ok := pageOf(c)
	if !ok {
		return
	}
	wf := c.Query("workflow_id")
	if wf != "" && !validID(wf) {
		problem.Write(c, badRequest("workflow_id must be a UUID.", problem.FieldError{Field: "workflow_id", Message: "must be a UUID"}))
		return
	}
	rs, next, err := h.runs.List(c.Request.Context(), principalOf(c).OrgID, wf, page)
	if err != nil {
		listFailed(c, err)
		return
	}
	out := RunList{Data: make([]Run, 0, len(rs)), NextCursor: next}
	for i := range rs {
		out.Data = append(out.Data, runOf(&rs[i]))
	}
	c.JSON(http.StatusOK, out)
}
