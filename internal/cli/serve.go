package cli

import (
	"context"
	"errors"
	"io"
	"net"
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

// cmdServe runs the HTTP API, and with --worker the worker too, until ctx
// ends; then it drains and shuts down (see the flag's help).
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
	setMemoryLimit(a, os.Getenv("GOMEMLIMIT"), *withWorker)
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
	deps, dispatcher, err := serveDeps(ctx, a, worker, &draining, stopping)
	if err != nil {
		return err
	}
	defer deps.Redis.Close()
	srv := apiServer(handlers.New(deps))
	a.log.InfoContext(ctx, "serving", "addr", ln.Addr().String(), "worker", *withWorker)
	errc := make(chan error, 1)
	go func() { errc <- serveAPI(srv, ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	draining.Store(true)
	drain(a, srv)
	close(stopping)
	err = shutdownServer(a, srv, dispatcher)
	if worker != nil {
		worker.stop()
	}
	return err
}

// serveDeps builds what the handlers need: the readiness check (false
// while draining), the Redis client of the rate limits and of the
// runs-ended signal, and the hand-off of started runs through the
// dispatcher it starts. worker is nil unless serve runs one.
func serveDeps(ctx context.Context, a *app, worker *workerProcess, draining *atomic.Bool, stopping chan struct{}) (handlers.Deps, *tasks.Dispatcher, error) {
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
	var err error
	if deps.Redis, err = rateLimitRedis(a); err != nil {
		return deps, nil, err
	}
	// The long-poll looks as soon as a worker says runs ended.
	deps.RunsEnded = tasks.WatchRunsEnded(ctx, deps.Redis)
	dispatcher, err := startDispatcher(a, deps.Registry)
	if err != nil {
		deps.Redis.Close()
		return deps, nil, err
	}
	deps.HandOff = dispatcher.HandOff
	return deps, dispatcher, nil
}

// shutdownServer stops srv within SHUTDOWN_TIMEOUT: in-flight requests finish
// and their transactions commit, then every run they started goes to the
// queue within the same deadline, so a graceful stop leaves none to the
// sweeper.
func shutdownServer(a *app, srv *http.Server, dispatcher *tasks.Dispatcher) error {
	a.log.Info("shutting down", "timeout", a.cfg.ShutdownTimeout)
	sctx, cancel := context.WithTimeout(context.Background(), a.cfg.ShutdownTimeout)
	defer cancel()
	err := srv.Shutdown(sctx)
	dispatcher.Shutdown(sctx)
	return err
}

// apiServer is the API's HTTP server: a client has ReadHeaderTimeout from
// its request's first bytes to send the headers, ReadTimeout for the whole
// request, and IdleTimeout to send its first byte and, kept alive, the next
// request's.
func apiServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       time.Minute,
		IdleTimeout:       2 * time.Minute,
	}
}

// serveAPI serves srv on ln, each connection from its first byte (see
// firstBytesListener), until srv is shut down.
func serveAPI(srv *http.Server, ln net.Listener) error {
	return srv.Serve(newFirstBytesListener(ln, srv.IdleTimeout))
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

// setMemoryLimit gives the Go runtime the process's soft memory limit
// (config.MemoryLimit, counting the worker when it runs here), so that a
// burst of large bodies is collected as it goes instead of doubling the
// heap; an operator's GOMEMLIMIT (env, which the runtime has applied
// already) wins.
func setMemoryLimit(a *app, env string, worker bool) {
	limit := a.cfg.MemoryLimit(worker)
	if env != "" || limit <= 0 {
		return
	}
	debug.SetMemoryLimit(limit)
	from := "64 MiB + 12 x MAX_BODY_BYTES_IN_FLIGHT"
	if worker {
		from += ", + 32 MiB + 2 x MAX_BODY_BYTES x WORKER_CONCURRENCY for the worker"
	}
	a.log.Info("soft memory limit", "bytes", limit, "from", from+" (set GOMEMLIMIT to choose another)")
}
