package tasks

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/robfig/cron/v3"
	"go.opentelemetry.io/otel/trace"
	"gorm.io/gorm"

	"github.com/valruns/valruns/config"
	"github.com/valruns/valruns/internal/telemetry"
	"github.com/valruns/valruns/models"
	"github.com/valruns/valruns/webhooks"
)

// Config configures a Worker; zero values take the defaults named.
type Config struct {
	// DB is the PostgreSQL pool.
	DB *gorm.DB
	// Redis is where asynq keeps its queues.
	Redis asynq.RedisConnOpt
	// Concurrency is how many runs the worker executes at once; 0 means 40.
	Concurrency int
	// CleanupSchedule is the cron spec of the periodic cleanup; "" means @hourly.
	CleanupSchedule string
	// CleanupBatchSize is the webhook deliveries deleted per transaction;
	// 0 means 1000.
	CleanupBatchSize int
	// KeyTTL is IDEMPOTENCY_TTL: the cleanup makes the keys' partitions
	// through now + KeyTTL and a margin; 0 means 24h.
	KeyTTL time.Duration
	// RunLease is how long a claim or a heartbeat holds a running run: a run
	// whose worker died is taken over once it runs out; 0 means 15s.
	RunLease time.Duration
	// RunHeartbeat is how often an executing run's lease is renewed; 0 means
	// a third of RunLease. It must be shorter than RunLease.
	RunHeartbeat time.Duration
	// RunMaxRetry is how often a failing run task is retried before the run
	// ends in error; 0 means 5. A run is started at most RunMaxRetry+1 times.
	RunMaxRetry int
	// RetryDelay is the delay before a failed run task's first retry,
	// doubled for each further retry up to a minute; a transient database
	// error is retried after about RetryDelay without counting as a retry.
	// 0 means 1s.
	RetryDelay time.Duration
	// RunTimeout bounds one execution of a run, behind the validation
	// engine's own limits; a run past it ends in error. 0 means 5m.
	RunTimeout time.Duration
	// PollInterval is how long asynq's server waits, when its queue is
	// empty, before it looks again (TaskCheckInterval): only retries due
	// and the cleanup go through it, runs are taken from the hand-off
	// without polling. 0 means 5s.
	PollInterval time.Duration
	// SweepInterval is how often the sweeper looks for stranded runs; 0
	// means 5s.
	SweepInterval time.Duration
	// RedeliverAfter is how long a run may stay queued, and how long the
	// sweeper waits before looking at the same run again; 0 means 10s.
	RedeliverAfter time.Duration
	// FastBudget is how long a run's first delivery may validate it
	// without claiming it (the fast path: one write per run); past it, the
	// run is claimed and validated under a lease. 0 means min(1s,
	// RunHeartbeat); a negative value turns the fast path off.
	FastBudget time.Duration
	// RunShare is ORG_RUN_SHARE: how many runs of an organisation without a
	// share of its own may be in the queue at once; 0 means adaptive, 2 to
	// 16 runs per worker slot alive (gateScript).
	RunShare int
	// ShutdownTimeout is how long in-flight tasks may finish at shutdown
	// before they are handed back to the queue; 0 means 20s.
	ShutdownTimeout time.Duration
	// WebhookConcurrency is how many webhook attempts run at once, beside
	// the runs (slow receivers never hold the slots that execute runs); 0
	// means 10, negative: this worker sends no webhooks.
	WebhookConcurrency int
	// WebhookPollInterval is how often the worker looks for webhook
	// deliveries due (and at once, at most ten times as often, when it ends
	// a run); 0 means 1s.
	WebhookPollInterval time.Duration
	// WebhookRetryBase is the delay after a delivery's first failed
	// attempt, four times longer after each further one up to 8 h
	// (WebhookRetryDelay); 0 means 5s.
	WebhookRetryBase time.Duration
	// WebhookRetryHorizon is how long after its event a delivery is
	// retried before it fails for good; 0 means 24h.
	WebhookRetryHorizon time.Duration
	// WebhookRetention is how long the cleanup keeps a delivery delivered
	// or failed; 0 means 30 days, negative: for ever.
	WebhookRetention time.Duration
	// WebhookClaimLease is how long a claim holds a delivery for one
	// attempt; an attempt that has not recorded its outcome by then lets
	// the delivery be claimed and attempted again. 0 means 2 min.
	WebhookClaimLease time.Duration
	// WebhookAllowPrivate lets deliveries reach loopback, private,
	// link-local and metadata addresses (WEBHOOK_ALLOW_PRIVATE_TARGETS).
	WebhookAllowPrivate bool
	// EventData is a run as an event's data shows it: the API's view of
	// the run (the composition root injects handlers'); nil means the
	// stored row as it is.
	EventData func(*models.ValidationRun) any
	// Registry receives the worker's metrics; nil means a private one.
	Registry prometheus.Registerer
	// BacklogInterval is how often the worker reads the backlog's gauges
	// (valruns_runs_unfinished and its kin); 0 means 10s.
	BacklogInterval time.Duration
	// Log; nil discards.
	Log *slog.Logger
	// Tracing, when set, traces each run's execution (in the trace of the
	// request that started it, or linked to it), each enqueue and each
	// webhook attempt; nil: tracing is off.
	Tracing trace.TracerProvider
}

