package tasks

import "context"

// SetBeforeRun makes w's run executor call f with the execution's context
// just before it validates a run: it stands in for a validation that takes
// long (and stops when its context ends).
func SetBeforeRun(w *Worker, f func(ctx context.Context, runID string)) { w.runs.beforeRun = f }
