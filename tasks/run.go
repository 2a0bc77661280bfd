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
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"

	"github.com/valruns/valruns/internal/telemetry"
	"github.com/valruns/valruns/models"
	"github.com/valruns/valruns/validate"
)

// RunExecutor executes the runs a worker takes. It is idempotent by itself: a run that
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
	// ended, when set, is told that this worker ended a run, after its
	// final commit (the webhook sender looks for the run's event at once,
	// the API's long-polls answer it).
	ended func(runID string)
	// dequeued, when set (tests), is told the run of each delivery as soon
	// as it begins, in the order the taker took them.
	dequeued func(runIDs []string)
	// tracer traces each execution; nil: tracing is off.
	tracer trace.Tracer

	// programs caches compiled workflows: a workflow never changes once created.
	programs sync.Map // workflow id -> *validate.Program

	// fastBudget is how long a first delivery validates its run without
	// claiming it (0: always claim first); fin writes those outcomes.
	fastBudget time.Duration
	fin        *finisher
	// queue schedules retries and pushes the runs due back onto ready.
	queue queueWriter
	// retryBase is RUN_RETRY_DELAY: the delay before a first retry.
	retryBase time.Duration
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

// run executes one run a taker took (the one entry of every delivery). A
// first delivery validates the run straight from the hand-off, without
// claiming it, and writes its outcome once, from queued to final (the fast
// path: one write per run). A validation that takes longer than
// fastBudget, a redelivery, and anything the fast path cannot decide,
// executes under a claim: a lease the delivery renews, so a worker that
// dies mid-run is noticed and its run taken over. A failed attempt is
// retried after a delay (scheduleRetry). It returns true when the worker
// is stopping and the run goes back to ready. computed is called once a
// fast outcome is computed, before its write: the slot goes to the next run.
func (e *RunExecutor) run(it handoffItem, computed func()) (handBack bool) {
	p := it.Run
	if e.dequeued != nil {
		e.dequeued([]string{p.RunID})
	}
	ctx := telemetry.WithRequestID(context.Background(), p.RequestID)
	var err error
	if e.tracer != nil {
		var end func(error)
		ctx, end = e.traceExecution(ctx, it.Headers, p)
		defer func() { end(err) }()
	}
	ctx = withTries(ctx, p.Retries, e.maxAttempts-1)
	began := time.Now()
	err = e.attempt(ctx, p, computed)
	if err != nil && !errors.Is(err, errHandedBack) {
		e.m.failed.WithLabelValues(TypeRunExecute).Inc()
	}
	switch {
	case errors.Is(err, errHandedBack):
		return true
	case settled(ctx, err):
		if err == nil {
			e.m.processed.WithLabelValues(TypeRunExecute).Inc()
		}
		e.settle(ctx, p.OrgID, []string{p.RunID}, time.Since(began))
	default:
		e.retry(ctx, p, err)
	}
	return false
}

// attempt is one delivery of p: the fast path, else under a claim.
func (e *RunExecutor) attempt(ctx context.Context, p RunPayload, computed func()) error {
	// RUN_TIMEOUT bounds one attempt.
	ctx, cancel := context.WithTimeout(ctx, e.timeout)
	defer cancel()
	e.m.picked(p)
	if !p.Redelivery && e.fastBudget > 0 {
		if done, err := e.fast(ctx, p, computed); done {
			return err
		}
	}
	return e.claimed(ctx, p.RunID)
}

// retry schedules p's next attempt after a failed one (err): a failure of
// the run counts as a retry, the worker's own trouble (a transient database
// error, a stall) does not. Failing, the run is still queued, and the
// sweeper hands it on.
func (e *RunExecutor) retry(ctx context.Context, p RunPayload, err error) {
	n := p.Retries
	delay := retryDelay(e.retryBase, n, err)
	if !notAFailure(err) {
		p.Retries++
	}
	p.Rescheduled++
	p.Redelivery = true
	e.log.WarnContext(ctx, "run attempt failed; retried later", "run_id", p.RunID, "error", err,
		"counts_as_retry", !notAFailure(err), "retry_in", delay)
	rctx, cancel := detached(ctx)
	defer cancel()
	if serr := e.queue.scheduleRetry(rctx, p, delay); serr != nil {
		e.log.WarnContext(ctx, "could not schedule a run's retry; the sweeper will hand it on", "run_id", p.RunID, "error", serr)
	}
}