// Worker is the background side of valruns in one process: the taker of
// the hand-off and the executor of its runs, an asynq server (retries due,
// the cleanup), the cleanup's schedule, the sweeper and the webhook sender.
type Worker struct {
	cfg       Config
	log       *slog.Logger
	server    *asynq.Server
	sched     cron.Schedule // the cleanup's (CLEANUP_SCHEDULE)
	client    *asynq.Client
	inspector *asynq.Inspector
	redis     redis.UniversalClient // the sweeper's and Ping's
	sweeper   *Sweeper
	queue     queueWriter // the gate's writer and the retries'
	runs      *RunExecutor
	taker     *taker // takes runs from ready into runs' slots
	cleanup   *Cleanup
	hooks     *webhookSender // nil: this worker sends no webhooks
	notice    *endedNotice   // tells the API processes' long-polls that runs ended
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	m         *metrics
	// running is set while the worker runs: from Start until Shutdown
	// begins (Ready, valruns_worker_running).
	running atomic.Bool
}

// ErrNotRunning: the worker is not running (not started yet, or shutting
// down).
var ErrNotRunning = errors.New("the task server is not running")

// NewWorker builds a worker; Start runs it.
func NewWorker(cfg Config) (*Worker, error) {
	cfg = withDefaults(cfg)
	if cfg.RunHeartbeat >= cfg.RunLease {
		return nil, fmt.Errorf("run heartbeat %s must be shorter than the run lease %s", cfg.RunHeartbeat, cfg.RunLease)
	}
	sched, err := config.ParseSchedule(cfg.CleanupSchedule)
	if err != nil {
		return nil, err
	}
	rc, ok := cfg.Redis.MakeRedisClient().(redis.UniversalClient)
	if !ok {
		return nil, errors.New("redis: unsupported connection option")
	}
	log := cmp.Or(cfg.Log, slog.New(slog.DiscardHandler))
	w := &Worker{cfg: cfg, log: log, m: newMetrics(cfg.Registry), sched: sched, redis: rc,
		client: asynq.NewClient(cfg.Redis), inspector: asynq.NewInspector(cfg.Redis)}
	w.registerRunning()
	tracer := telemetry.Tracer(cfg.Tracing)
	w.queue = newQueueWriter(cfg.Redis, cfg.RunMaxRetry, cfg.RunTimeout, cfg.RunShare, tracer)
	runs := w.newExecutor(tracer)
	w.taker = w.newTaker()
	w.sweeper = &Sweeper{runs: runs, redis: rc, queue: w.queue, release: w.release,
		interval: cfg.SweepInterval, after: cfg.RedeliverAfter, batch: 500, log: log, m: w.m}
	w.server = w.newServer()
	w.cleanup = &Cleanup{keys: models.NewKeyStore(cfg.DB), hooks: models.NewWebhookStore(cfg.DB),
		retention: cfg.WebhookRetention, batch: cfg.CleanupBatchSize, ttl: cfg.KeyTTL, log: log, m: w.m}
	w.notice = newEndedNotice(rc)
	w.runs.ended = w.notice.ended
	if cfg.WebhookConcurrency > 0 {
		w.hooks = w.newWebhookSender(tracer)
		w.runs.ended = func(runID string) {
			w.hooks.wake()
			w.notice.ended(runID)
		}
	}
	return w, nil
}

