package cli

import (
	"context"
	"errors"
	"net"
	"net/http"

	"github.com/valruns/valruns/config"
)

// process is serve or worker once started: the app (configuration,
// logger, tracing, the migrated database), the listener of the process's
// HTTP server, and the profiler on PPROF_ADDR.
type process struct {
	*app
	// ln is where the process's HTTP server listens: the API (serve) or
	// /metrics, /healthz and /readyz (worker).
	ln        net.Listener
	stopPprof func()
}

// startProcess is the one start-up of serve and worker. It loads the
// configuration, builds the logger, sets up tracing, connects to the
// database (migrated, or migrated now when MIGRATE_ON_START=true), listens
// on the address that the setting names (addr picks it from the
// configuration) and starts the profiler when PPROF_ADDR is set. A failure
// names its setting, and undoes what was started; stop undoes it all.
func startProcess(ctx context.Context, setting string, addr func(config.Config) string) (*process, error) {
	a, err := open(ctx, forWork)
	if err != nil {
		return nil, err
	}
	ln, err := listen(setting, addr(a.cfg))
	if err != nil {
		a.close()
		return nil, err
	}
	stopPprof, err := startPprof(a)
	if err != nil {
		_ = ln.Close()
		a.close()
		return nil, err
	}
	return &process{app: a, ln: ln, stopPprof: stopPprof}, nil
}

// stop stops the profiler, closes the listener (already closed when its
// server was shut down) and then the app.
func (p *process) stop() {
	p.stopPprof()
	_ = p.ln.Close()
	p.close()
}

// serveInBackground serves srv on ln until srv is shut down, and logs it
// if srv stops for any other reason.
func (a *app) serveInBackground(srv *http.Server, ln net.Listener, name string) {
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.log.Error(name+" server stopped", "error", err)
		}
	}()
}
