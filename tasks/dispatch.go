package tasks

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"

	"github.com/valruns/valruns/internal/telemetry"
	"github.com/valruns/valruns/models"
)

// Dispatcher hands the runs an API process committed to the queue, right
// after their commit: the run row is the outbox, so nothing is staged. A
// run is handed off at most once here, by a few senders behind a bounded
// buffer, and never makes a request wait on Redis. Whatever it cannot hand
// off (Redis is down, the buffer is full, the process dies first) stays
// queued in PostgreSQL, where the worker's sweeper finds it and enqueues
// it after RUN_REDELIVER_AFTER: nothing is lost, it is only later. A
// graceful stop (Shutdown) hands off everything first.
//
// Runs enter the queue through the gate: an organisation past its share
// of the queue (ORG_RUN_SHARE) has its runs wait their turn, in order,
// until its runs in the queue finish.
type Dispatcher struct {
	w queueWriter
	// giveUp is how long a sender keeps trying one run before leaving it
	// to the sweeper.
	giveUp time.Duration
	in     chan *models.QueuedRun
	log    *slog.Logger
	sent   *prometheus.CounterVec
	// queuedAfter observes, per run it enqueued, the time from its start.
	queuedAfter prometheus.Histogram
	wg          sync.WaitGroup
	ctx         context.Context
	cancel      context.CancelFunc

	// mu guards closed: once it is set, HandOff takes no run, so the
	// senders know every run they must hand off is in the buffer or theirs.
	mu     sync.RWMutex
	closed bool
	// closing is closed by Shutdown: a sender ends once the buffer is empty.
	closing chan struct{}
	stop    sync.Once
}

// DispatcherConfig configures a Dispatcher.
type DispatcherConfig struct {
	Redis asynq.RedisConnOpt
	// Task options: like the worker's (RUN_MAX_RETRY, RUN_TIMEOUT).
	MaxRetry int
	Timeout  time.Duration
	// GiveUp: RUN_REDELIVER_AFTER, after which the sweeper takes over.
	GiveUp time.Duration
	// RunShare is ORG_RUN_SHARE: an organisation's share of the queue
	// unless it has its own; 0 means adaptive (gateScript).
	RunShare int
	Registry prometheus.Registerer
	Log      *slog.Logger
	// Tracing, when set, traces each enqueue (the child of the request
	// that started the run) and carries its context in the task's headers;
	// nil: tracing is off.
	Tracing trace.TracerProvider
}

const (
	dispatchBuffer  = 4096
	dispatchSenders = 4
)

// NewDispatcher starts a dispatcher; Shutdown (or Close) stops it.
func NewDispatcher(cfg DispatcherConfig) *Dispatcher {
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	d := &Dispatcher{
		w:       newQueueWriter(cfg.Redis, cfg.MaxRetry, cfg.Timeout, cfg.RunShare, telemetry.Tracer(cfg.Tracing)),
		giveUp:  max(cfg.GiveUp, time.Second),
		in:      make(chan *models.QueuedRun, dispatchBuffer),
		log:     log,
		closing: make(chan struct{}),
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "valruns_runs_handed_off_total",
			Help: "Runs this API process handed to the queue after their start committed, by result (queued; waiting: its organisation was past its share of the queue, so it waits its turn; dropped: Redis did not take it in time or the buffer was full, so the sweeper enqueues it later).",
		}, []string{"result"}),
	}
	d.queuedAfter = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "valruns_run_start_to_queued_seconds",
		Help:    "Time from a run's start (created_at) to its task being in the queue, for the runs this API process handed off and the gate let in at once (the dispatch: the buffer, the gate, the enqueue).",
		Buckets: handOffBuckets,
	})
	for _, r := range []string{"queued", "waiting", "dropped"} {
		d.sent.WithLabelValues(r)
	}
	if cfg.Registry != nil {
		cfg.Registry.MustRegister(d.sent, d.queuedAfter)
	}
	d.ctx, d.cancel = context.WithCancel(context.Background())
	d.wg.Add(dispatchSenders)
	for range dispatchSenders {
		go d.send()
	}
	return d
}

// HandOff queues r for the queue; it never blocks. After Shutdown began,
// r is left to the sweeper.
func (d *Dispatcher) HandOff(r *models.QueuedRun) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.closed {
		d.sent.WithLabelValues("dropped").Inc()
		return
	}
	select {
	case d.in <- r:
	default:
		d.sent.WithLabelValues("dropped").Inc()
	}
}

// batchMax is the most runs one task carries.
const batchMax = 64

