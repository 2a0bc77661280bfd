package tasks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/hibiken/asynq"

	"github.com/valruns/valruns/models"
	"github.com/valruns/valruns/validate"
)

// RunExecutor handles TypeRunExecute. It is idempotent by itself: a run that
// already finished is not executed again, and a run another delivery holds
// is looked at again when that delivery's lease expires (a takeover task),
// so a run whose worker died is taken over then, and finished once.
type RunExecutor struct {
	runs  *models.RunStore
	lease time.Duration
	log   *slog.Logger
	m     *metrics
	// takeover schedules a new delivery of the run at a time (see leased).
	takeover func(ctx context.Context, runID string, attempt int, at time.Time) error

	// programs caches compiled workflows: a workflow never changes once created.
	programs sync.Map // workflow id -> *validate.Program
}

// ProcessTask executes one run.
func (e *RunExecutor) ProcessTask(ctx context.Context, t *asynq.Task) error {
	var p RunPayload
	if err := json.Unmarshal(t.Payload(), &p); err != nil || p.RunID == "" {
		return fmt.Errorf("bad payload %q: %w", t.Payload(), asynq.SkipRetry)
	}
	run, err := e.runs.Claim(ctx, p.RunID, e.lease)
	var leased *models.RunLeasedError
	switch {
	case errors.As(err, &leased):
		return e.leased(ctx, leased)
	case errors.Is(err, models.ErrRunFinished):
		e.log.InfoContext(ctx, "run already finished; not executing it again", "run_id", p.RunID)
		return nil
	case errors.Is(err, models.ErrNotFound):
		e.log.WarnContext(ctx, "run does not exist", "run_id", p.RunID)
		return nil
	case err != nil:
		return err
	}
	prog, err := e.program(run)
	if err != nil {
		// The workflow was compiled when created; failing now cannot heal.
		return fmt.Errorf("compile workflow %s: %v: %w", run.WorkflowID, err, asynq.SkipRetry)
	}
	findings, err := prog.Run(ctx, run.Submission, run.Metadata)
	if err != nil {
		return fmt.Errorf("run %s: %w", run.ID, err)
	}
	status := models.RunPassed
	if validate.Failed(findings) {
		status = models.RunFailed
	}
	rows := make([]models.Finding, len(findings))
	for i, f := range findings {
		rows[i] = models.Finding{Step: f.Step, Severity: f.Severity, Path: f.Path, Message: f.Message}
	}
	owned, err := e.runs.Finish(ctx, run.ID, run.Attempts, status, rows)
	if err != nil {
		return err
	}
	if !owned {
		e.log.WarnContext(ctx, "run was taken over by another delivery; result discarded", "run_id", run.ID, "attempt", run.Attempts)
		return nil
	}
	e.m.runsEnded.WithLabelValues(status).Inc()
	e.log.InfoContext(ctx, "run finished", "run_id", run.ID, "status", status, "findings", len(findings), "attempt", run.Attempts)
	return nil
}

// leased handles a delivery of a run that another delivery holds (a
// duplicate, or the recovery of a task whose worker died before its run's
// lease ran out). Rather than failing, which would spend asynq retries and
// could archive the task while the run is still running, it schedules a
// takeover delivery just after the lease expires, with a TaskID of its own
// per attempt, and is done. If the holder finishes, the takeover finds the
// run finished and does nothing; if it died, the takeover claims the run.
func (e *RunExecutor) leased(ctx context.Context, l *models.RunLeasedError) error {
	at := l.Until.Add(time.Second)
	if err := e.takeover(ctx, l.RunID, l.Attempts, at); err != nil {
		return fmt.Errorf("schedule takeover of run %s: %w", l.RunID, err)
	}
	e.log.InfoContext(ctx, "run held by another delivery; takeover scheduled at its lease's end",
		"run_id", l.RunID, "attempt", l.Attempts, "at", at)
	return nil
}

func (e *RunExecutor) program(run *models.ClaimedRun) (*validate.Program, error) {
	if p, ok := e.programs.Load(run.WorkflowID); ok {
		return p.(*validate.Program), nil
	}
	var assertions []validate.Assertion
	if len(run.Assertions) > 0 {
		if err := json.Unmarshal(run.Assertions, &assertions); err != nil {
			return nil, err
		}
	}
	p, _, err := validate.Compile(json.RawMessage(run.Schema), assertions)
	if err != nil {
		return nil, err
	}
	e.programs.Store(run.WorkflowID, p)
	return p, nil
}

// failed is told about every failed execution; when asynq will not retry
// again, the run ends in status error with the reason.
func (e *RunExecutor) failed(ctx context.Context, t *asynq.Task, err error) {
	retried, _ := asynq.GetRetryCount(ctx)
	maxRetry, _ := asynq.GetMaxRetry(ctx)
	if retried < maxRetry && !errors.Is(err, asynq.SkipRetry) {
		return
	}
	var p RunPayload
	if json.Unmarshal(t.Payload(), &p) != nil || p.RunID == "" {
		return
	}
	// Not the task's context: it may be cancelled or past its deadline.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if ferr := e.runs.Fail(fctx, p.RunID, fmt.Sprintf("gave up after %d attempts: %v", retried+1, err)); ferr != nil {
		e.log.ErrorContext(ctx, "could not mark run as error", "run_id", p.RunID, "error", ferr)
		return
	}
	e.m.runsEnded.WithLabelValues(models.RunError).Inc()
	e.log.ErrorContext(ctx, "run ended in error", "run_id", p.RunID, "error", err)
}
