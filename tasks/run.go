package tasks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"go.opentelemetry.io/otel/trace"

	"github.com/valruns/valruns/internal/telemetry"
	"github.com/valruns/valruns/models"
	"github.com/valruns/valruns/validate"
)

// RunExecutor handles TypeRunExecute. It is idempotent by itself: a run that
// already finished is not executed again, and a run another delivery holds
// is left to that delivery. A delivery holds a run by a short lease that it
// renews (heartbeats) while it executes; if its worker dies, the lease runs
// out within RunLease and the sweeper re-enqueues the run, whose next
// delivery takes it over. The attempt number fences every write, so
// findings are written once, by one attempt.
type RunExecutor struct {
	runs *models.RunStore
	// lease is how long a claim or a heartbeat holds the run; heartbeat is
	// how often the lease is renewed while the run executes.
	lease, heartbeat time.Duration
	// maxAttempts is how often a run may be started (RUN_MAX_RETRY + 1).
	maxAttempts int
	// timeout bounds one execution (the task's asynq Timeout).
	timeout time.Duration
	log     *slog.Logger
	m       *metrics
	// beforeRun, when set (tests), is called with the execution's context
	// just before the run is validated: it stands in for a long validation.
	beforeRun func(ctx context.Context, runID string)
	// ended, when set, is told that this worker ended a run (the webhook
	// sender looks for the run's event at once, the API's long-polls for
	// its state).
	ended func()
	// dequeued, when set (tests), is told the runs of each task as soon as
	// its handler begins, in the order asynq hands tasks out.
	dequeued func(runIDs []string)
	// tracer traces each execution; nil: tracing is off.
	tracer trace.Tracer

	// programs caches compiled workflows: a workflow never changes once created.
	programs sync.Map // workflow id -> *validate.Program

	// fastBudget is how long a first delivery validates its run without
	// claiming it (0: always claim first); fin writes those outcomes.
	fastBudget time.Duration
	fin        *finisher
	// done, when set, is told the runs of a batch task it processed (the
	// sweeper's index of batch tasks forgets them).
	done func(ctx context.Context, runs []RunPayload)
	// queue enqueues the runs a batch hands back as tasks of their own.
	queue queueWriter
	// release, when set, is told the runs of an organisation that left the
	// queue (settled): the gate lets the organisation's next runs in.
	release func(ctx context.Context, org string, ids []string, cost time.Duration)

	// inflight holds the cancel function of each execution under way, so
	// that a shutdown can hand them back (handBack); stopping is set then.
	mu       sync.Mutex
	inflight map[*execution]struct{}
	stopping bool
}

// execution is one run being validated by this worker.
type execution struct{ cancel context.CancelCauseFunc }

var (
	// errLeaseLost is the cause of an execution's context ending because its
	// delivery lost the run's lease (or could not renew it in time).
	errLeaseLost = errors.New("the run's lease was lost")
	// errHandedBack is returned by an execution the worker stopped because
	// it is shutting down: its lease is released first, so asynq's retry (or
	// any delivery) claims the run at once. It is not a failure of the run.
	errHandedBack = errors.New("the worker is shutting down; run handed back")
)

// notAFailure reports whether a task's error is no fault of the task:
// asynq retries it after about RetryDelay without spending a retry. A
// validation the worker lost the time for (it was stopped or starved of
// CPU: validate.ErrWorkerStalled) is the worker's fault, not the
// submission's: the run is retried, and Claim's attempt limit still bounds
// how often.
func notAFailure(err error) bool {
	return models.IsTransient(err) || errors.Is(err, errHandedBack) || errors.Is(err, validate.ErrWorkerStalled)
}

// ProcessTask executes one run. A first delivery validates the run
// straight from the queue, without claiming it, and writes its outcome once,
// from queued to final (the fast path: one write per run). A validation
// that takes longer than fastBudget, a redelivery, and anything the fast
// path cannot decide, executes under a claim: a lease the delivery renews,
// so a worker that dies mid-run is noticed and its run taken over.
func (e *RunExecutor) ProcessTask(ctx context.Context, t *asynq.Task) (err error) {
	var p RunPayload
	if err := json.Unmarshal(t.Payload(), &p); err != nil || p.RunID == "" {
		return fmt.Errorf("bad payload %q: %w", t.Payload(), asynq.SkipRetry)
	}
	if e.dequeued != nil {
		e.dequeued([]string{p.RunID})
	}
	ctx = telemetry.WithRequestID(ctx, p.RequestID)
	if e.tracer != nil {
		var end func(error)
		ctx, end = e.traceExecution(ctx, t.Headers(), p)
		defer func() { end(err) }()
	}
	tctx, began := ctx, time.Now()
	defer func() {
		if settled(tctx, err) {
			e.settle(tctx, p.OrgID, []string{p.RunID}, time.Since(began))
		}
	}()
	// RUN_TIMEOUT is the worker's own, whatever timeout the task was
	// enqueued with (asynq's deadline, when sooner, still applies).
	ctx, cancel := context.WithTimeout(ctx, e.timeout)
	defer cancel()
	e.m.picked(p)
	if !p.Redelivery && e.fastBudget > 0 {
		if done, err := e.fast(ctx, p); done {
			return err
		}
	}
	return e.claimed(ctx, p.RunID)
}

