package tasks

import (
	"context"
	"errors"
	"fmt"
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

// Dispatcher hands the runs an API process committed to the workers, right
// after their commit, through the gate onto the ready list (handoff.go):
// the run row is the outbox, so nothing is staged. A
// run is handed off at most once here, by a few senders behind a bounded
// buffer, and never makes a request wait on Redis. Whatever it cannot hand
// off (Redis is down, the buffer is full, the process dies first) stays
// queued in PostgreSQL, where the worker's sweeper finds it and enqueues
// it after RUN_REDELIVER_AFTER: nothing is lost, it is only later. A
// graceful stop (Shutdown) hands off everything first.
//
// An organisation past its share (ORG_RUN_SHARE) has its runs wait their
// turn at the gate, in order, until its admitted runs finish.
type Dispatcher struct {
	w queueWriter
	// giveUp is how long a sender keeps trying one run before leaving it
	// to the sweeper.
	giveUp time.Duration
	in     chan handed
	log    *slog.Logger
	sent   *prometheus.CounterVec
	// queuedAfter observes, per run it enqueued, the time from its start;
	// handOffTook, the time from its commit (HandOff).
	queuedAfter prometheus.Histogram
	handOffTook prometheus.Histogram
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
		in:      make(chan handed, dispatchBuffer),
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
	d.handOffTook = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "valruns_run_handoff_seconds",
		Help:    "Time from a run's commit (its hand-off) to its task being in the queue, for the runs this API process handed off and the gate let in at once (the buffer, the gate's script, the push); the request does not wait for it.",
		Buckets: handOffBuckets,
	})
	for _, r := range []string{"queued", "waiting", "dropped"} {
		d.sent.WithLabelValues(r)
	}
	if cfg.Registry != nil {
		cfg.Registry.MustRegister(d.sent, d.queuedAfter, d.handOffTook)
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
	case d.in <- handed{r, time.Now()}:
	default:
		d.sent.WithLabelValues("dropped").Inc()
	}
}

// handed is a run handed off, and when.
type handed struct {
	*models.QueuedRun
	at time.Time
}

// batchMax is the most runs one call of the gate carries.
const batchMax = 64

// send hands off runs as they come, several at once when several wait,
// each organisation's through the gate.
func (d *Dispatcher) send() {
	defer d.wg.Done()
	for {
		var r handed
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
		runs := []handed{r}
	more:
		for len(runs) < batchMax {
			select {
			case r := <-d.in:
				runs = append(runs, r)
			default:
				break more
			}
		}
		byOrg := map[string][]handed{}
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

// deliver passes runs of one organisation through the gate, which pushes
// those it admits onto ready, until Redis takes them, they are old enough
// for the sweeper, or the dispatcher closes.
func (d *Dispatcher) deliver(org string, runs []handed) {
	in := make([]RunPayload, len(runs))
	for i, r := range runs {
		in[i] = payloadOf(r.QueuedRun)
	}
	for pause := 10 * time.Millisecond; ; pause = min(2*pause, time.Second) {
		ctx, cancel := context.WithTimeout(d.ctx, 5*time.Second)
		let, err := d.w.admit(ctx, admission{org: org, own: runs[0].RunShare, in: in})
		cancel()
		if err == nil {
			queued := 0
			for _, r := range runs {
				if slices.Contains(let.admitted, r.ID) {
					queued++
					d.queuedAfter.Observe(time.Since(r.CreatedAt).Seconds())
					d.handOffTook.Observe(time.Since(r.at).Seconds())
				}
			}
			d.sent.WithLabelValues("queued").Add(float64(queued))
			d.sent.WithLabelValues("waiting").Add(float64(len(runs) - queued))
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

// queueWriter admits runs through the gate (which pushes them onto ready)
// and schedules retries: what the dispatcher, the worker and the sweeper
// share.
type queueWriter struct {
	// client schedules retries (asynq: the durable queue of what waits).
	client *asynq.Client
	redis  redis.UniversalClient // the gate, ready, the retry index
	opts   []asynq.Option
	gate   *gate
	// tracer traces each hand-off; nil: tracing is off.
	tracer trace.Tracer
}

func newQueueWriter(r asynq.RedisConnOpt, maxRetry int, timeout time.Duration, share int, tracer trace.Tracer) queueWriter {
	rc, _ := r.MakeRedisClient().(redis.UniversalClient)
	inspector := asynq.NewInspectorFromRedisClient(rc)
	return queueWriter{
		client: asynq.NewClientFromRedisClient(rc),
		redis:  rc,
		opts:   retryTaskOptions(timeout),
		gate:   &gate{redis: rc, share: share, stale: max(timeout, time.Minute), servers: inspector.Servers},
		tracer: tracer,
	}
}

// admit passes a through the gate, which pushes the runs it admits onto
// ready; runs without an organisation (tasks of an older version) go onto
// ready as they are.
func (w queueWriter) admit(ctx context.Context, a admission) (let passed, err error) {
	var end func(error)
	a.items, end, err = w.items(ctx, a.in)
	if err != nil {
		return passed{}, err
	}
	defer func() { end(err) }()
	if a.org == "" {
		if len(a.items) == 0 {
			return passed{}, nil
		}
		args := make([]any, len(a.items))
		for i, it := range a.items {
			args[i] = it
		}
		if err := w.redis.RPush(ctx, readyList, args...).Err(); err != nil {
			return passed{}, fmt.Errorf("hand runs to the workers: %w", err)
		}
		for _, p := range a.in {
			let.admitted = append(let.admitted, p.RunID)
		}
		return let, nil
	}
	return w.gate.pass(ctx, a)
}

// send admits a through the gate.
func (w queueWriter) send(ctx context.Context, a admission) error {
	_, err := w.admit(ctx, a)
	return err
}

// items are the hand-off items of runs, each with the trace context of its
// hand-off when tracing is on; end ends those spans with the push's error.
func (w queueWriter) items(ctx context.Context, runs []RunPayload) (items [][]byte, end func(error), err error) {
	var ends []func(error)
	end = func(err error) {
		for _, e := range ends {
			e(err)
		}
	}
	for _, p := range runs {
		var headers map[string]string
		if w.tracer != nil {
			var e func(error)
			_, headers, e = w.traceHandOff(ctx, p)
			ends = append(ends, e)
		}
		b, err := itemJSON(p, headers)
		if err != nil {
			end(err)
			return nil, nil, err
		}
		items = append(items, b)
	}
	return items, end, nil
}

// scheduleRetry enqueues p's retry to asynq, due in delay: its task pushes
// p back onto ready then (RunExecutor.ProcessTask). The task's id names the
// run and the retry, a new one for each retry scheduled (the last one's
// task may still be finishing); the retry index tells the sweeper the run
// is not lost meanwhile.
func (w queueWriter) scheduleRetry(ctx context.Context, p RunPayload, delay time.Duration) error {
	task, err := newRunTask(p, nil)
	if err != nil {
		return err
	}
	id := retryTaskID(p.RunID, p.Rescheduled)
	if err := w.redis.HSet(ctx, retryIndex, p.RunID, id).Err(); err != nil {
		return fmt.Errorf("schedule a retry: %w", err)
	}
	opts := append(w.opts[:len(w.opts):len(w.opts)], asynq.TaskID(id), asynq.ProcessIn(delay))
	_, err = w.client.EnqueueContext(ctx, task, opts...)
	if err != nil && !errors.Is(err, asynq.ErrTaskIDConflict) {
		return fmt.Errorf("schedule a retry: %w", err)
	}
	return nil
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
