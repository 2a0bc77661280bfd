package handlers

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

type metrics struct {
	requests    *prometheus.CounterVec
	latency     *prometheus.HistogramVec
	idempotency *prometheus.CounterVec
	// Where a start's time goes in its one-step path: waiting for a writer,
	// then its statement; and how many starts a statement carries.
	startPhase *prometheus.HistogramVec
	startBatch prometheus.Histogram
}

// startPhaseBuckets are sub-millisecond to seconds: a lone start's
// statement takes about a millisecond.
var startPhaseBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

func newMetrics(reg *prometheus.Registry) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "valruns_http_requests_total", Help: "HTTP requests by route, method and status.",
		}, []string{"route", "method", "status"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "valruns_http_request_duration_seconds", Help: "HTTP request latency by route and method.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"route", "method"}),
		idempotency: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "valruns_idempotency_requests_total",
			Help: "Idempotent requests by scope and outcome (new, replayed, mismatch, in_progress, rejected, expired_reused, no_key, error).",
		}, []string{"scope", "outcome"}),
		startPhase: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "valruns_start_phase_seconds",
			Help:    "Where the starts of the one-step path spend their time, by phase: waiting_writer (from the start's submission to its statement being sent; a lone start on an idle process waits microseconds) and statement (the statement that carried it, from taking a connection to its answers and commit).",
			Buckets: startPhaseBuckets,
		}, []string{"phase"}),
		startBatch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "valruns_start_batch_starts",
			Help:    "Starts carried by each statement of the one-step path (1: a lone start; up to 64 when PostgreSQL is busy).",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64},
		}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.latency, m.idempotency, m.startPhase, m.startBatch} {
		reg.MustRegister(c)
	}
	// Process and Go runtime metrics, unless main registered them already.
	_ = reg.Register(collectors.NewGoCollector())
	_ = reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// observeStarts is told by the run store about each statement of starts.
func (m *metrics) observeStarts(waited []time.Duration, statement time.Duration) {
	wait, stmt := m.startPhase.WithLabelValues("waiting_writer"), m.startPhase.WithLabelValues("statement")
	for _, w := range waited {
		wait.Observe(w.Seconds())
		stmt.Observe(statement.Seconds())
	}
	m.startBatch.Observe(float64(len(waited)))
}

func (m *metrics) middleware() gin.HandlerFunc {
	return func(c *gin.Context) {
		start := time.Now()
		c.Next()
		// Labels take values from closed sets only, so that no client can
		// grow /metrics: the route's pattern (never a path with ids in it),
		// a known method, the status code.
		route := c.FullPath()
		if route == "" {
			route = "unmatched"
		}
		route = strings.TrimSuffix(route, "/*any")
		method := methodLabel(c.Request.Method)
		m.requests.WithLabelValues(route, method, strconv.Itoa(c.Writer.Status())).Inc()
		m.latency.WithLabelValues(route, method).Observe(time.Since(start).Seconds())
	}
}

// methodLabel is the method as a metric label: one of the methods of RFC
// 9110 (and PATCH), or "other" for anything a client invents.
func methodLabel(m string) string {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace:
		return m
	}
	return "other"
}

func (m *metrics) observeIdempotency(scope, outcome string) {
	m.idempotency.WithLabelValues(scope, outcome).Inc()
}

// promhttpHandler godoc
//
//	@Summary		Prometheus metrics
//	@ID			metrics
//	@Description	Prometheus metrics in the text exposition format: HTTP requests and latency by route, idempotent requests by scope and outcome (new, replayed, mismatch, in_progress, rejected, expired_reused, no_key, error), Go runtime and process metrics. No authentication.
//	@Tags			health
//	@Produce		plain
//	@Success		200	{string}	string	"Metrics in the Prometheus text exposition format (Content-Type text/plain; version=0.0.4)."
//	@Router			/metrics [get]
//
// promhttpHandler serves the registry's metrics.
func promhttpHandler(reg *prometheus.Registry) http.Handler {
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})
}
