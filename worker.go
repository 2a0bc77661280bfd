package main

import (
	"context"
	"io"

	"github.com/prometheus/client_golang/prometheus"
)

// workerProcess is the worker running inside this process.
type workerProcess struct {
	registry *prometheus.Registry
}

func (w *workerProcess) stop() {}

func startWorker(ctx context.Context, a *app) (*workerProcess, error) {
	return nil, &exitError{"the worker is not built yet"}
}

func cmdWorker(ctx context.Context, args []string, out io.Writer) error {
	return &exitError{"the worker is not built yet"}
}

// newRegistry is the metrics registry /metrics serves: the worker's when it
// runs in this process, so one scrape sees both.
func newRegistry(w *workerProcess) *prometheus.Registry {
	if w != nil {
		return w.registry
	}
	return prometheus.NewRegistry()
}
