package tasks

import (
	"context"

	"github.com/hibiken/asynq"

	"github.com/valruns/valruns/models"
)

// SetBeforeRun makes w's run executor call f with the execution's context
// just before it validates a run: it stands in for a validation that takes
// long (and stops when its context ends).
func SetBeforeRun(w *Worker, f func(ctx context.Context, runID string)) { w.runs.beforeRun = f }

// NewRunTask is the task executing runID, as the hand-off (or, with
// redelivery, the sweeper) enqueues it, without its data inline: the
// worker reads the run.
func NewRunTask(runID string, redelivery bool) *asynq.Task {
	t, err := newRunTask(RunPayload{RunID: runID, Redelivery: redelivery}, nil)
	if err != nil {
		panic(err)
	}
	return t
}

// RunTaskID is the TaskID of a run's n-th delivery (0: the hand-off's).
func RunTaskID(runID string, n int) string { return runTaskID(runID, n) }

// TaskKey is where asynq keeps the task taskID of the default queue.
func TaskKey(taskID string) string { return taskKey(taskID) }

// SendBatch hands runs off as one batch task, as the dispatcher does when
// several wait.
func SendBatch(d *Dispatcher, runs []*models.QueuedRun) { d.sendBatch(runs) }

// BatchIndexKey is the Redis hash from a run to its batch task.
const BatchIndexKey = batchIndexKey

// NewRunTaskFor is the task the hand-off makes for q (its data inline).
func NewRunTaskFor(q *models.QueuedRun) *asynq.Task {
	t, err := newRunTask(RunPayload{RunID: q.ID}, q)
	if err != nil {
		panic(err)
	}
	return t
}

// NewBatchTaskFor is the batch task the hand-off makes for qs.
func NewBatchTaskFor(qs []*models.QueuedRun) *asynq.Task {
	t, err := newBatchTask(qs)
	if err != nil {
		panic(err)
	}
	return t
}