// fast is the fast path; done is false when the run must execute under a
// claim instead (nothing was written then).
func (e *RunExecutor) fast(ctx context.Context, p RunPayload) (done bool, err error) {
	out, v := e.compute(ctx, p)
	if v != fastWrite {
		return v == fastNothing, nil
	}
	ended, err := e.fin.finish(out)
	return e.afterWrite(ctx, out, ended, err)
}

// afterWrite is what a fast outcome's write means: done, or not (the run
// goes to the claimed path), or an error asynq retries soon.
func (e *RunExecutor) afterWrite(ctx context.Context, out models.Outcome, ended bool, err error) (done bool, _ error) {
	switch {
	case models.IsTransient(err):
		return true, err // asynq retries it soon, without spending a retry
	case err != nil:
		e.log.WarnContext(ctx, "fast write failed; claiming the run", "run_id", out.RunID, "error", err)
		return false, nil // the claimed path retries it, and sorts out what happened
	case !ended:
		// Not queued: claimed by another delivery (left to it, if it still
		// holds it), finished, or handed back by a worker that stopped (then
		// this delivery claims it).
		return false, nil
	}
	e.countEnded(out.Status)
	return true, nil
}

// What compute found a fast delivery must do.
const (
	fastWrite   = iota // write the outcome
	fastNothing        // nothing: the run does not exist
	fastClaim          // execute the run under a claim
)

// compute validates a run for the fast path, within fastBudget.
func (e *RunExecutor) compute(ctx context.Context, p RunPayload) (models.Outcome, int) {
	out := models.Outcome{RunID: p.RunID}
	q := &models.QueuedRun{ID: p.RunID, WorkflowID: p.WorkflowID, Submission: models.JSON(p.Submission), Metadata: models.JSON(p.Metadata)}
	if p.WorkflowID == "" || p.Submission == nil {
		var err error
		q, err = e.runs.Queued(ctx, p.RunID)
		switch {
		case errors.Is(err, models.ErrNotFound):
			e.log.WarnContext(ctx, "run does not exist", "run_id", p.RunID)
			return out, fastNothing
		case err != nil:
			return out, fastClaim
		}
	}
	prog, err := e.programOf(ctx, q.WorkflowID)
	if err != nil {
		return out, fastClaim
	}
	out.StartedAt = time.Now()
	vctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		findings []validate.Finding
		err      error
	}
	resc := make(chan result, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				resc <- result{err: fmt.Errorf("panic: %v", r)}
			}
		}()
		if e.beforeRun != nil {
			e.beforeRun(vctx, p.RunID)
		}
		f, err := prog.Run(vctx, q.Submission, q.Metadata)
		resc <- result{f, err}
	}()
	budget := time.NewTimer(e.fastBudget)
	defer budget.Stop()
	var res result
	select {
	case res = <-resc:
	case <-budget.C:
		return out, fastClaim // too long to run without a lease: cancelled, claimed, run again
	}
	switch {
	case errors.Is(res.err, validate.ErrLimitExceeded),
		errors.Is(res.err, validate.ErrInvalidSubmission), errors.Is(res.err, validate.ErrInvalidMetadata):
		out.Status, out.Error = models.RunError, res.err.Error()
	case res.err != nil:
		return out, fastClaim
	default:
		out.Status = models.RunPassed
		if validate.Failed(res.findings) {
			out.Status = models.RunFailed
		}
		out.Findings = make([]models.Finding, len(res.findings))
		for i, f := range res.findings {
			out.Findings[i] = models.Finding{Step: f.Step, Severity: f.Severity, Path: f.Path, Message: f.Message}
		}
	}
	return out, fastWrite
}

