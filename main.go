// Command valruns is the idempotent job-start API: the HTTP server, the
// worker, migrations and bootstrap commands in one binary. main is the
// composition root: it turns SIGINT/SIGTERM into a cancelled context and
// hands the command line to package cli, whose commands read the
// configuration and open PostgreSQL and Redis as each needs them (a
// command's --help or a bad call needs neither).
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/valruns/valruns/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