// withDefaults fills cfg's zero values with the defaults its fields name.
func withDefaults(cfg Config) Config {
	cfg.Concurrency = cmp.Or(cfg.Concurrency, 40)
	cfg.CleanupSchedule = cmp.Or(cfg.CleanupSchedule, "@hourly")
	cfg.CleanupBatchSize = cmp.Or(cfg.CleanupBatchSize, 1000)
	cfg.KeyTTL = cmp.Or(cfg.KeyTTL, 24*time.Hour)
	cfg.RunLease = cmp.Or(cfg.RunLease, 15*time.Second)
	cfg.RunHeartbeat = cmp.Or(cfg.RunHeartbeat, cfg.RunLease/3)
	cfg.RunMaxRetry = cmp.Or(cfg.RunMaxRetry, 5)
	cfg.RetryDelay = cmp.Or(cfg.RetryDelay, time.Second)
	cfg.RunTimeout = cmp.Or(cfg.RunTimeout, 5*time.Minute)
	cfg.SweepInterval = cmp.Or(cfg.SweepInterval, 10*time.Second)
	cfg.PollInterval = cmp.Or(cfg.PollInterval, 10*time.Second)
	cfg.RedeliverAfter = cmp.Or(cfg.RedeliverAfter, 10*time.Second)
	cfg.FastBudget = min(cmp.Or(cfg.FastBudget, time.Second), cfg.RunHeartbeat)
	cfg.ShutdownTimeout = cmp.Or(cfg.ShutdownTimeout, 20*time.Second)
	cfg.WebhookConcurrency = cmp.Or(cfg.WebhookConcurrency, 10)
	cfg.WebhookPollInterval = cmp.Or(cfg.WebhookPollInterval, time.Second)
	cfg.WebhookRetryBase = cmp.Or(cfg.WebhookRetryBase, 5*time.Second)
	cfg.WebhookRetryHorizon = cmp.Or(cfg.WebhookRetryHorizon, 24*time.Hour)
	cfg.WebhookRetention = cmp.Or(cfg.WebhookRetention, 30*24*time.Hour)
	cfg.WebhookClaimLease = cmp.Or(cfg.WebhookClaimLease, 2*time.Minute)
	cfg.BacklogInterval = cmp.Or(cfg.BacklogInterval, backlogEvery)
	if cfg.EventData == nil {
		cfg.EventData = func(r *models.ValidationRun) any { return r }
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	return cfg
}

// registerRunning exports valruns_worker_running.
func (w *Worker) registerRunning() {
	w.cfg.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "valruns_worker_running",
		Help: "1 while this worker runs (from its start until its shutdown begins), else 0.",
	}, func() float64 {
		if w.running.Load() {
			return 1
		}
		return 0
	}))
}

// newExecutor builds the run executor (w.runs) and returns its store.
func (w *Worker) newExecutor(tracer trace.Tracer) *models.RunStore {
	cfg := w.cfg
	runs := models.NewRunStore(cfg.DB)
	runs.SetEndObserver(w.m.observeEnded)
	w.runs = &RunExecutor{runs: runs, lease: cfg.RunLease, heartbeat: cfg.RunHeartbeat,
		maxAttempts: cfg.RunMaxRetry + 1, timeout: cfg.RunTimeout, log: w.log, m: w.m,
		fastBudget: max(cfg.FastBudget, 0), fin: newFinisher(runs), tracer: tracer,
		queue: w.queue, retryBase: cfg.RetryDelay, release: newReleaser(w.release).release}
	return runs
}

// newTaker builds the worker's taker of the hand-off, with a Redis client
// of its own for the blocking takes.
func (w *Worker) newTaker() *taker {
	pop, _ := w.cfg.Redis.MakeRedisClient().(redis.UniversalClient)
	if c, ok := pop.(*redis.Client); ok {
		// A take's pipeline is read within the client's timeouts, not a
		// blocking command's own. A take that fails is not sent again
		// (go-redis would, on a timeout or a broken connection): the
		// taker looks for what it may have moved first (orphans).
		c = c.WithTimeout(takerBlock + 10*time.Second)
		c.Options().MaxRetries = 0 // normalised already: 0 is one try
		pop = c
	}
	return newTaker(w.redis, pop, w.cfg.Concurrency, w.cfg.RunLease, w.runs.run, w.log)
}

