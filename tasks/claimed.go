package tasks

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hibiken/asynq"

	"github.com/valruns/valruns/models"
	"github.com/valruns/valruns/validate"
)

// The claimed path: a run validated under a lease its delivery renews, so
// that a worker that dies mid-run is noticed and its run taken over.

// claimed executes a run under a claim.
func (e *RunExecutor) claimed(ctx context.Context, runID string) error {
	p := RunPayload{RunID: runID}
	run, err := e.runs.Claim(ctx, p.RunID, e.lease, e.maxAttempts)
	var leased *models.RunLeasedError
	switch {
	case errors.As(err, &leased):
		// That delivery renews its lease while it works; if it dies, the
		// sweeper re-enqueues the run when the lease runs out.
		e.log.InfoContext(ctx, "run held by another delivery; leaving it to that one",
			"run_id", p.RunID, "attempt", leased.Attempts)
		return nil
	case errors.Is(err, models.ErrRunFinished):
		e.log.InfoContext(ctx, "run already finished; not executing it again", "run_id", p.RunID)
		return nil
	case errors.Is(err, models.ErrNotFound):
		e.log.WarnContext(ctx, "run does not exist", "run_id", p.RunID)
		return nil
	case errors.Is(err, models.ErrAttemptsExhausted):
		e.endUnheld(ctx, p.RunID, fmt.Sprintf("gave up: the run was started %d times without finishing "+
			"(its executions failed, or their workers stopped or lost their lease)", e.maxAttempts))
		return nil
	case err != nil:
		e.failedBeforeClaim(ctx, p.RunID, err)
		return err
	}
	e.log.InfoContext(ctx, "run claimed", "run_id", run.ID, "attempt", run.Attempts)
	err = e.safeExecute(ctx, run)
	if err != nil {
		e.failed(ctx, run, err)
	}
	return err
}

// safeExecute is execute with a panic turned into an error, so that the
// run's lease is released (or the run ended) like after any other failure.
func (e *RunExecutor) safeExecute(ctx context.Context, run *models.ClaimedRun) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("run %s: panic: %v", run.ID, p)
		}
	}()
	return e.execute(ctx, run)
}

// execute validates a claimed run while heartbeating its lease, and
// finishes it. A nil error means the run needs nothing more from this
// delivery: it finished, ended in error, or another delivery owns it.
func (e *RunExecutor) execute(ctx context.Context, run *models.ClaimedRun) error {
	prog, err := e.program(run)
	if err != nil {
		// The workflow was compiled when created; failing now cannot heal.
		return fmt.Errorf("compile workflow %s: %v: %w", run.WorkflowID, err, asynq.SkipRetry)
	}
	xctx, stopHeartbeat := e.hold(ctx, run)
	defer stopHeartbeat() // after a panic; a no-op after the call below
	if e.beforeRun != nil {
		e.beforeRun(xctx, run.ID)
	}
	findings, err := prog.Run(xctx, run.Submission, run.Metadata)
	stopped := stopHeartbeat()
	switch {
	case errors.Is(stopped, errHandedBack):
		return fmt.Errorf("run %s: %w", run.ID, errHandedBack)
	case stopped != nil:
		e.m.leasesLost.Inc()
		e.log.WarnContext(ctx, "lease lost while executing; execution stopped, the run is left to the delivery that holds it",
			"run_id", run.ID, "attempt", run.Attempts)
		return nil
	case errors.Is(err, validate.ErrLimitExceeded):
		e.end(ctx, run, err.Error())
		return nil
	case errors.Is(err, validate.ErrWorkerStalled):
		e.log.WarnContext(ctx, "the worker lost the time of a validation; the run is retried",
			"run_id", run.ID, "attempt", run.Attempts, "error", err)
		return fmt.Errorf("run %s: %w", run.ID, err)
	case errors.Is(err, validate.ErrInvalidSubmission), errors.Is(err, validate.ErrInvalidMetadata):
		return fmt.Errorf("run %s: %w: %w", run.ID, err, asynq.SkipRetry)
	case err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded):
		e.end(ctx, run, fmt.Sprintf("the run took longer than its time limit (%s)", e.timeout))
		return nil
	case err != nil:
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
		e.m.leasesLost.Inc()
		e.log.WarnContext(ctx, "run was taken over by another delivery; result discarded", "run_id", run.ID, "attempt", run.Attempts)
		return nil
	}
	e.countEnded(run.ID, status)
	e.log.InfoContext(ctx, "run finished", "run_id", run.ID, "status", status, "findings", len(findings), "attempt", run.Attempts)
	return nil
}

