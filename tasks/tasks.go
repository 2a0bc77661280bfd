// Package tasks is the background side of valruns: the dispatcher that
// hands committed runs to Redis right after their start (through the
// fair-share gate, onto one ready list), the worker that takes them from
// that list and executes them, asynq for what must wait (a failed
// attempt's retry, the periodic cleanup), the webhook sender, and the
// sweeper that hands on the runs Redis lost or whose worker died:
// PostgreSQL, not Redis, is what says a run still has to be executed.
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
	// TypeRunExecute is a run's retry, due after a delay: its task pushes
	// the run back onto ready.
	TypeRunExecute = models.RunJobName
	// TypeCleanup deletes expired idempotency keys.
	TypeCleanup = "idempotency:cleanup"
)

// RunPayload is a run handed to the workers: the payload of a hand-off
// item and of a retry's task (TypeRunExecute).
type RunPayload struct {
	RunID string `json:"run_id"`
	// Redelivery: the sweeper sent it (the run was lost, or its worker
	// died); it is executed under a claim, never by the fast path.
	Redelivery bool `json:"redelivery,omitempty"`
	// Redeliveries counts the sweeper's redeliveries of the run.
	Redeliveries int `json:"redeliveries,omitempty"`
	// Retries counts the retries of the run after its failures
	// (RUN_MAX_RETRY bounds it); Rescheduled counts every retry scheduled,
	// those after the worker's own trouble too (it names the retry's task).
	Retries     int `json:"retries,omitempty"`
	Rescheduled int `json:"rescheduled,omitempty"`
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
	// (traceparent, tracestate): the parent of the run's hand-off span, and
	// of its execution when the hand-off carried none. Nil when not traced.
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

// retryTaskOptions are the options of a retry's task, which only pushes
// its run back onto ready (asynq retries the push while Redis fails it).
// No retention: a task that completed leaves Redis at once.
func retryTaskOptions(timeout time.Duration) []asynq.Option {
	return []asynq.Option{asynq.MaxRetry(retryPushRetries), asynq.Timeout(min(timeout, time.Minute))}
}

// retryPushRetries is how often asynq retries a retry's push.
const retryPushRetries = 10

// retryTaskID is the TaskID of a run's n-th retry scheduled.
func retryTaskID(runID string, n int) string {
	return fmt.Sprintf("%s%s:retry:%d", models.RunTaskIDPrefix, runID, n)
}

// TypeRunBatch carried several runs in one task in earlier versions; the
// worker still pushes the runs of such a task, left in Redis by an
// upgrade, onto ready.
const TypeRunBatch = "validation_run:batch"

// BatchPayload is the payload of TypeRunBatch.
type BatchPayload struct {
	Runs []RunPayload `json:"runs"`
}
