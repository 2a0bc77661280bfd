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
	// Concurrency is how many tasks run at once; 0 means 10.
	Concurrency int
	// CleanupSchedule is the cron spec of the periodic cleanup; "" means @hourly.
	CleanupSchedule string
	// CleanupBatchSize is the keys deleted per transaction; 0 means 1000.
	CleanupBatchSize int
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
	// PollInterval is how long the runs' task server waits, when its queue
	// is empty, before it looks again (asynq's TaskCheckInterval: it sleeps
	// between half and one and a half times it): a run enqueued meanwhile
	// waits for it. 0 means 2 ms.
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
	// WebhookConcurrency is how many webhook attempts run at once, on an
	// asynq server of their own (slow receivers never hold the slots that
	// execute runs); 0 means 10, negative: this worker sends no webhooks.
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
	// SingleNode: the worker runs inside an API process (serve --worker),
	// whose new runs its local lane executes at once (RunHere) while a slot
	// is free. It then takes no runs from the direct hand-off: under load
	// its lane's slots, full of its own runs, made that list a second queue
	// beside asynq's batches, which drain a backlog at less cost per run
	// (measured at 128 clients: 0.81 of the runs started finished within
	// the loop, 0.96 without).
	SingleNode bool
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

// Worker is the background side of valruns in one process: an asynq server
// with its mux, the periodic cleanup's schedule, and the sweeper.
type Worker struct {
	cfg       Config
	log       *slog.Logger
	server    *asynq.Server
	sched     cron.Schedule // the cleanup's (CLEANUP_SCHEDULE)
	client    *asynq.Client
	inspector *asynq.Inspector
	redis     redis.UniversalClient // the sweeper's and Ping's
	sweeper   *Sweeper
	queue     queueWriter // the gate's and the run tasks' writer
	runs      *RunExecutor
	local     *localLane   // runs this process started, executed here at once (RunHere)
	direct    *directTaker // pops runs of the direct hand-off into local's slots
	noDirect  bool         // this worker does not take from the direct hand-off (SingleNode; tests)
	cleanup   *Cleanup
	hooks     *webhookSender // nil: this worker sends no webhooks
	notice    *endedNotice   // tells the API processes' long-polls that runs ended
	hookSrv   *asynq.Server  // the server of hooks' attempts (nil with it)
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	m         *metrics
	// running is set while the task server runs: from Start until
	// Shutdown begins (Ready, valruns_worker_running).
	running atomic.Bool
}

// ErrNotRunning: the worker's task server is not running (not started yet,
// or shutting down).
var ErrNotRunning = errors.New("the task server is not running")

