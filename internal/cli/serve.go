package cli

import (
	"context"
	"io"
	"net/http"
	"os"
	"runtime/debug"
	"time"

	"github.com/valruns/valruns/handlers"
)

func cmdServe(ctx context.Context, args []string, out io.Writer) error {
	fs := flags("serve", "serve [--worker]", out,
		"Runs the HTTP API on HTTP_ADDR until SIGINT or SIGTERM, then shuts down gracefully.")
	withWorker := fs.Bool("worker", false, "also run the worker in this process (single-node mode)")
	if err := parseFlagsOnly(fs, args); err != nil {
		return err
	}
	a, err := open(ctx, forWork)
	if err != nil {
		return err
	}
	defer a.close()

	ln, err := listen("HTTP_ADDR", a.cfg.HTTPAddr)
	if err != nil {
		return err
	}
	stopPprof, err := startPprof(a)
	if err != nil {
		_ = ln.Close()
		return err
	}
	defer stopPprof()
	if !*withWorker {
		setMemoryLimit(a, os.Getenv("GOMEMLIMIT"))
	}
	var worker *workerProcess
	if *withWorker {
		if worker, err = startWorker(ctx, a); err != nil {
			return err
		}
	}
	// Stop: at SIGTERM, long-polls answer at once instead of holding up the shutdown.
	deps := handlers.Deps{Config: a.cfg, DB: a.db, Log: a.log, Registry: newRegistry(worker), Stop: ctx.Done(),
		Tracing: a.tracing}
	if deps.Redis, err = rateLimitRedis(a); err != nil {
		return err
	}
	defer deps.Redis.Close()
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
	a.log.Info("shutting down", "timeout", a.cfg.ShutdownTimeout)
	sctx, cancel := context.WithTimeout(context.Background(), a.cfg.ShutdownTimeout)
	defer cancel()
	err = srv.Shutdown(sctx) // in-flight requests finish; their transactions commit
	dispatcher.Close()
	if worker != nil {
		worker.stop()
	}
	return err
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
