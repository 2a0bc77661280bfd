package tasks

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/valruns/valruns/internal/telemetry"
	"github.com/valruns/valruns/models"
)

// localLane executes, in a single-node process (serve --worker), a run
// that process just committed, at once and without the queue, when one of
// its slots is free. The lane has slots of its own: the runs already in the
// queue keep the task server's, so they wait no longer for it (bar the CPU
// it takes); a new run that finds no slot free goes to the queue.
//
// Only the fast path runs here (validated from what the start carried, the
// outcome written once). A run it cannot decide (a validation longer than
// RUN_FAST_PATH, a write that failed) goes to the queue as a redelivery,
// executed under a claim like any other; if even that fails, it is still
// queued in PostgreSQL, where the sweeper finds it. Nothing is lost.
//
// The same slots execute the runs the lane pops from the direct hand-off's
// list (fetch, direct.go): runs another API process (or this one, its
// slots full) committed and the gate let in.
type localLane struct {
	runs *RunExecutor
	// queue takes the runs the lane hands over.
	queue func(ctx context.Context, p RunPayload) error
	slots chan struct{}
	done  *prometheus.CounterVec
	// direct counts the runs popped from the direct hand-off's list, as
	// done counts the lane's own.
	direct *prometheus.CounterVec

	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

func newLocalLane(runs *RunExecutor, slots int, queue func(context.Context, RunPayload) error, reg prometheus.Registerer) *localLane {
	l := &localLane{runs: runs, queue: queue, slots: make(chan struct{}, max(slots, 1)),
		done: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "valruns_runs_local_total",
			Help: "Runs a single-node process (serve --worker) executed at once, in the process that started them, without the queue, by result (finished; queued: the fast path could not decide the run, which went to the queue).",
		}, []string{"result"}),
		direct: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "valruns_runs_direct_total",
			Help: "Runs this worker took from the direct hand-off (a Redis list its idle slots wait on, filled by the API processes as the gate lets runs in) and executed at once, by result (finished; queued: the fast path could not decide the run, which went to the queue).",
		}, []string{"result"}),
		closed: true}
	for _, r := range []string{"finished", "queued"} {
		l.done.WithLabelValues(r)
		l.direct.WithLabelValues(r)
	}
	reg.MustRegister(l.done, l.direct)
	return l
}

// take executes r here if a slot is free, and reports whether it did.
func (l *localLane) take(r *models.QueuedRun) bool {
	if l.runs.fastBudget <= 0 {
		return false
	}
	select {
	case l.slots <- struct{}{}:
	default:
		return false
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		<-l.slots
		return false
	}
	l.wg.Add(1)
	l.mu.Unlock()
	go func() {
		defer l.wg.Done()
		defer func() { <-l.slots }()
		l.execute(directItem{Run: payloadOf(r)}, false)
	}()
	return true
}

// execute runs the fast path for it, or hands it to the queue. A run from
// the direct hand-off (direct), which the gate let in, is released from
// the gate once final.
func (l *localLane) execute(it directItem, direct bool) {
	count := l.done
	if direct {
		count = l.direct
	}
	p := it.Run
	ctx := telemetry.WithRequestID(context.Background(), p.RequestID)
	var err error
	e := l.runs
	if e.tracer != nil {
		var end func(error)
		ctx, end = e.traceExecution(ctx, it.Headers, p)
		defer func() { end(err) }()
	}
	if e.dequeued != nil {
		e.dequeued([]string{p.RunID})
	}
	began := time.Now()
	ctx, cancel := context.WithTimeout(ctx, e.timeout)
	defer cancel()
	e.m.picked(p)
	done, err := e.fast(ctx, p)
	if done && err == nil {
		count.WithLabelValues("finished").Inc()
		if direct {
			e.settle(ctx, p.OrgID, []string{p.RunID}, time.Since(began))
		}
		return
	}
	count.WithLabelValues("queued").Inc()
	p.Redelivery = true
	qctx, qcancel := detached(ctx)
	defer qcancel()
	if err = l.queue(qctx, p); err != nil {
		l.runs.log.WarnContext(ctx, "could not hand a run to the queue; the sweeper will", "run_id", p.RunID, "error", err)
	}
}

// open lets the lane take runs; close stops it and waits, up to timeout,
// for the runs it took.
func (l *localLane) open() {
	l.mu.Lock()
	l.closed = false
	l.mu.Unlock()
}

func (l *localLane) close(timeout time.Duration) {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	idle := make(chan struct{})
	go func() {
		l.wg.Wait()
		close(idle)
	}()
	select {
	case <-idle:
	case <-time.After(timeout):
	}
}
