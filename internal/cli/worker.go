package cli

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/valruns/valruns/config"
	"github.com/valruns/valruns/handlers"
	"github.com/valruns/valruns/problem"
	"github.com/valruns/valruns/tasks"
)

// workerProcess is the worker running inside this process.
type workerProcess struct {
	w        *tasks.Worker
	registry *prometheus.Registry
}

func (p *workerProcess) stop() { p.w.Shutdown() }

// startWorker connects to Redis and starts the task server, the scheduler
// and the sweeper.
func startWorker(ctx context.Context, a *app) (*workerProcess, error) {
	redisOpt, err := tasks.ParseRedisURL(a.cfg.RedisURL)
	if err != nil {
		return nil, &config.Error{Var: "REDIS_URL", Value: redact(a.cfg.RedisURL), Problem: oneLine(err)}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	w, err := tasks.NewWorker(tasks.Config{
		DB: a.db, Redis: redisOpt,
		Concurrency: a.cfg.WorkerConcurrency, CleanupSchedule: a.cfg.CleanupSchedule,
		CleanupBatchSize: a.cfg.CleanupBatchSize, KeyTTL: a.cfg.IdempotencyTTL, RunLease: a.cfg.RunLease, RunHeartbeat: a.cfg.RunHeartbeat,
		RunMaxRetry: a.cfg.RunMaxRetry, RetryDelay: a.cfg.RunRetryDelay, RunTimeout: a.cfg.RunTimeout,
		SweepInterval: a.cfg.RunSweepInterval, PollInterval: a.cfg.RunPollInterval, RedeliverAfter: a.cfg.RunRedeliverAfter, FastBudget: fastBudget(a.cfg.RunFastPath),
		RunShare:           a.cfg.OrgRunShare,
		ShutdownTimeout:    a.cfg.ShutdownTimeout,
		WebhookConcurrency: webhookConcurrency(a.cfg.WebhookConcurrency), WebhookPollInterval: a.cfg.WebhookPollInterval,
		WebhookRetryBase: a.cfg.WebhookRetryBase, WebhookRetryHorizon: a.cfg.WebhookRetryHorizon,
		WebhookRetention: a.cfg.WebhookDeliveryRetention, WebhookClaimLease: a.cfg.WebhookClaimLease,
		WebhookAllowPrivate: a.cfg.WebhookAllowPrivateTargets, EventData: handlers.RunEventData,
		Registry: reg, Log: a.log, Tracing: a.tracing,
	})
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := w.Ping(pctx); err != nil {
		return nil, &config.Error{Var: "REDIS_URL", Value: redact(a.cfg.RedisURL), Problem: "cannot connect: " + oneLine(err)}
	}
	if err := w.Start(ctx); err != nil {
		return nil, err
	}
	return &workerProcess{w: w, registry: reg}, nil
}

// fastBudget is RUN_FAST_PATH as tasks.Config.FastBudget takes it.
func fastBudget(d time.Duration) time.Duration {
	if d == 0 {
		return -1 // off
	}
	return d
}

// webhookConcurrency is WEBHOOK_CONCURRENCY as tasks.Config takes it.
func webhookConcurrency(n int) int {
	if n == 0 {
		return -1 // this worker sends none
	}
	return n
}

// startDispatcher starts the hand-off of committed runs to the queue.
func startDispatcher(a *app, reg prometheus.Registerer) (*tasks.Dispatcher, error) {
	redisOpt, err := tasks.ParseRedisURL(a.cfg.RedisURL)
	if err != nil {
		return nil, &config.Error{Var: "REDIS_URL", Value: redact(a.cfg.RedisURL), Problem: oneLine(err)}
	}
	return tasks.NewDispatcher(tasks.DispatcherConfig{Redis: redisOpt, MaxRetry: a.cfg.RunMaxRetry,
		Timeout: a.cfg.RunTimeout, GiveUp: a.cfg.RunRedeliverAfter, RunShare: a.cfg.OrgRunShare, Registry: reg, Log: a.log,
		Tracing: a.tracing}), nil
}

// rateLimitRedis connects (lazily) to the Redis that holds the start rate
// buckets: REDIS_URL, with timeouts no longer than the limit waits for an
// answer (a slow Redis never delays a start).
func rateLimitRedis(a *app) (redis.UniversalClient, error) {
	opt, err := tasks.ParseRedisURL(a.cfg.RedisURL)
	if err != nil {
		return nil, &config.Error{Var: "REDIS_URL", Value: redact(a.cfg.RedisURL), Problem: oneLine(err)}
	}
	t := handlers.RateLimitTimeout
	switch o := opt.(type) {
	case asynq.RedisClientOpt:
		o.DialTimeout, o.ReadTimeout, o.WriteTimeout = t, t, t
		opt = o
	case asynq.RedisFailoverClientOpt:
		o.DialTimeout, o.ReadTimeout, o.WriteTimeout = t, t, t
		opt = o
	}
	rc, ok := opt.MakeRedisClient().(redis.UniversalClient)
	if !ok {
		return nil, &config.Error{Var: "REDIS_URL", Value: redact(a.cfg.RedisURL), Problem: "not a Redis client URL"}
	}
	return rc, nil
}

func cmdWorker(ctx context.Context, args []string, out io.Writer) error {
	fs := flags("worker", "worker", out,
		"Runs the task server, the cleanup schedule and the stranded-run sweeper until SIGINT or SIGTERM, and\n"+
			"serves /metrics, /healthz and /readyz on WORKER_METRICS_ADDR.")
	if err := parseFlagsOnly(fs, args); err != nil {
		return err
	}
	p, err := startProcess(ctx, "WORKER_METRICS_ADDR", func(c config.Config) string { return c.WorkerMetricsAddr })
	if err != nil {
		return err
	}
	defer p.stop()
	a, ln := p.app, p.ln
	worker, err := startWorker(ctx, a)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(worker.registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintln(w, `{"status":"ok"}`)
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) { workerReadyz(w, r, worker.w) })
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	a.serveInBackground(srv, ln, "worker metrics")
	a.log.InfoContext(ctx, "worker running", "metrics", "http://"+ln.Addr().String()+"/metrics")
	<-ctx.Done()
	a.log.Info("shutting down worker", "timeout", a.cfg.ShutdownTimeout)
	worker.stop() // in-flight tasks finish or go back to the queue
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return srv.Shutdown(sctx)
}

// workerReadyz is the worker's /readyz: 200 while its task server runs and
// PostgreSQL and Redis answer within 2 s, else 503 with a problem document
// that says which (code not_ready), as the API's /readyz answers.
func workerReadyz(w http.ResponseWriter, r *http.Request, worker *tasks.Worker) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := worker.Ready(ctx); err != nil {
		w.Header().Set("Content-Type", problem.ContentType)
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusServiceUnavailable)
		d := problem.New(http.StatusServiceUnavailable, problem.NotReady, err.Error())
		d.Instance = r.URL.Path
		_, _ = w.Write(d.Body())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintln(w, `{"status":"ok"}`)
}

// newRegistry is the metrics registry /metrics serves: the worker's when it
// runs in this process, so one scrape sees both.
func newRegistry(w *workerProcess) *prometheus.Registry {
	if w != nil {
		return w.registry
	}
	return prometheus.NewRegistry()
}
