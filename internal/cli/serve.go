package cli

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valruns/valruns/config"
	"github.com/valruns/valruns/handlers"
	"github.com/valruns/valruns/tasks"
)

func cmdServe(ctx context.Context, args []string, out io.Writer) error {
	fs := flags("serve", "serve [--worker]", out,
		"Runs the HTTP API on HTTP_ADDR until SIGINT or SIGTERM. Then /readyz answers 503 while requests are\n"+
			"still served for SHUTDOWN_DRAIN (a second signal ends it), and the server shuts down gracefully.")
	withWorker := fs.Bool("worker", false, "also run the worker in this process (single-node mode)")
	if err := parseFlagsOnly(fs, args); err != nil {
		return err
	}
	p, err := startProcess(ctx, "HTTP_ADDR", func(c config.Config) string { return c.HTTPAddr })
	if err != nil {
		return err
	}
	defer p.stop()
	a, ln := p.app, p.ln
	if !*withWorker {
		setMemoryLimit(a, os.Getenv("GOMEMLIMIT"))
	}
	var worker *workerProcess
	if *withWorker {
		if worker, err = startWorker(ctx, a); err != nil {
			return err
		}
	}
	// At SIGTERM the process drains (drain): /readyz answers 503 while
	// requests are still served; then stopping closes, and long-polls
	// answer at once instead of holding up the shutdown.
	var draining atomic.Bool
	stopping := make(chan struct{})
	deps := handlers.Deps{Config: a.cfg, DB: a.db, Log: a.log, Registry: newRegistry(worker), Stop: stopping,
		Ready: func(ctx context.Context) error {
			if draining.Load() {
				return errDraining
			}
			if worker != nil {
				return worker.w.Ready(ctx)
			}
			return nil
		},
		Tracing: a.tracing}
	if deps.Redis, err = rateLimitRedis(a); err != nil {
		return err
	}
	defer deps.Redis.Close()
	// The long-poll looks as soon as a worker says runs ended.
	deps.RunsEnded = tasks.WatchRunsEnded(ctx, deps.Redis)
	dispatcher, err := startDispatcher(a, deps.Registry)
	if err != nil {
		return err
	}
	deps.HandOff = dispatcher.HandOff
	srv := &http.Server{
		Handler:           handlers.New(deps),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       time.Minute,
		IdleTimeout:       2 * time.Minute,
	}
	a.log.InfoContext(ctx, "serving", "addr", ln.Addr().String(), "worker", *withWorker)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	draining.Store(true)
	drain(a, srv)
	close(stopping)
	a.log.Info("shutting down", "timeout", a.cfg.ShutdownTimeout)
	sctx, cancel := context.WithTimeout(context.Background(), a.cfg.ShutdownTimeout)
	defer cancel()
	err = srv.Shutdown(sctx) // in-flight requests finish; their transactions commit
	// Then every run they started goes to the queue, within the same
	// deadline: a graceful stop leaves none to the sweeper.
	dispatcher.Shutdown(sctx)
	if worker != nil {
		worker.stop()
	}
	return err
}

// errDraining is /readyz's answer while the process drains.
var errDraining = errors.New("the server is shutting down")

// drain keeps srv serving for SHUTDOWN_DRAIN once the process was told to
// stop (its /readyz already answers 503), so that a load balancer sees it
// leave before it stops accepting requests; a second SIGINT or SIGTERM
// ends the drain at once. Each answer meanwhile closes its connection (no
// keep-alive), so a client's next request connects again, through the load
// balancer, to a server that is staying.
func drain(a *app, srv *http.Server) {
	if a.cfg.ShutdownDrain <= 0 {
		return
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sig)
	srv.SetKeepAlivesEnabled(false)
	a.log.Info("draining: /readyz answers 503, requests are still served (a second signal stops now)", "drain", a.cfg.ShutdownDrain)
	t := time.NewTimer(a.cfg.ShutdownDrain)
	defer t.Stop()
	select {
	case <-t.C:
	case <-sig:
		a.log.Info("second signal: drain ended")
	}
}

// setMemoryLimit gives the Go runtime the API's soft memory limit
// (config.MemoryLimit), so that a burst of large bodies is collected as it
// goes instead of doubling the heap; an operator's GOMEMLIMIT (env, which
// the runtime has applied already) wins.
func setMemoryLimit(a *app, env string) {
	limit := a.cfg.MemoryLimit()
	if env != "" || limit <= 0 {
		return
	}
	debug.SetMemoryLimit(limit)
	a.log.Info("soft memory limit", "bytes", limit, "from", "64 MiB + 48 x MAX_BODY_BYTES_IN_FLIGHT (set GOMEMLIMIT to choose another)")
}