// send hands off runs as they come, several at once when several wait
// (TypeRunBatch: one enqueue and one dequeue for all), each organisation's
// through the gate.
func (d *Dispatcher) send() {
	defer d.wg.Done()
	for {
		var r *models.QueuedRun
		select {
		case r = <-d.in:
		case <-d.closing:
			select {
			case r = <-d.in:
			default:
				return // stopping, and nothing left
			}
		case <-d.ctx.Done():
			return
		}
		runs := []*models.QueuedRun{r}
	more:
		for len(runs) < batchMax {
			select {
			case r := <-d.in:
				runs = append(runs, r)
			default:
				break more
			}
		}
		byOrg := map[string][]*models.QueuedRun{}
		var orgs []string
		for _, r := range runs {
			if byOrg[r.OrgID] == nil {
				orgs = append(orgs, r.OrgID)
			}
			byOrg[r.OrgID] = append(byOrg[r.OrgID], r)
		}
		for _, org := range orgs {
			d.deliver(org, byOrg[org])
		}
	}
}

// deliver admits runs of one organisation and enqueues what the gate lets
// in, until Redis takes them, they are old enough for the sweeper, or the
// dispatcher closes.
func (d *Dispatcher) deliver(org string, runs []*models.QueuedRun) {
	in := make([]RunPayload, len(runs))
	for i, r := range runs {
		in[i] = payloadOf(r)
	}
	var let passed
	admitted := false
	for pause := 10 * time.Millisecond; ; pause = min(2*pause, time.Second) {
		ctx, cancel := context.WithTimeout(d.ctx, 5*time.Second)
		var err error
		if !admitted {
			let, err = d.w.admit(ctx, admission{org: org, own: runs[0].RunShare, in: in}, true)
			admitted = err == nil
		}
		if err == nil {
			err = d.w.enqueueLet(ctx, let)
		}
		cancel()
		if err == nil {
			waiting := len(in)
			for _, p := range let.out {
				if i := slices.IndexFunc(runs, func(r *models.QueuedRun) bool { return r.ID == p.RunID }); i >= 0 {
					waiting--
					d.queuedAfter.Observe(time.Since(runs[i].CreatedAt).Seconds())
				}
			}
			d.sent.WithLabelValues("queued").Add(float64(len(in) - waiting))
			d.sent.WithLabelValues("waiting").Add(float64(waiting))
			return
		}
		if time.Since(runs[0].CreatedAt) > d.giveUp || d.ctx.Err() != nil {
			d.sent.WithLabelValues("dropped").Add(float64(len(runs)))
			d.log.Warn("runs not handed to the queue; the sweeper will enqueue them", "runs", len(runs), "error", err)
			return
		}
		select {
		case <-time.After(pause):
		case <-d.ctx.Done():
		}
	}
}

// queueWriter admits runs through the gate and enqueues their tasks: what
// the dispatcher, the worker (runs admitted as others finish) and the
// sweeper share.
type queueWriter struct {
	client *asynq.Client
	redis  redis.UniversalClient // the batch index (batchIndexKey), the gate
	opts   []asynq.Option
	gate   *gate
	// direct is what the writer knows of the direct hand-off (pushDirect).
	direct *directState
	// tracer traces each enqueue; nil: tracing is off.
	tracer trace.Tracer
}

func newQueueWriter(r asynq.RedisConnOpt, maxRetry int, timeout time.Duration, share int, tracer trace.Tracer) queueWriter {
	rc, _ := r.MakeRedisClient().(redis.UniversalClient)
	inspector := asynq.NewInspectorFromRedisClient(rc)
	return queueWriter{
		client: asynq.NewClientFromRedisClient(rc),
		redis:  rc,
		opts:   runTaskOptions(maxRetry, timeout),
		gate:   &gate{redis: rc, share: share, stale: max(timeout, time.Minute), servers: inspector.Servers},
		direct: &directState{},
		tracer: tracer,
	}
}

// admit passes a through the gate; runs without an organisation (tasks
// enqueued before fair admission existed) are let in as they are. With
// push (new runs: none is a redelivery), the gate's call also hands those
// it lets in at once to a waiting worker, as far as one waits. It always
// asks, costing no round trip of its own: a writer that found no worker
// taking a moment ago (which pushDirect remembers for directNoneFor) would
// otherwise send a worker that has just started to the back of asynq's
// queue, behind a backlog its idle slots are not needed for.
func (w queueWriter) admit(ctx context.Context, a admission, push bool) (passed, error) {
	if a.org == "" {
		return passed{out: a.in, pushed: notPushed}, nil
	}
	if !push || len(a.in) == 0 {
		return w.gate.pass(ctx, a)
	}
	raw, err := payloadsJSON(a.in)
	if err != nil {
		return passed{}, err
	}
	items, end, err := w.directItems(ctx, a.in, raw)
	if err != nil {
		return passed{}, err
	}
	a.push, a.raw = items, raw
	let, err := w.gate.pass(ctx, a)
	end(err)
	if err == nil && let.pushed == notTaken {
		w.direct.noTakerSince(time.Now())
	}
	return let, err
}

// send admits a through the gate and enqueues what it lets in.
func (w queueWriter) send(ctx context.Context, a admission) error {
	let, err := w.admit(ctx, a, false)
	if err != nil {
		return err
	}
	return w.enqueueLet(ctx, let)
}

