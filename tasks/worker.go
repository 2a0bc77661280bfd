package tasks

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"github.com/valruns/valruns/config"
	"github.com/valruns/valruns/models"
)

// Config configures a Worker; zero values take the defaults named.
type Config struct {
	// DB is the PostgreSQL pool; DBURL the same database's URL, for the
	// enqueuer's LISTEN connection.
	DB    *gorm.DB
	DBURL string
	// Redis is where asynq keeps its queues.
	Redis asynq.RedisConnOpt
	// Concurrency is how many tasks run at once; 0 means 10.
	Concurrency int
	// CleanupSchedule is the cron spec of the periodic cleanup; "" means @hourly.
	CleanupSchedule string
	// CleanupBatchSize is the keys deleted per transaction; 0 means 1000.
	CleanupBatchSize int
	// RunLease is how long a delivery owns a running run; 0 means 5m.
	RunLease time.Duration
	// RunMaxRetry is how often a failing run task is retried before the run
	// ends in error; 0 means 5.
	RunMaxRetry int
	// PollInterval is the enqueuer's fallback poll; 0 means 1s.
	PollInterval time.Duration
	// ShutdownTimeout is how long in-flight tasks may finish at shutdown
	// before they are handed back to the queue; 0 means 20s.
	ShutdownTimeout time.Duration
	// Registry receives the worker's metrics; nil means a private one.
	Registry prometheus.Registerer
	// Log; nil discards.
	Log *slog.Logger
}

// Worker is the background side of valruns in one process: an asynq server
// with its mux, an asynq scheduler registering the periodic cleanup, and the
// staged-job enqueuer.
type Worker struct {
	cfg       Config
	log       *slog.Logger
	server    *asynq.Server
	scheduler *asynq.Scheduler
	client    *asynq.Client
	enqueuer  *Enqueuer
	runs      *RunExecutor
	cleanup   *Cleanup
	cancel    context.CancelFunc
	wg        sync.WaitGroup
}

// NewWorker builds a worker; Start runs it.
func NewWorker(cfg Config) (*Worker, error) {
	cfg.Concurrency = cmp.Or(cfg.Concurrency, 10)
	cfg.CleanupSchedule = cmp.Or(cfg.CleanupSchedule, "@hourly")
	cfg.CleanupBatchSize = cmp.Or(cfg.CleanupBatchSize, 1000)
	cfg.RunLease = cmp.Or(cfg.RunLease, 5*time.Minute)
	cfg.RunMaxRetry = cmp.Or(cfg.RunMaxRetry, 5)
	cfg.PollInterval = cmp.Or(cfg.PollInterval, time.Second)
	cfg.ShutdownTimeout = cmp.Or(cfg.ShutdownTimeout, 20*time.Second)
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	sched, err := config.ParseSchedule(cfg.CleanupSchedule)
	if err != nil {
		return nil, err
	}
	staged := models.NewStagedJobStore(cfg.DB)
	m := newMetrics(cfg.Registry, staged)
	w := &Worker{cfg: cfg, log: log}
	w.runs = &RunExecutor{runs: models.NewRunStore(cfg.DB), lease: cfg.RunLease, log: log, m: m}
	w.cleanup = &Cleanup{keys: models.NewKeyStore(cfg.DB), batch: cfg.CleanupBatchSize, log: log, m: m}
	w.client = asynq.NewClient(cfg.Redis)
	runOpts := func() []asynq.Option {
		// Timeout = lease: a delivery never works past the lease that fences it.
		return []asynq.Option{asynq.MaxRetry(cfg.RunMaxRetry), asynq.Timeout(cfg.RunLease), asynq.Retention(24 * time.Hour)}
	}
	w.runs.takeover = func(ctx context.Context, runID string, attempt int, at time.Time) error {
		task, _, err := NewRunTask(runID) // not its TaskID: the original delivery holds that one
		if err != nil {
			return err
		}
		opts := append(runOpts(), asynq.TaskID(fmt.Sprintf("%s%s:takeover:%d", models.RunTaskIDPrefix, runID, attempt)), asynq.ProcessAt(at))
		_, err = w.client.EnqueueContext(ctx, task, opts...)
		if errors.Is(err, asynq.ErrTaskIDConflict) {
			return nil // already scheduled by another delivery
		}
		return err
	}
	w.enqueuer = &Enqueuer{
		staged: staged, client: w.client, dbURL: cfg.DBURL, batch: 100, poll: cfg.PollInterval, log: log, m: m,
		opts: func(j models.StagedJob) []asynq.Option {
			if j.JobName != TypeRunExecute {
				return nil
			}
			return runOpts()
		},
	}
	w.server = asynq.NewServer(cfg.Redis, asynq.Config{
		Concurrency:     cfg.Concurrency,
		ShutdownTimeout: cfg.ShutdownTimeout,
		// asynq sleeps this long when its queues are empty (default 1s): a
		// run staged and enqueued at once would wait for it. One Redis call
		// per 100 ms per idle worker is cheap.
		TaskCheckInterval:        100 * time.Millisecond,
		DelayedTaskCheckInterval: time.Second,
		Logger:                   slogAdapter{log},
		LogLevel:                 asynq.WarnLevel,
		ErrorHandler: asynq.ErrorHandlerFunc(func(ctx context.Context, t *asynq.Task, err error) {
			m.failed.WithLabelValues(t.Type()).Inc()
			log.WarnContext(ctx, "task failed", "type", t.Type(), "error", err)
			if t.Type() == TypeRunExecute {
				w.runs.failed(ctx, t, err)
			}
		}),
	})
	w.scheduler = asynq.NewScheduler(cfg.Redis, &asynq.SchedulerOpts{
		Location: time.UTC,
		Logger:   slogAdapter{log},
		LogLevel: asynq.WarnLevel,
		// Each tick's cleanup gets the tick's TaskID (see tickID), so several
		// workers' schedulers enqueue it once. asynq hands us the entry's
		// option slice itself; we replace the TaskID placeholder in it.
		PreEnqueueFunc: func(t *asynq.Task, opts []asynq.Option) {
			if t.Type() != TypeCleanup {
				return
			}
			for i, o := range opts {
				if o.Type() == asynq.TaskIDOpt {
					opts[i] = asynq.TaskID(tickID(sched, time.Now()))
				}
			}
		},
		PostEnqueueFunc: func(info *asynq.TaskInfo, err error) {
			switch {
			case errors.Is(err, asynq.ErrTaskIDConflict):
				log.Debug("cleanup tick already enqueued by another worker")
			case err != nil:
				log.Warn("could not enqueue periodic task", "error", err)
			default:
				log.Debug("periodic task enqueued", "type", info.Type, "id", info.ID)
			}
		},
	})
	if _, err := w.scheduler.Register(cfg.CleanupSchedule, asynq.NewTask(TypeCleanup, nil),
		asynq.TaskID(cleanupTaskIDPrefix+"placeholder"), asynq.Retention(time.Hour), asynq.MaxRetry(3)); err != nil {
		return nil, fmt.Errorf("register cleanup: %w", err)
	}
	return w, nil
}

