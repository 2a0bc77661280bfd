package tasks

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics of the worker.
type metrics struct {
	processed   *prometheus.CounterVec
	failed      *prometheus.CounterVec
	keysDeleted prometheus.Counter
	runsEnded   *prometheus.CounterVec
	redelivered *prometheus.CounterVec
	leasesLost  prometheus.Counter
	sweeps      *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		processed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "valruns_tasks_processed_total", Help: "Tasks handled successfully, by type.",
		}, []string{"type"}),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "valruns_tasks_failed_total", Help: "Task executions that returned an error (asynq retries them), by type.",
		}, []string{"type"}),
		keysDeleted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "valruns_idempotency_keys_deleted_total", Help: "Expired idempotency keys deleted by the cleanup.",
		}),
		runsEnded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "valruns_runs_finished_total", Help: "Runs this worker ended, by final status (passed, failed, error).",
		}, []string{"status"}),
		redelivered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "valruns_runs_redelivered_total",
			Help: "Runs the sweeper re-enqueued because nothing was delivering them, by reason (queued: its task was lost; lease_expired: its worker died or stopped heartbeating; held_unclaimed: queued, its task held by a worker that died or stopped before claiming it).",
		}, []string{"reason"}),
		leasesLost: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "valruns_run_leases_lost_total",
			Help: "Executions this worker stopped or discarded because another delivery took their run over (their lease ran out).",
		}),
		sweeps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "valruns_run_sweeps_total", Help: "Sweeps for stranded runs, by result (ok, error).",
		}, []string{"result"}),
	}
	// Every label value of a closed set is exported from the start, at 0.
	for _, r := range []string{"queued", "lease_expired", "held_unclaimed"} {
		m.redelivered.WithLabelValues(r)
	}
	for _, r := range []string{"ok", "error"} {
		m.sweeps.WithLabelValues(r)
	}
	for _, c := range []prometheus.Collector{m.processed, m.failed, m.keysDeleted, m.runsEnded, m.redelivered, m.leasesLost, m.sweeps} {
		reg.MustRegister(c)
	}
	return m
}
