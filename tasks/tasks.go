// Package tasks is the background side of valruns, on asynq: the task types
// and their handlers (executing a validation run, deleting expired
// idempotency keys), the mux, the periodic cleanup registration, the
// staged-job enqueuer that moves jobs written by request transactions into
// Redis after they commit, and the sweeper that re-enqueues the runs Redis
// lost or whose worker died: PostgreSQL, not Redis, is what says a run still
// has to be executed.
package tasks

import (
	"encoding/json"
	"fmt"

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

// RunPayload is the payload of TypeRunExecute (the staged job's job_args).
type RunPayload struct {
	RunID string `json:"run_id"`
}

// NewRunTask builds the task executing a run, with the TaskID the enqueuer
// uses, so enqueuing it twice yields one task (the sweeper gives its
// redeliveries TaskIDs of their own).
func NewRunTask(runID string) (*asynq.Task, asynq.Option, error) {
	b, err := json.Marshal(RunPayload{RunID: runID})
	if err != nil {
		return nil, nil, fmt.Errorf("run task: %w", err)
	}
	return asynq.NewTask(TypeRunExecute, b), asynq.TaskID(models.RunTaskIDPrefix + runID), nil
}