// Mux routes task types to their handlers, counting outcomes.
func (w *Worker) Mux() *asynq.ServeMux {
	mux := asynq.NewServeMux()
	mux.Handle(TypeRunExecute, w.runs)
	mux.Handle(TypeCleanup, w.cleanup)
	mux.Use(func(next asynq.Handler) asynq.Handler {
		return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
			err := next.ProcessTask(ctx, t)
			if err == nil {
				w.runs.m.processed.WithLabelValues(t.Type()).Inc()
			}
			return err
		})
	})
	return mux
}

// Ping checks Redis.
func (w *Worker) Ping(ctx context.Context) error {
	rc, ok := w.cfg.Redis.MakeRedisClient().(redis.UniversalClient)
	if !ok {
		return errors.New("redis: unsupported connection option")
	}
	defer rc.Close()
	return rc.Ping(ctx).Err()
}

// Start runs the server, the scheduler and the enqueuer in the background.
func (w *Worker) Start(ctx context.Context) error {
	if err := w.server.Start(w.Mux()); err != nil {
		return fmt.Errorf("start task server: %w", err)
	}
	if err := w.scheduler.Start(); err != nil {
		w.server.Shutdown()
		return fmt.Errorf("start scheduler: %w", err)
	}
	ctx, w.cancel = context.WithCancel(context.WithoutCancel(ctx))
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		w.enqueuer.Run(ctx)
	}()
	w.log.InfoContext(ctx, "worker started", "concurrency", w.cfg.Concurrency, "cleanup_schedule", w.cfg.CleanupSchedule)
	return nil
}

// Shutdown stops taking work, lets in-flight tasks finish for up to
// ShutdownTimeout and hands the rest back to the queue.
func (w *Worker) Shutdown() {
	w.cancel()
	w.wg.Wait()
	w.scheduler.Shutdown()
	w.server.Shutdown()
	_ = w.client.Close()
	w.log.Info("worker stopped")
}

// Enqueuer returns the staged-job enqueuer (tests drain it by hand).
func (w *Worker) Enqueuer() *Enqueuer { return w.enqueuer }

func cmpOr[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
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
