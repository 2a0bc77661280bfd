package tasks

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/valruns/valruns/models"
)

// metrics of the worker.
type metrics struct {
	processed   *prometheus.CounterVec
	failed      *prometheus.CounterVec
	enqueued    prometheus.Counter
	keysDeleted prometheus.Counter
	runsEnded   *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, staged *models.StagedJobStore) *metrics {
	m := &metrics{
		processed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "valruns_tasks_processed_total", Help: "Tasks handled successfully, by type.",
		}, []string{"type"}),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "valruns_tasks_failed_total", Help: "Task executions that returned an error (asynq retries them), by type.",
		}, []string{"type"}),
		enqueued: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "valruns_staged_jobs_enqueued_total", Help: "Staged jobs moved from PostgreSQL to asynq.",
		}),
		keysDeleted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "valruns_idempotency_keys_deleted_total", Help: "Expired idempotency keys deleted by the cleanup.",
		}),
		runsEnded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "valruns_runs_finished_total", Help: "Runs this worker ended, by final status (passed, failed, error).",
		}, []string{"status"}),
	}
	backlog := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "valruns_staged_jobs_backlog", Help: "Staged jobs not yet moved to asynq (read at scrape time).",
	}, func() float64 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		n, err := staged.Backlog(ctx)
		if err != nil {
			return -1
		}
		return float64(n)
	})
	for _, c := range []prometheus.Collector{m.processed, m.failed, m.enqueued, m.keysDeleted, m.runsEnded, backlog} {
		reg.MustRegister(c)
	}
	return m
}