// enqueueLet enqueues the runs the gate let in (the organisation's batch
// size per task), bar those its call pushed to a waiting worker already.
func (w queueWriter) enqueueLet(ctx context.Context, let passed) error {
	rest := let.out
	if let.pushed != notPushed {
		rest = let.out[max(let.pushed, 0):]
	}
	if len(rest) == 0 {
		return nil // all pushed: no batch size to work out
	}
	size := w.gate.batchSize(let.share)
	if let.pushed == notPushed {
		return w.enqueue(ctx, rest, size)
	}
	return w.enqueueTasks(ctx, rest, size)
}

// enqueue hands new runs to a waiting worker, as far as one waits
// (pushDirect), and enqueues the rest (enqueueTasks).
func (w queueWriter) enqueue(ctx context.Context, runs []RunPayload, size int) error {
	var fresh, rest []RunPayload
	for _, p := range runs {
		if p.Redelivery {
			rest = append(rest, p)
		} else {
			fresh = append(fresh, p)
		}
	}
	n, err := w.pushDirect(ctx, fresh)
	if err != nil {
		return err
	}
	return w.enqueueTasks(ctx, append(fresh[n:], rest...), size)
}

// enqueueTasks enqueues runs to asynq, up to size per task; a redelivery
// always alone, under its own TaskID. What Redis already has (a TaskID
// conflict: an earlier try got through) counts as enqueued.
func (w queueWriter) enqueueTasks(ctx context.Context, runs []RunPayload, size int) error {
	var batch []RunPayload
	for _, p := range runs {
		if p.Redelivery || size <= 1 {
			if err := w.enqueueOne(ctx, p); err != nil {
				return err
			}
			continue
		}
		batch = append(batch, p)
	}
	for len(batch) > 0 {
		n := min(size, len(batch))
		var err error
		if n == 1 {
			err = w.enqueueOne(ctx, batch[0])
		} else {
			err = w.enqueueBatch(ctx, batch[:n])
		}
		if err != nil {
			return err
		}
		batch = batch[n:]
	}
	return nil
}

// enqueueOne enqueues a run's task of its own.
func (w queueWriter) enqueueOne(ctx context.Context, p RunPayload) (err error) {
	id := runTaskID(p.RunID, p.Redeliveries)
	var headers map[string]string
	if w.tracer != nil {
		var end func(error)
		ctx, headers, end = w.traceEnqueueOne(ctx, p, id)
		defer func() { end(err) }()
	}
	task, err := newRunTask(p, headers)
	if err != nil {
		return err
	}
	opts := append(w.opts[:len(w.opts):len(w.opts)], asynq.TaskID(id))
	_, err = w.client.EnqueueContext(ctx, task, opts...)
	if errors.Is(err, asynq.ErrTaskIDConflict) {
		return nil
	}
	return err
}

// enqueueBatch enqueues runs as one batch task, after recording which task
// carries each (the sweeper's batchIndexKey).
func (w queueWriter) enqueueBatch(ctx context.Context, runs []RunPayload) (err error) {
	id := batchTaskID(runs)
	var headers map[string]string
	if w.tracer != nil {
		var end func(error)
		ctx, headers, end = w.traceEnqueueBatch(ctx, runs, id)
		defer func() { end(err) }()
	}
	task, err := newBatchTask(runs, headers)
	if err != nil {
		return err
	}
	index := make([]any, 0, 2*len(runs))
	for _, r := range runs {
		index = append(index, r.RunID, id)
	}
	if err := w.redis.HSet(ctx, batchIndexKey, index...).Err(); err != nil {
		return err
	}
	opts := append(w.opts[:len(w.opts):len(w.opts)], asynq.TaskID(id))
	_, err = w.client.EnqueueContext(ctx, task, opts...)
	if errors.Is(err, asynq.ErrTaskIDConflict) {
		return nil
	}
	return err
}

// Shutdown stops taking runs, hands off every run it took (those buffered
// and those a sender is handing off), and stops. If ctx ends first, it
// gives up on the rest, which the sweeper enqueues after
// RUN_REDELIVER_AFTER. Only the first call does anything.
func (d *Dispatcher) Shutdown(ctx context.Context) {
	d.stop.Do(func() {
		d.mu.Lock()
		d.closed = true
		d.mu.Unlock()
		close(d.closing)
		done := make(chan struct{})
		go func() {
			d.wg.Wait()
			close(done)
		}()
		select {
		case <-done:
		case <-ctx.Done():
			d.cancel()
			<-done
			if n := len(d.in); n > 0 {
				d.sent.WithLabelValues("dropped").Add(float64(n))
				d.log.Warn("runs not handed to the queue by the end of the shutdown; the sweeper will enqueue them", "runs", n)
			}
		}
		d.cancel()
		_ = d.w.client.Close()
		_ = d.w.redis.Close()
	})
}

// Close is Shutdown with a few seconds to hand off what it holds.
func (d *Dispatcher) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	d.Shutdown(ctx)
}