// NewWorker builds a worker; Start runs it.
func NewWorker(cfg Config) (*Worker, error) {
	cfg.Concurrency = cmp.Or(cfg.Concurrency, 10)
	cfg.CleanupSchedule = cmp.Or(cfg.CleanupSchedule, "@hourly")
	cfg.CleanupBatchSize = cmp.Or(cfg.CleanupBatchSize, 1000)
	cfg.RunLease = cmp.Or(cfg.RunLease, 15*time.Second)
	cfg.RunHeartbeat = cmp.Or(cfg.RunHeartbeat, cfg.RunLease/3)
	cfg.RunMaxRetry = cmp.Or(cfg.RunMaxRetry, 5)
	cfg.RetryDelay = cmp.Or(cfg.RetryDelay, time.Second)
	cfg.RunTimeout = cmp.Or(cfg.RunTimeout, 5*time.Minute)
	cfg.SweepInterval = cmp.Or(cfg.SweepInterval, 5*time.Second)
	cfg.PollInterval = cmp.Or(cfg.PollInterval, 2*time.Millisecond)
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
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.RunHeartbeat >= cfg.RunLease {
		return nil, fmt.Errorf("run heartbeat %s must be shorter than the run lease %s", cfg.RunHeartbeat, cfg.RunLease)
	}
	sched, err := config.ParseSchedule(cfg.CleanupSchedule)
	if err != nil {
		return nil, err
	}
	m := newMetrics(cfg.Registry)
	w := &Worker{cfg: cfg, log: log, m: m, noDirect: cfg.SingleNode}
	cfg.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "valruns_worker_running",
		Help: "1 while this worker's task server runs (from its start until its shutdown begins), else 0.",
	}, func() float64 {
		if w.running.Load() {
			return 1
		}
		return 0
	}))
	runs := models.NewRunStore(cfg.DB)
	runs.SetEndObserver(m.observeEnded)
	w.runs = &RunExecutor{runs: runs, lease: cfg.RunLease, heartbeat: cfg.RunHeartbeat,
		maxAttempts: cfg.RunMaxRetry + 1, timeout: cfg.RunTimeout, log: log, m: m,
		fastBudget: max(cfg.FastBudget, 0), fin: newFinisher(runs)}
	hooks := models.NewWebhookStore(cfg.DB)
	w.cleanup = &Cleanup{keys: models.NewKeyStore(cfg.DB), hooks: hooks, retention: cfg.WebhookRetention,
		batch: cfg.CleanupBatchSize, log: log, m: m}
	w.client = asynq.NewClient(cfg.Redis)
	w.inspector = asynq.NewInspector(cfg.Redis)
	rc, ok := cfg.Redis.MakeRedisClient().(redis.UniversalClient)
	if !ok {
		return nil, errors.New("redis: unsupported connection option")
	}
	w.redis = rc
	tracer := telemetry.Tracer(cfg.Tracing)
	w.runs.tracer = tracer
	w.queue = newQueueWriter(cfg.Redis, cfg.RunMaxRetry, cfg.RunTimeout, cfg.RunShare, tracer)
	w.runs.queue, w.runs.release = w.queue, newReleaser(w.release).release
	w.runs.done = func(ctx context.Context, runs []RunPayload) {
		ids := make([]string, len(runs))
		for i, r := range runs {
			ids[i] = r.RunID
		}
		if err := rc.HDel(ctx, batchIndexKey, ids...).Err(); err != nil {
			log.WarnContext(ctx, "could not forget a batch's runs in the batch index", "error", err)
		}
	}
	// One slot more than the 4 per WORKER_CONCURRENCY: the direct
	// hand-off's pop waits holding it (and the other free slots, for the
	// runs its round trip may take besides: fetch). RunHere is called only
	// with SingleNode (serve --worker), where no pop runs, and may take
	// them all.
	w.local = newLocalLane(w.runs, 4*cfg.Concurrency+1, w.requeue, cfg.Registry)
	pop, _ := cfg.Redis.MakeRedisClient().(redis.UniversalClient)
	if c, ok := pop.(*redis.Client); ok {
		// A pop's pipeline is read within the client's timeouts, not a
		// blocking command's own (its wait and ten seconds, as go-redis
		// gives a BLMOVE sent alone): a reply cut off there would leave
		// the runs it moved in the worker's list of runs taken.
		pop = c.WithTimeout(directBlock + 10*time.Second)
	}
	w.direct = newDirectTaker(w.local, rc, pop, w.queue.enqueueOne, log)
	w.sweeper = &Sweeper{runs: runs, redis: rc, queue: w.queue, release: w.release,
		interval: cfg.SweepInterval, after: cfg.RedeliverAfter, lease: cfg.RunLease, taskInfo: w.inspector.GetTaskInfo,
		batch: 500, log: log, m: m}
	w.server = asynq.NewServer(cfg.Redis, asynq.Config{
		Concurrency:     cfg.Concurrency,
		ShutdownTimeout: cfg.ShutdownTimeout,
		// When its queues are empty, asynq sleeps between half and one and a
		// half times this (default 1s) before it looks again: a run enqueued
		// meanwhile waits for it. It has no wake-up; RUN_POLL_INTERVAL
		// (2 ms) keeps the hand-off from a committed start to an idle
		// worker about a millisecond on average, for one Redis script per
		// interval while the worker is idle (a busy worker never sleeps).
		TaskCheckInterval:        cfg.PollInterval,
		DelayedTaskCheckInterval: time.Second,
		Logger:                   slogAdapter{log},
		LogLevel:                 asynq.WarnLevel,
		// A database that is restarting or unreachable is not the task's
		// fault: asynq retries it soon and does not spend a retry on it.
		IsFailure:      func(err error) bool { return !notAFailure(err) },
		RetryDelayFunc: retryDelay(cfg.RetryDelay),
		ErrorHandler: asynq.ErrorHandlerFunc(func(ctx context.Context, t *asynq.Task, err error) {
			m.failed.WithLabelValues(t.Type()).Inc()
			log.WarnContext(ctx, "task failed", "type", t.Type(), "error", err, "counts_as_retry", !notAFailure(err))
		}),
	})
	w.sched = sched
	if cfg.WebhookConcurrency > 0 {
		w.hooks = &webhookSender{store: hooks, client: w.client,
			send: webhooks.NewSender(cfg.WebhookAllowPrivate, 0), eventData: cfg.EventData,
			interval: cfg.WebhookPollInterval, limit: cfg.WebhookConcurrency, base: cfg.WebhookRetryBase,
			horizon: cfg.WebhookRetryHorizon, lease: cfg.WebhookClaimLease, log: log, m: newWebhookMetrics(cfg.Registry), poke: make(chan struct{}, 1),
			tracer: tracer}
		w.hookSrv = asynq.NewServer(cfg.Redis, asynq.Config{
			Concurrency:     cfg.WebhookConcurrency,
			Queues:          map[string]int{webhookQueue: 1},
			ShutdownTimeout: cfg.ShutdownTimeout,
			// As the runs' server: an attempt enqueued waits at most ~30 ms.
			TaskCheckInterval: 20 * time.Millisecond,
			Logger:            slogAdapter{log},
			LogLevel:          asynq.WarnLevel,
			ErrorHandler: asynq.ErrorHandlerFunc(func(ctx context.Context, t *asynq.Task, err error) {
				m.failed.WithLabelValues(t.Type()).Inc()
				log.WarnContext(ctx, "webhook attempt failed to run; its delivery is due again once its claim runs out", "error", err)
			}),
		})
	}
	w.notice = newEndedNotice(rc)
	w.runs.ended = w.notice.ended
	if hooks := w.hooks; hooks != nil {
		w.runs.ended = func() {
			hooks.wake()
			w.notice.ended()
		}
	}
	return w, nil
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
		if err == nil {
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

// Start runs the server, the scheduler and the sweeper in the background.
func (w *Worker) Start(ctx context.Context) error {
	if err := w.server.Start(w.Mux()); err != nil {
		return fmt.Errorf("start task server: %w", err)
	}
	if w.hooks != nil {
		mux := asynq.NewServeMux()
		mux.Handle(TypeWebhookDeliver, w.hooks)
		mux.Use(w.countProcessed)
		if err := w.hookSrv.Start(mux); err != nil {
			w.server.Shutdown()
			return fmt.Errorf("start webhook task server: %w", err)
		}
	}
	ctx, w.cancel = context.WithCancel(context.WithoutCancel(ctx))
	w.running.Store(true)
	w.local.open()
	if w.runs.fastBudget > 0 && !w.noDirect {
		w.direct.start()
	}
	if w.hooks != nil {
		w.wg.Go(func() { w.hooks.run(ctx) })
	}
	w.wg.Go(func() { w.watchBacklog(ctx, w.cfg.BacklogInterval) })
	w.wg.Go(func() { w.notice.run(ctx) })
	w.wg.Add(2)
	go func() {
		defer w.wg.Done()
		w.sweeper.Run(ctx)
	}()
	go func() {
		defer w.wg.Done()
		w.scheduleCleanup(ctx)
	}()
	w.log.InfoContext(ctx, "worker started", "concurrency", w.cfg.Concurrency, "cleanup_schedule", w.cfg.CleanupSchedule,
		"run_lease", w.cfg.RunLease, "run_heartbeat", w.cfg.RunHeartbeat, "sweep_interval", w.cfg.SweepInterval, "poll_interval", w.cfg.PollInterval)
	return nil
}

// Shutdown stops taking work, lets in-flight tasks finish for up to
// ShutdownTimeout and hands the rest back to the queue. A run handed back
// releases its lease first, so another worker takes it at once.
func (w *Worker) Shutdown() {
	w.running.Store(false)
	w.direct.stop()
	w.local.close(w.cfg.ShutdownTimeout)
	w.direct.leave()
	w.cancel()
	w.wg.Wait()
	w.server.Stop()
	if w.hooks != nil {
		w.hookSrv.Stop()
	}
	w.runs.handBack(w.cfg.ShutdownTimeout)
	w.server.Shutdown()
	if w.hooks != nil {
		w.hookSrv.Shutdown()
	}
	_ = w.inspector.Close()
	_ = w.client.Close()
	_ = w.queue.client.Close()
	_ = w.queue.redis.Close()
	_ = w.redis.Close()
	w.log.Info("worker stopped")
}

// RunHere executes r, a run this process has just committed, in this
// process at once if one of its local slots (4 per WORKER_CONCURRENCY) is
// free (single-node mode: serve --worker), and reports whether it took r;
// if not, the caller hands r to the queue. See localLane.
func (w *Worker) RunHere(r *models.QueuedRun) bool { return w.local.take(r) }

// requeue hands p to the queue through the gate (the local lane's runs
// it could not decide).
func (w *Worker) requeue(ctx context.Context, p RunPayload) error {
	return w.queue.send(ctx, admission{org: p.OrgID, recorded: true, in: []RunPayload{p}})
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

// maxRetryDelay caps the doubling retry delay of a failing task.
const maxRetryDelay = time.Minute

// retryDelay is the asynq RetryDelayFunc: base after a transient database
// error or a run handed back at shutdown (which asynq does not count, so n
// stays put), base doubled per
// retry for a run task's failures, asynq's default (15 s and more) for
// other tasks' failures. Each delay is jittered down by up to a half, so
// tasks that failed together do not retry together.
func retryDelay(base time.Duration) asynq.RetryDelayFunc {
	return func(n int, err error, t *asynq.Task) time.Duration {
		d := base
		switch {
		case notAFailure(err):
		case t.Type() == TypeRunExecute, t.Type() == TypeRunBatch:
			for i := 0; i < n && d < maxRetryDelay; i++ {
				d *= 2
			}
			d = min(d, max(base, maxRetryDelay))
		default:
			return asynq.DefaultRetryDelayFunc(n, err, t)
		}
		return d/2 + rand.N(d/2+1)
	}
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