// ProcessBatch executes the runs of a batch task (TypeRunBatch: the
// hand-off of several runs at once): each is validated by the fast path and
// their outcomes written in one statement. A run the fast path cannot
// decide (its validation outlasts fastBudget, say) goes back to the queue
// as a task of its own, executed under a claim by whichever worker is free,
// and so do the batch's runs not validated yet: runs that long are better
// spread over the workers than run one after another. Every write is
// fenced, so a batch delivered again (its worker died) executes nothing
// twice.
func (e *RunExecutor) ProcessBatch(ctx context.Context, t *asynq.Task) (err error) {
	var b BatchPayload
	if err := json.Unmarshal(t.Payload(), &b); err != nil || len(b.Runs) == 0 {
		return fmt.Errorf("bad payload %q: %w", t.Payload(), asynq.SkipRetry)
	}
	if e.tracer != nil {
		var end func(error)
		ctx, end = e.traceBatch(ctx, t.Headers(), b.Runs)
		defer func() { end(err) }()
	}
	if e.dequeued != nil {
		ids := make([]string, len(b.Runs))
		for i, p := range b.Runs {
			ids[i] = p.RunID
		}
		e.dequeued(ids)
	}
	ctx, cancel := context.WithTimeout(ctx, e.timeout)
	defer cancel()
	began := time.Now()
	var outs []models.Outcome
	var octx []context.Context // each outcome's run's context: its logs name its request
	var apart []string
	for _, p := range b.Runs {
		switch {
		case p.RunID == "":
			continue
		case e.fastBudget <= 0 || len(apart) > 0 || time.Since(began) > batchBudget:
			apart = append(apart, p.RunID)
			continue
		}
		e.m.picked(p)
		rctx := telemetry.WithRequestID(ctx, p.RequestID)
		switch out, v := e.compute(rctx, p); v {
		case fastWrite:
			outs = append(outs, out)
			octx = append(octx, rctx)
		case fastClaim:
			apart = append(apart, p.RunID)
		}
	}
	if len(outs) > 0 {
		ended, err := e.runs.FinishUnclaimed(ctx, outs)
		if models.IsTransient(err) {
			return err // asynq retries the batch soon, without spending a retry
		}
		for i, out := range outs {
			if done, _ := e.afterWrite(octx[i], out, ended[out.RunID], err); !done {
				apart = append(apart, out.RunID)
			}
		}
	}
	settledByOrg := map[string][]string{}
	for _, p := range b.Runs {
		if p.RunID == "" {
			continue
		}
		if slices.Contains(apart, p.RunID) {
			// Still in the queue, as a task of its own.
			if err := e.queue.enqueueOne(ctx, RunPayload{RunID: p.RunID, OrgID: p.OrgID, Redelivery: true,
				RequestID: p.RequestID, Trace: p.Trace}); err != nil {
				return fmt.Errorf("hand run %s back to the queue: %w", p.RunID, err) // asynq retries the batch
			}
			continue
		}
		settledByOrg[p.OrgID] = append(settledByOrg[p.OrgID], p.RunID)
	}
	if e.done != nil {
		e.done(ctx, b.Runs)
	}
	done := len(b.Runs) - len(apart)
	for org, ids := range settledByOrg {
		e.settle(ctx, org, ids, time.Since(began)/time.Duration(max(done, 1)))
	}
	return nil
}

// batchBudget is how long a batch task validates its runs one after
// another: the runs left then go back to the queue as tasks of their own,
// behind whatever other organisations queued meanwhile, and spread over
// the workers.
const batchBudget = 100 * time.Millisecond

// settled reports whether a run task's delivery that returned err leaves
// the queue: asynq will not retry it.
func settled(ctx context.Context, err error) bool {
	return err == nil || errors.Is(err, asynq.SkipRetry) || lastTry(ctx, err)
}

// settle tells the gate that runs of org left the queue, and how long each
// took.
func (e *RunExecutor) settle(ctx context.Context, org string, ids []string, cost time.Duration) {
	if e.release != nil && org != "" {
		e.release(ctx, org, ids, cost)
	}
}

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
	e.countEnded(status)
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
		e.countEnded(models.RunError)
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
		e.countEnded(models.RunError)
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

// lastTry reports whether asynq will not retry the task after err. A
// transient database error never ends a run: asynq does not count it as a
// failure, and if the task is archived anyway, the sweeper re-enqueues the
// run. Nor does a run handed back at shutdown, or a task whose context
// asynq cancelled (it gave up waiting at shutdown, or lost the task's own
// lease in Redis). Outside an asynq server (a direct call) nothing is the
// last try.
func lastTry(ctx context.Context, err error) bool {
	if notAFailure(err) || ctx.Err() != nil {
		return false
	}
	retried, ok := asynq.GetRetryCount(ctx)
	maxRetry, ok2 := asynq.GetMaxRetry(ctx)
	return ok && ok2 && retried >= maxRetry
}

// detached is a short context for writes that must happen even when the
// task's context is cancelled (shutdown) or past its deadline.
// countEnded counts a run this worker ended with status, and says so.
func (e *RunExecutor) countEnded(status string) {
	e.m.runsEnded.WithLabelValues(status).Inc()
	if e.ended != nil {
		e.ended()
	}
}

func detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
}

func (e *RunExecutor) program(run *models.ClaimedRun) (*validate.Program, error) {
	return e.compile(run.WorkflowID, run.Schema, run.Assertions)
}

// programOf is the workflow's program, read from the database when this
// worker has not compiled it yet.
func (e *RunExecutor) programOf(ctx context.Context, workflowID string) (*validate.Program, error) {
	if p, ok := e.programs.Load(workflowID); ok {
		return p.(*validate.Program), nil
	}
	schema, assertions, err := e.runs.Rules(ctx, workflowID)
	if err != nil {
		return nil, err
	}
	return e.compile(workflowID, schema, assertions)
}

func (e *RunExecutor) compile(workflowID string, schema, rawAssertions models.JSON) (*validate.Program, error) {
	if p, ok := e.programs.Load(workflowID); ok {
		return p.(*validate.Program), nil
	}
	var assertions []validate.Assertion
	if len(rawAssertions) > 0 {
		if err := json.Unmarshal(rawAssertions, &assertions); err != nil {
			return nil, err
		}
	}
	p, _, err := validate.Compile(json.RawMessage(schema), assertions)
	if err != nil {
		return nil, err
	}
	e.programs.Store(workflowID, p)
	return p, nil
}