// newServer builds the asynq server: it pushes the retries due back onto
// ready and runs the cleanup. Nothing waits on its poll but those.
func (w *Worker) newServer() *asynq.Server {
	cfg := w.cfg
	return asynq.NewServer(cfg.Redis, asynq.Config{
		// The slots alive the gate reads (inspector.Servers): the runs
		// this worker executes at once.
		Concurrency:              cfg.Concurrency,
		ShutdownTimeout:          cfg.ShutdownTimeout,
		TaskCheckInterval:        cfg.PollInterval,
		DelayedTaskCheckInterval: cfg.PollInterval,
		HealthCheckInterval:      time.Minute,
		JanitorInterval:          time.Minute,
		Logger:                   slogAdapter{w.log},
		LogLevel:                 asynq.WarnLevel,
		IsFailure:                func(err error) bool { return !notAFailure(err) },
		RetryDelayFunc: func(n int, err error, t *asynq.Task) time.Duration {
			if t.Type() == TypeCleanup {
				return asynq.DefaultRetryDelayFunc(n, err, t)
			}
			return retryDelay(cfg.RetryDelay, n, err)
		},
		ErrorHandler: asynq.ErrorHandlerFunc(func(ctx context.Context, t *asynq.Task, err error) {
			w.m.failed.WithLabelValues(t.Type()).Inc()
			w.log.WarnContext(ctx, "task failed", "type", t.Type(), "error", err, "counts_as_retry", !notAFailure(err))
		}),
	})
}

// newWebhookSender builds the webhook sender.
func (w *Worker) newWebhookSender(tracer trace.Tracer) *webhookSender {
	cfg := w.cfg
	return &webhookSender{store: models.NewWebhookStore(cfg.DB),
		send: webhooks.NewSender(cfg.WebhookAllowPrivate, 0), eventData: cfg.EventData,
		interval: cfg.WebhookPollInterval, limit: cfg.WebhookConcurrency, base: cfg.WebhookRetryBase,
		horizon: cfg.WebhookRetryHorizon, lease: cfg.WebhookClaimLease, log: w.log, m: newWebhookMetrics(cfg.Registry),
		processed: w.m.processed.WithLabelValues(TypeWebhookDeliver), poke: make(chan struct{}, 1), tracer: tracer}
}

// Mux routes task types to their handlers, counting outcomes.
func (w *Worker) Mux() *asynq.ServeMux {
	mux := asynq.NewServeMux()
	mux.Handle(TypeRunExecute, w.runs)
	mux.HandleFunc(TypeRunBatch, w.runs.ProcessBatch)
	mux.Handle(TypeCleanup, w.cleanup)
	mux.Use(w.countProcessed)
	return mux
}

// countProcessed counts each task its handler did without error
// (valruns_tasks_processed_total; the servers' ErrorHandler counts the
// others).
func (w *Worker) countProcessed(next asynq.Handler) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		err := next.ProcessTask(ctx, t)
		if err == nil && t.Type() != TypeRunExecute { // a retry's push: the run's execution counts
			w.runs.m.processed.WithLabelValues(t.Type()).Inc()
		}
		return err
	})
}

// Ping checks Redis.
func (w *Worker) Ping(ctx context.Context) error { return w.redis.Ping(ctx).Err() }

// Ready reports whether this worker can do its work now: its task server
// runs (ErrNotRunning before Start and once Shutdown begins), and
// PostgreSQL and Redis answer a ping within ctx. Its errors say which, in
// words fit for a public /readyz (no address, no driver text).
func (w *Worker) Ready(ctx context.Context) error {
	if !w.running.Load() {
		return ErrNotRunning
	}
	if err := models.SQLDB(w.cfg.DB).PingContext(ctx); err != nil {
		return errors.New("PostgreSQL does not answer")
	}
	if err := w.redis.Ping(ctx).Err(); err != nil {
		return errors.New("Redis does not answer")
	}
	return nil
}

// Start runs the taker, the server, the scheduler, the sweeper and the
// webhook sender in the background.
func (w *Worker) Start(ctx context.Context) error {
	if err := w.server.Start(w.Mux()); err != nil {
		return fmt.Errorf("start task server: %w", err)
	}
	ctx, w.cancel = context.WithCancel(context.WithoutCancel(ctx))
	w.running.Store(true)
	w.taker.start()
	if w.hooks != nil {
		w.wg.Go(func() { w.hooks.run(ctx) })
	}
	w.wg.Go(func() { w.watchBacklog(ctx, w.cfg.BacklogInterval) })
	w.wg.Go(func() { w.notice.run(ctx) })
	w.wg.Go(func() { w.sweeper.Run(ctx) })
	w.wg.Go(func() { w.scheduleCleanup(ctx) })
	w.log.InfoContext(ctx, "worker started", "concurrency", w.cfg.Concurrency, "cleanup_schedule", w.cfg.CleanupSchedule,
		"run_lease", w.cfg.RunLease, "run_heartbeat", w.cfg.RunHeartbeat, "sweep_interval", w.cfg.SweepInterval, "poll_interval", w.cfg.PollInterval)
	return nil
}

