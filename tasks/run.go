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

// errLeaseHeld: another delivery of the run is executing it; retry after its
// lease, so a run whose worker died is taken over then.
var errLeaseHeld = errors.New("run leased by another worker")

// RunExecutor handles TypeRunExecute. It is idempotent by itself: a run that
// already finished is not executed again, a run held by a live worker is
// retried later, and a run whose worker died (lease expired) is taken over.
type RunExecutor struct {
	runs  *models.RunStore
	lease time.Duration
	log   *slog.Logger
	m     *metrics

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
	switch {
	case errors.Is(err, models.ErrRunFinished):
		e.log.InfoContext(ctx, "run already finished; not executing it again", "run_id", p.RunID)
		return nil
	case errors.Is(err, models.ErrNotFound):
		e.log.WarnContext(ctx, "run does not exist", "run_id", p.RunID)
		return nil
	case errors.Is(err, models.ErrRunLeased):
		return fmt.Errorf("run %s: %w", p.RunID, errLeaseHeld)
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
		rows[i] = models.Finding{Step: f.Step, Severity: f.Severity, Path: f.Path, Message: truncate(f.Message, 4000)}
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

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