// hold renews the run's lease every heartbeat while the run executes. The
// returned context ends when the lease is lost: another delivery took the
// run over, or no renewal succeeded for a whole lease (the run may be taken
// over at any moment, so the work stops); or when the worker hands the run
// back at shutdown. stop ends the heartbeat and returns errLeaseLost or
// errHandedBack if either ended the execution, else nil.
func (e *RunExecutor) hold(ctx context.Context, run *models.ClaimedRun) (context.Context, func() error) {
	xctx, cancel := context.WithCancelCause(ctx)
	x := &execution{cancel: cancel}
	e.mu.Lock()
	if e.inflight == nil {
		e.inflight = map[*execution]struct{}{}
	}
	e.inflight[x] = struct{}{}
	if e.stopping {
		cancel(errHandedBack)
	}
	e.mu.Unlock()
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(e.heartbeat)
		defer tick.Stop()
		renewed := time.Now() // the claim
		for {
			select {
			case <-done:
				return
			case <-xctx.Done():
				return
			case <-tick.C:
			}
			hctx, hcancel := context.WithTimeout(xctx, e.heartbeat)
			owned, err := e.runs.Heartbeat(hctx, run.ID, run.Attempts, e.lease)
			hcancel()
			switch {
			case xctx.Err() != nil: // the execution ended meanwhile
				return
			case err == nil && owned:
				renewed = time.Now()
			case err == nil:
				cancel(errLeaseLost)
				return
			case time.Since(renewed) >= e.lease:
				e.log.WarnContext(ctx, "lease not renewed in time", "run_id", run.ID, "attempt", run.Attempts, "error", err)
				cancel(errLeaseLost)
				return
			default:
				e.log.WarnContext(ctx, "heartbeat failed; retrying", "run_id", run.ID, "attempt", run.Attempts, "error", err)
			}
		}
	}()
	return xctx, sync.OnceValue(func() error {
		close(done)
		wg.Wait()
		e.mu.Lock()
		delete(e.inflight, x)
		e.mu.Unlock()
		var why error
		if cause := context.Cause(xctx); errors.Is(cause, errLeaseLost) || errors.Is(cause, errHandedBack) {
			why = cause
		}
		cancel(nil)
		return why
	})
}

// handBack is the executor's part of a shutdown, once asynq takes no new
// tasks: it lets the executions under way finish for up to timeout, then
// stops the rest (their context ends with errHandedBack, and each releases
// its run's lease before its task goes back to asynq) and waits for them.
func (e *RunExecutor) handBack(timeout time.Duration) {
	e.waitIdle(timeout)
	e.mu.Lock()
	e.stopping = true
	for x := range e.inflight {
		x.cancel(errHandedBack)
	}
	e.mu.Unlock()
	e.waitIdle(10 * time.Second)
}

// waitIdle waits until no execution is under way, for up to timeout.
func (e *RunExecutor) waitIdle(timeout time.Duration) {
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		e.mu.Lock()
		n := len(e.inflight)
		e.mu.Unlock()
		if n == 0 {
			return
		}
	}
}

// end ends the run this delivery holds in status error with the reason.
func (e *RunExecutor) end(ctx context.Context, run *models.ClaimedRun, reason string) {
	fctx, cancel := detached(ctx)
	defer cancel()
	ended, err := e.runs.FailAttempt(fctx, run.ID, run.Attempts, reason)
	switch {
	case err != nil:
		// Its lease runs out and the sweeper re-enqueues it: nothing is lost.
		e.log.ErrorContext(ctx, "could not end run in error", "run_id", run.ID, "error", err)
	case ended:
		e.countEnded(run.ID, models.RunError)
		e.log.WarnContext(ctx, "run ended in error", "run_id", run.ID, "attempt", run.Attempts, "reason", reason)
	}
}

// endUnheld ends a run that no delivery holds in status error.
func (e *RunExecutor) endUnheld(ctx context.Context, runID, reason string) {
	fctx, cancel := detached(ctx)
	defer cancel()
	ended, err := e.runs.Fail(fctx, runID, reason)
	switch {
	case err != nil:
		e.log.ErrorContext(ctx, "could not end run in error", "run_id", runID, "error", err)
	case ended:
		e.countEnded(runID, models.RunError)
		e.log.WarnContext(ctx, "run ended in error", "run_id", runID, "reason", reason)
	}
}

// failed is told about a failed execution of a claimed run. When no retry
// will follow (the failure cannot heal, or it was the last retry), the run
// ends in status error with the reason; otherwise its lease is released, so
// the next delivery claims it at once.
func (e *RunExecutor) failed(ctx context.Context, run *models.ClaimedRun, err error) {
	switch {
	case errors.Is(err, asynq.SkipRetry):
		e.end(ctx, run, err.Error())
	case lastTry(ctx, err), run.Attempts >= e.maxAttempts && !notAFailure(err) && ctx.Err() == nil:
		// The worker's RUN_MAX_RETRY decides too, whatever the task was
		// enqueued with.
		e.end(ctx, run, fmt.Sprintf("gave up after %d attempts: %v", run.Attempts, err))
	default:
		rctx, cancel := detached(ctx)
		defer cancel()
		if rerr := e.runs.Release(rctx, run.ID, run.Attempts); rerr != nil {
			// The lease runs out by itself; the retry or the sweeper takes over then.
			e.log.WarnContext(ctx, "could not release the run's lease", "run_id", run.ID, "error", rerr)
		}
	}
}

// failedBeforeClaim is told about a task that failed before it could claim
// its run; after the last retry, the run ends in error if nobody holds it.
func (e *RunExecutor) failedBeforeClaim(ctx context.Context, runID string, err error) {
	if lastTry(ctx, err) {
		e.endUnheld(ctx, runID, fmt.Sprintf("gave up: its task failed before it could start: %v", err))
	}
}