// Shutdown stops taking runs, lets those under way finish for up to
// ShutdownTimeout, stops the rest (a claimed run's lease is released), and
// gives back every run taken and not finished: the head of ready, where
// another worker takes it at once.
func (w *Worker) Shutdown() {
	w.running.Store(false)
	w.taker.stopTaking()
	w.runs.handBack(w.cfg.ShutdownTimeout)
	w.taker.wait(10 * time.Second)
	w.taker.giveBack()
	w.cancel()
	w.wg.Wait()
	if w.hooks != nil {
		w.hooks.wait(w.cfg.ShutdownTimeout)
	}
	w.server.Shutdown()
	_ = w.inspector.Close()
	_ = w.client.Close()
	_ = w.queue.client.Close()
	_ = w.queue.redis.Close()
	_ = w.redis.Close()
	w.log.Info("worker stopped")
}

// release tells the gate that runs of org left the queue, and enqueues the
// organisation's runs it lets in instead. Failing, it only delays them: a
// run admitted without its task is re-enqueued by the sweeper, and each
// sweep lets in what an organisation's share allows.
func (w *Worker) release(ctx context.Context, org string, ids []string, cost time.Duration) {
	ctx, cancel := detached(ctx)
	defer cancel()
	if err := w.queue.send(ctx, admission{org: org, recorded: true, released: ids, cost: cost}); err != nil {
		w.log.WarnContext(ctx, "could not let an organisation's waiting runs into the queue; a sweep will", "org_id", org, "error", err)
	}
}

// scheduleCleanup enqueues the cleanup at each tick of CLEANUP_SCHEDULE
// until ctx is done. Each tick's task has the tick's TaskID (tickID), so
// with several workers it is enqueued once: the others get
// ErrTaskIDConflict. (asynq.Unique alone would not do: its lock is released
// when the task completes, so a worker ticking a moment later would enqueue
// a second cleanup. And asynq's Scheduler shares each entry's options with
// its heartbeat, so rewriting the TaskID per tick there is a data race.)
func (w *Worker) scheduleCleanup(ctx context.Context) {
	for {
		tick := w.sched.Next(time.Now())
		t := time.NewTimer(time.Until(tick))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		_, err := w.client.EnqueueContext(ctx, asynq.NewTask(TypeCleanup, nil),
			asynq.TaskID(tickID(tick)), asynq.Retention(time.Hour), asynq.MaxRetry(3))
		switch {
		case errors.Is(err, asynq.ErrTaskIDConflict):
			w.log.Debug("cleanup tick already enqueued by another worker")
		case err != nil && ctx.Err() == nil:
			w.log.Warn("could not enqueue the cleanup", "error", err)
		}
	}
}

// Sweeper returns the stranded-run sweeper (tests sweep by hand).
func (w *Worker) Sweeper() *Sweeper { return w.sweeper }

// maxRetryDelay caps the doubling retry delay of a failing run.
const maxRetryDelay = time.Minute

// retryDelay is the delay before a run's retry after its n-th retry failed
// with err: base after a transient database error or a stall (which do not
// count, so n stays put), base doubled per retry for a run's failures, up
// to a minute. Each delay is jittered down by up to a half, so runs that
// failed together do not retry together.
func retryDelay(base time.Duration, n int, err error) time.Duration {
	d := base
	if !notAFailure(err) {
		for i := 0; i < n && d < maxRetryDelay; i++ {
			d *= 2
		}
		d = min(d, max(base, maxRetryDelay))
	}
	return d/2 + rand.N(d/2+1)
}

// slogAdapter lets asynq log through slog.
type slogAdapter struct{ l *slog.Logger }

func (a slogAdapter) Debug(args ...any) { a.l.Debug(fmt.Sprint(args...), "component", "asynq") }
func (a slogAdapter) Info(args ...any)  { a.l.Info(fmt.Sprint(args...), "component", "asynq") }
func (a slogAdapter) Warn(args ...any)  { a.l.Warn(fmt.Sprint(args...), "component", "asynq") }
func (a slogAdapter) Error(args ...any) { a.l.Error(fmt.Sprint(args...), "component", "asynq") }
func (a slogAdapter) Fatal(args ...any) {
	a.l.Error(fmt.Sprint(args...), "component", "asynq", "fatal", true)
}