// ProcessTask handles TypeRunExecute, a retry that is due (or a run task an
// earlier version left in Redis): it pushes the run back onto ready,
// through the gate, where it keeps its place.
func (e *RunExecutor) ProcessTask(ctx context.Context, t *asynq.Task) error {
	var p RunPayload
	if err := json.Unmarshal(t.Payload(), &p); err != nil || p.RunID == "" {
		return fmt.Errorf("bad payload %q: %w", t.Payload(), asynq.SkipRetry)
	}
	if err := e.queue.send(ctx, admission{org: p.OrgID, recorded: true, in: []RunPayload{p}}); err != nil {
		return err
	}
	if id, ok := asynq.GetTaskID(ctx); ok {
		// Only this retry's entry: a later retry of the run may have been
		// scheduled meanwhile.
		_ = forgetRetryScript.Run(ctx, e.queue.redis, []string{retryIndex}, p.RunID, id).Err()
	}
	return nil
}

// forgetRetryScript removes run ARGV[1] from the retry index KEYS[1] if
// its entry is task ARGV[2].
var forgetRetryScript = redis.NewScript(`
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0
`)

// ProcessBatch handles TypeRunBatch, a task of several runs an earlier
// version left in Redis: it pushes them onto ready, through the gate.
func (e *RunExecutor) ProcessBatch(ctx context.Context, t *asynq.Task) error {
	var b BatchPayload
	if err := json.Unmarshal(t.Payload(), &b); err != nil {
		return fmt.Errorf("bad payload %q: %w", t.Payload(), asynq.SkipRetry)
	}
	byOrg := map[string][]RunPayload{}
	for _, p := range b.Runs {
		if p.RunID != "" {
			byOrg[p.OrgID] = append(byOrg[p.OrgID], p)
		}
	}
	for org, runs := range byOrg {
		if err := e.queue.send(ctx, admission{org: org, recorded: true, in: runs}); err != nil {
			return err
		}
	}
	return nil
}

// fast is the fast path; done is false when the run must execute under a
// claim instead (nothing was written then).
func (e *RunExecutor) fast(ctx context.Context, p RunPayload, computed func()) (done bool, err error) {
	out, v := e.compute(ctx, p)
	if v != fastWrite {
		return v == fastNothing, nil
	}
	computed()
	ended, err := e.fin.finish(ctx, out)
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
	e.countEnded(out.RunID, out.Status)
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

// settled reports whether a delivery that returned err leaves the queue:
// no retry follows.
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

// lastTry reports whether no retry follows err: the run's retries are
// spent. A transient database error, a run handed back at shutdown or a
// stall never ends a run (they do not count as retries), nor does an
// attempt whose context ended. Outside a delivery (a direct call) nothing
// is the last try.
func lastTry(ctx context.Context, err error) bool {
	if notAFailure(err) || ctx.Err() != nil {
		return false
	}
	t, ok := ctx.Value(triesKey{}).(tries)
	return ok && t.n >= t.max
}

// tries is how often a delivery's run was retried (n) and may be (max).
type tries struct{ n, max int }

type triesKey struct{}

func withTries(ctx context.Context, n, max int) context.Context {
	return context.WithValue(ctx, triesKey{}, tries{n, max})
}

// detached is a short context for writes that must happen even when the
// task's context is cancelled (shutdown) or past its deadline.
// countEnded counts a run this worker ended with status, and says so.
func (e *RunExecutor) countEnded(runID, status string) {
	e.m.runsEnded.WithLabelValues(status).Inc()
	if e.ended != nil {
		e.ended(runID)
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
