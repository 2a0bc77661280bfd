package tasks

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/valruns/valruns/models"
)

// Dispatcher hands the runs an API process committed to the queue, right
// after their commit: the run row is the outbox, so nothing is staged. A
// run is handed off at most once here, by a few senders behind a bounded
// buffer, and never makes a request wait on Redis. Whatever it cannot hand
// off (Redis is down, the buffer is full, the process dies first) stays
// queued in PostgreSQL, where the worker's sweeper finds it and enqueues
// it after RUN_REDELIVER_AFTER: nothing is lost, it is only later.
type Dispatcher struct {
	client *asynq.Client
	redis  redis.UniversalClient // the batch index (batchIndexKey)
	opts   []asynq.Option
	// giveUp is how long a sender keeps trying one run before leaving it
	// to the sweeper.
	giveUp time.Duration
	in     chan *models.QueuedRun
	log    *slog.Logger
	sent   *prometheus.CounterVec
	wg     sync.WaitGroup
	ctx    context.Context
	cancel context.CancelFunc
}

// DispatcherConfig configures a Dispatcher.
type DispatcherConfig struct {
	Redis asynq.RedisConnOpt
	// Task options: like the worker's (RUN_MAX_RETRY, RUN_TIMEOUT).
	MaxRetry int
	Timeout  time.Duration
	// GiveUp: RUN_REDELIVER_AFTER, after which the sweeper takes over.
	GiveUp   time.Duration
	Registry prometheus.Registerer
	Log      *slog.Logger
}

const (
	dispatchBuffer  = 4096
	dispatchSenders = 4
)

// NewDispatcher starts a dispatcher; Close stops it.
func NewDispatcher(cfg DispatcherConfig) *Dispatcher {
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	rc, _ := cfg.Redis.MakeRedisClient().(redis.UniversalClient)
	d := &Dispatcher{
		client: asynq.NewClient(cfg.Redis),
		redis:  rc,
		opts:   runTaskOptions(cfg.MaxRetry, cfg.Timeout),
		giveUp: max(cfg.GiveUp, time.Second),
		in:     make(chan *models.QueuedRun, dispatchBuffer),
		log:    log,
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "valruns_runs_handed_off_total",
			Help: "Runs this API process handed to the queue after their start committed, by result (queued; dropped: Redis did not take it in time or the buffer was full, so the sweeper enqueues it later).",
		}, []string{"result"}),
	}
	for _, r := range []string{"queued", "dropped"} {
		d.sent.WithLabelValues(r)
	}
	if cfg.Registry != nil {
		cfg.Registry.MustRegister(d.sent)
	}
	d.ctx, d.cancel = context.WithCancel(context.Background())
	d.wg.Add(dispatchSenders)
	for range dispatchSenders {
		go d.send()
	}
	return d
}

// HandOff queues r for the queue; it never blocks.
func (d *Dispatcher) HandOff(r *models.QueuedRun) {
	select {
	case d.in <- r:
	default:
		d.sent.WithLabelValues("dropped").Inc()
	}
}

// batchMax is the most runs one task carries.
const batchMax = 64

// send hands off runs as they come: alone when one waits, as one batch task
// when several do (TypeRunBatch: one enqueue and one dequeue for all).
func (d *Dispatcher) send() {
	defer d.wg.Done()
	for {
		var r *models.QueuedRun
		select {
		case r = <-d.in:
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
		if len(runs) == 1 || d.redis == nil {
			for _, r := range runs {
				d.sendOne(r)
			}
			continue
		}
		d.sendBatch(runs)
	}
}

// sendBatch enqueues runs as one batch task, after recording which task
// carries each (the sweeper's batchIndexKey), until Redis takes it, the
// runs are old enough for the sweeper, or the dispatcher closes.
func (d *Dispatcher) sendBatch(runs []*models.QueuedRun) {
	task, err := newBatchTask(runs)
	if err != nil {
		d.log.Error("batch task", "error", err)
		d.sent.WithLabelValues("dropped").Add(float64(len(runs)))
		return
	}
	id := batchTaskID(runs)
	index := make([]any, 0, 2*len(runs))
	for _, r := range runs {
		index = append(index, r.ID, id)
	}
	opts := append(d.opts[:len(d.opts):len(d.opts)], asynq.TaskID(id))
	for pause := 10 * time.Millisecond; ; pause = min(2*pause, time.Second) {
		ctx, cancel := context.WithTimeout(d.ctx, 5*time.Second)
		err := d.redis.HSet(ctx, batchIndexKey, index...).Err()
		if err == nil {
			_, err = d.client.EnqueueContext(ctx, task, opts...)
		}
		cancel()
		if err == nil || errors.Is(err, asynq.ErrTaskIDConflict) {
			d.sent.WithLabelValues("queued").Add(float64(len(runs)))
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

// sendOne enqueues r until Redis takes it, the run is old enough for the
// sweeper, or the dispatcher closes.
func (d *Dispatcher) sendOne(r *models.QueuedRun) {
	task, err := newRunTask(RunPayload{RunID: r.ID}, r)
	if err != nil {
		d.log.Error("run task", "run_id", r.ID, "error", err)
		d.sent.WithLabelValues("dropped").Inc()
		return
	}
	opts := append(d.opts[:len(d.opts):len(d.opts)], asynq.TaskID(runTaskID(r.ID, 0)))
	for pause := 10 * time.Millisecond; ; pause = min(2*pause, time.Second) {
		ctx, cancel := context.WithTimeout(d.ctx, 5*time.Second)
		_, err := d.client.EnqueueContext(ctx, task, opts...)
		cancel()
		if err == nil || errors.Is(err, asynq.ErrTaskIDConflict) {
			d.sent.WithLabelValues("queued").Inc()
			return
		}
		if time.Since(r.CreatedAt) > d.giveUp || d.ctx.Err() != nil {
			d.sent.WithLabelValues("dropped").Inc()
			d.log.Warn("run not handed to the queue; the sweeper will enqueue it", "run_id", r.ID, "error", err)
			return
		}
		select {
		case <-time.After(pause):
		case <-d.ctx.Done():
		}
	}
}

// Close hands off what is buffered (for up to a few seconds: the rest is
// left to the sweeper) and stops.
func (d *Dispatcher) Close() {
	deadline := time.Now().Add(3 * time.Second)
	for len(d.in) > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	d.cancel()
	d.wg.Wait()
	_ = d.client.Close()
	if d.redis != nil {
		_ = d.redis.Close()
	}
}
