package cli

import (
	"context"
	"net/http"
	"net/http/pprof"
	"time"
)

// startPprof serves Go's profiler (net/http/pprof) on PPROF_ADDR when it is
// set, on a listener of its own, never on the API's address: the profiles
// show the process's internals. It returns the function that stops it.
func startPprof(a *app) (stop func(), err error) {
	if a.cfg.PprofAddr == "" {
		return func() {}, nil
	}
	ln, err := listen("PPROF_ADDR", a.cfg.PprofAddr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	a.serveInBackground(srv, ln, "pprof")
	a.log.Info("serving pprof", "addr", "http://"+ln.Addr().String()+"/debug/pprof/")
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}, nil
}
