package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"net/url"
)

// CreateWorkflowResult is the answer to CreateWorkflow.
type CreateWorkflowResult struct {
	// Workflow is the workflow the call's key created.
	Workflow Workflow
	// Replayed is true when the answer was the stored answer of an earlier
	// request with the same key.
	Replayed bool
	// Key is the Idempotency-Key the call sent on every attempt.
	Key string
	// RequestID is the X-Request-Id of the answer.
	RequestID string
	// OriginalRequestID is, on a replay, the X-Request-Id of the request that
	// created the workflow.
	OriginalRequestID string
	// Attempts is how many requests the call sent.
	Attempts int
}

// CreateWorkflow creates a workflow, idempotently like StartRun: one key
// per call (WithKey to choose it), the same body on every retry. A schema
// or an expression that does not compile is an *Error with status 400 and
// code invalid_workflow, naming it in Errors.
func (c *Client) CreateWorkflow(ctx context.Context, w NewWorkflow, opts ...CreateOption) (*CreateWorkflowResult, error) {
	var o writeOptions
	for _, opt := range opts {
		opt.applyCreate(&o)
	}
	body, err := json.Marshal(w)
	if err != nil {
		return nil, fmt.Errorf("valruns: encode the workflow: %w", err)
	}
	var res CreateWorkflowResult
	resp, err := c.write(ctx, "/api/workflows/", body, o, &res.Workflow)
	if err != nil {
		return nil, err
	}
	res.Replayed, res.Key, res.RequestID, res.OriginalRequestID, res.Attempts = resp.replayed, resp.key, resp.requestID, resp.originalRequestID, resp.attempts
	return &res, nil
}

// GetWorkflow reads a workflow.
func (c *Client) GetWorkflow(ctx context.Context, workflowID string) (*Workflow, error) {
	if workflowID == "" {
		return nil, errors.New("valruns: GetWorkflow: empty workflow id")
	}
	var w Workflow
	if _, err := c.get(ctx, "/api/workflows/"+url.PathEscape(workflowID)+"/", &w); err != nil {
		return nil, err
	}
	return &w, nil
}

// ListWorkflows iterates over the organisation's workflows, newest first,
// fetching pages as the loop goes. Workflows in lists are summaries: their
// Schema and Assertions are nil (GetWorkflow has them). An error ends the
// iteration with (zero Workflow, err).
func (c *Client) ListWorkflows(ctx context.Context, opts ...ListOption) iter.Seq2[Workflow, error] {
	return list[Workflow](ctx, c, "/api/workflows/", url.Values{}, opts)
}
