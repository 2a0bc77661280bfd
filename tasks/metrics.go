package tasks

import (
	"context"
	"time"

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
	// The keys' day partitions, as the last cleanup left them.
	partitionsAhead prometheus.Gauge
	oldestPartition prometheus.Gauge
	// What an SLO is written on: each run's time from its start to its
	// final state, by final status (observed where the run ended), and the
	// backlog, read on a timer (watchBacklog).
	startToFinal     *prometheus.HistogramVec
	startToPicked    prometheus.Histogram
	unfinished       prometheus.Gauge
	oldestUnfinished prometheus.Gauge
	gateWaiting      prometheus.Gauge
}

// taskTypes are the worker's task types: the closed set of
// valruns_tasks_processed_total's and valruns_tasks_failed_total's label.
var taskTypes = []string{TypeRunExecute, TypeRunBatch, TypeCleanup, TypeWebhookDeliver}

// finalStatuses are the statuses a run ends in: the closed set of
// valruns_run_start_to_final_seconds's label.
var finalStatuses = []string{"passed", "failed", "error"}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		processed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "valruns_tasks_processed_total", Help: "Tasks handled successfully, by type.",
		}, []string{"type"}),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "valruns_tasks_failed_total", Help: "Task executions that returned an error (asynq retries them), by type.",
		}, []string{"type"}),
		keysDeleted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "valruns_idempotency_keys_deleted_total",
			Help: "Expired idempotency keys deleted by the cleanup, with the partitions it dropped (a partition is counted up to 100,000 keys; past that, the planner's estimate, or 100,000 when it has none).",
		}),
		partitionsAhead: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "valruns_idempotency_partitions_ahead",
			Help: "Day partitions of the idempotency keys made ahead (starting after now), as the last cleanup left them.",
		}),
		oldestPartition: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "valruns_idempotency_oldest_partition_timestamp_seconds",
			Help: "Start (Unix time) of the oldest day partition of the idempotency keys kept, as the last cleanup left them.",
		}),
		runsEnded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "valruns_runs_finished_total", Help: "Runs this worker ended, by final status (passed, failed, error).",
		}, []string{"status"}),
		redelivered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "valruns_runs_redelivered_total",
			Help: "Runs the sweeper handed on because nothing was delivering them, by reason (queued: nothing held it; lease_expired: its worker died or stopped heartbeating; taker_stopped: taken by a worker that died or stopped, moved back to the ready list).",
		}, []string{"reason"}),
		leasesLost: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "valruns_run_leases_lost_total",
			Help: "Executions this worker stopped or discarded because another delivery took their run over (their lease ran out).",
		}),
		sweeps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "valruns_run_sweeps_total", Help: "Sweeps for stranded runs, by result (ok, error).",
		}, []string{"result"}),
		startToFinal: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "valruns_run_start_to_final_seconds",
			Help:    "Time from a run's start (created_at) to its final state (finished_at), by final status (passed, failed, error); observed by the worker that ended it.",
			Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600},
		}, []string{"status"}),
		startToPicked: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "valruns_run_start_to_picked_seconds",
			Help:    "Time from a run's start (created_at) to a worker beginning its first delivery (the hand-off: the API's dispatch, the fair-share gate, the queue, the worker's poll); observed by that worker.",
			Buckets: handOffBuckets,
		}),
		unfinished: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "valruns_runs_unfinished",
			Help: "Runs not final yet (queued or running), all organisations; read from PostgreSQL every 10 s.",
		}),
		oldestUnfinished: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "valruns_runs_oldest_unfinished_seconds",
			Help: "Age of the oldest run not final yet (0: none); read from PostgreSQL every 10 s.",
		}),
		gateWaiting: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "valruns_runs_waiting_fair_share",
			Help: "Runs waiting at the fair-share gate for their organisation's turn to enter the queue, all organisations; read from Redis every 10 s.",
		}),
	}
	// Every label value of a closed set is exported from the start, at 0:
	// a rate, or an alert's ratio, over a series that appears at its first
	// event misses that event.
	for _, t := range taskTypes {
		m.processed.WithLabelValues(t)
		m.failed.WithLabelValues(t)
	}
	for _, r := range []string{"queued", "lease_expired", "taker_stopped"} {
		m.redelivered.WithLabelValues(r)
	}
	for _, r := range []string{"ok", "error"} {
		m.sweeps.WithLabelValues(r)
	}
	for _, s := range finalStatuses {
		m.startToFinal.WithLabelValues(s)
	}
	for _, c := range []prometheus.Collector{m.processed, m.failed, m.keysDeleted, m.partitionsAhead, m.oldestPartition, m.runsEnded, m.redelivered, m.leasesLost, m.sweeps,
		m.startToFinal, m.startToPicked, m.unfinished, m.oldestUnfinished, m.gateWaiting} {
		reg.MustRegister(c)
	}
	return m
}

// handOffBuckets are the buckets of the hand-off's histograms: about a
// millisecond at light load, seconds behind a backlog.
var handOffBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

// picked observes a run's first delivery beginning (a redelivery, or a
// payload without its start time, is not a hand-off).
func (m *metrics) picked(p RunPayload) {
	if !p.Redelivery && !p.CreatedAt.IsZero() {
		m.startToPicked.Observe(time.Since(p.CreatedAt).Seconds())
	}
}

// observeEnded is told by the run store about each run it ended.
func (m *metrics) observeEnded(status string, startToFinal time.Duration) {
	m.startToFinal.WithLabelValues(status).Observe(startToFinal.Seconds())
}

// backlogEvery is how often a worker reads the backlog for its gauges: one
// statement and one Redis call per worker every 10 s, whoever scrapes.
const backlogEvery = 10 * time.Second

// readBacklog sets the backlog's gauges; a read that fails leaves them as
// they were (the sweeper's errors say why).
func (w *Worker) readBacklog(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if b, err := w.runs.runs.ReadBacklog(ctx); err == nil {
		w.m.unfinished.Set(float64(b.Unfinished))
		w.m.oldestUnfinished.Set(b.Oldest.Seconds())
	}
	if n, err := w.queue.gate.waiting(ctx); err == nil {
		w.m.gateWaiting.Set(float64(n))
	}
}

// watchBacklog reads the backlog every interval until ctx is done.
func (w *Worker) watchBacklog(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		w.readBacklog(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
