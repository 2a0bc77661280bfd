// Package tasks is the background side of valruns, on asynq: the task types
// and their handlers (executing a validation run, deleting expired
// idempotency keys), the mux, the periodic cleanup, the dispatcher that
// hands committed runs to Redis right after their start, and the sweeper
// that re-enqueues the runs Redis lost or whose worker died: PostgreSQL,
// not Redis, is what says a run still has to be executed.
package tasks

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/hibiken/asynq"

	"github.com/valruns/valruns/models"
)

// Task types.
const (
	// TypeRunExecute validates one run's submission.
	TypeRunExecute = models.RunJobName
	// TypeCleanup deletes expired idempotency keys.
	TypeCleanup = "idempotency:cleanup"
)

// RunPayload is the payload of TypeRunExecute.
type RunPayload struct {
	RunID string `json:"run_id"`
	// Redelivery: the sweeper sent it (the run was lost, or its worker
	// died); it is executed under a claim, never by the fast path.
	Redelivery bool `json:"redelivery,omitempty"`
	// Redeliveries numbers a redelivery's TaskID (runTaskID).
	Redeliveries int `json:"redeliveries,omitempty"`
	// OrgID is the run's organisation: the queue admits runs by it (gate).
	OrgID string `json:"org_id,omitempty"`
	// What executing the run needs, carried when small (inlineMax), so the
	// worker does not read the run back: its workflow, submission and
	// metadata as written.
	WorkflowID string          `json:"workflow_id,omitempty"`
	Submission json.RawMessage `json:"submission,omitempty"`
	Metadata   json.RawMessage `json:"metadata,omitempty"`
	CreatedAt  time.Time       `json:"created_at,omitzero"`
	// RequestID is the id of the request that started the run (its
	// execution's logs name it), and Trace that request's W3C trace context
	// (traceparent, tracestate): the parent of the run's enqueue, or a link
	// of the batch task that executes it. Trace is nil when not traced.
	RequestID string            `json:"request_id,omitempty"`
	Trace     map[string]string `json:"trace,omitempty"`
}

// inlineMax is the largest submission plus metadata a task carries.
const inlineMax = 8 << 10

// payloadOf is the task payload of a run handed off: what executing it
// needs, carried when small enough.
func payloadOf(q *models.QueuedRun) RunPayload {
	p := RunPayload{RunID: q.ID, OrgID: q.OrgID, CreatedAt: q.CreatedAt, RequestID: q.RequestID, Trace: q.Trace}
	if len(q.Submission)+len(q.Metadata) <= inlineMax {
		p.WorkflowID, p.Submission, p.Metadata = q.WorkflowID, json.RawMessage(q.Submission), json.RawMessage(q.Metadata)
	}
	return p
}

// newRunTask builds the task executing a run; headers (asynq's task
// headers) carry the trace context of its enqueue, nil when not traced.
func newRunTask(p RunPayload, headers map[string]string) (*asynq.Task, error) {
	b, err := json.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("run task: %w", err)
	}
	if headers != nil {
		return asynq.NewTaskWithHeaders(TypeRunExecute, b, headers), nil
	}
	return asynq.NewTask(TypeRunExecute, b), nil
}

// runTaskOptions are the options of every run task. No retention: a task
// that completed leaves Redis at once.
func runTaskOptions(maxRetry int, timeout time.Duration) []asynq.Option {
	return []asynq.Option{asynq.MaxRetry(maxRetry), asynq.Timeout(timeout)}
}

// TypeRunBatch executes several runs handed off together (BatchPayload):
// one task, one dequeue and one final statement for all of them.
const TypeRunBatch = "validation_run:batch"

// BatchPayload is the payload of TypeRunBatch: each run as a single task
// would carry it.
type BatchPayload struct {
	Runs []RunPayload `json:"runs"`
}

// batchIndexKey is the Redis hash from a run's id to the batch task that
// carries it, while it waits: the sweeper reads it to know whether a queued
// run's task still exists, the worker forgets the runs of a batch it
// processed.
const batchIndexKey = "valruns:run_batch_task"

// batchTaskID is the TaskID of the batch task carrying runs.
func batchTaskID(runs []RunPayload) string { return "validation_runs:" + runs[0].RunID }

// newBatchTask builds the task executing runs, each carried as a single
// task would carry it.
func newBatchTask(runs []RunPayload, headers map[string]string) (*asynq.Task, error) {
	p, err := json.Marshal(BatchPayload{Runs: runs})
	if err != nil {
		return nil, fmt.Errorf("batch task: %w", err)
	}
	if headers != nil {
		return asynq.NewTaskWithHeaders(TypeRunBatch, p, headers), nil
	}
	return asynq.NewTask(TypeRunBatch, p), nil
}
