// Command valruns is the idempotent job-start API: the HTTP server, the
// worker, migrations and bootstrap commands in one binary. main is the
// composition root: it parses the configuration, opens PostgreSQL and Redis,
// builds the stores and the router, and shuts down on SIGINT/SIGTERM.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"gorm.io/gorm"

	"github.com/valruns/valruns/config"
	"github.com/valruns/valruns/handlers"
	"github.com/valruns/valruns/migrations"
	"github.com/valruns/valruns/models"
)

const usage = `valruns: the idempotent job-start API

Usage:
  valruns serve [--worker]         run the HTTP API (--worker: also the worker, single-node mode)
  valruns worker                   run the worker: task server, scheduler, staged-job enqueuer
  valruns migrate up|down|status   apply, roll back one, or list schema migrations
  valruns cleanup [--dry-run]      delete expired idempotency keys once, print the count
  valruns org create NAME          create an organisation, print its slug and id
  valruns token create --org SLUG  create an API token, print it once
  valruns demo                     ensure a demo org, token and workflow (used by make run)

Configuration is environment variables; see the README. Run any command with --help.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// exitError is an error whose message is the whole story: printed as one line.
type exitError struct{ msg string }

func (e *exitError) Error() string { return e.msg }

// exitCoder is an error that chooses the process's exit code (the default
// for an error is 1). A command whose outcome is more than success or
// failure, such as `valruns start` (3: the run failed, 4: it ended in
// error), returns one.
type exitCoder interface {
	error
	ExitCode() int
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stdout, usage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	cmds := map[string]func(context.Context, []string, io.Writer) error{
		"serve":   cmdServe,
		"worker":  cmdWorker,
		"migrate": cmdMigrate,
		"cleanup": cmdCleanup,
		"org":     cmdOrg,
		"token":   cmdToken,
		"demo":    cmdDemo,
		"start":   cmdStart,
	}
	cmd, ok := cmds[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "valruns: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	if err := cmd(ctx, args[1:], stdout); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "valruns %s: %v\n", args[0], err)
		if ec, ok := errors.AsType[exitCoder](err); ok {
			return ec.ExitCode()
		}
		return 1
	}
	return 0
}

// flags returns a FlagSet printing its usage to out.
func flags(name, synopsis string, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprintf(out, "Usage: valruns %s\n", synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// app is what every command that touches the database needs.
type app struct {
	cfg config.Config
	log *slog.Logger
	db  *gorm.DB
}

// purpose says what a command opens the database for.
type purpose int

const (
	// forWork: serving requests and tasks. The schema must be migrated (or
	// is migrated when MIGRATE_ON_START=true), and no statement may outlive
	// IDEMPOTENCY_TX_TIMEOUT.
	forWork purpose = iota
	// forMigration: any schema state, no statement timeout.
	forMigration
)

// open loads the configuration, builds the logger and connects to the
// database for the purpose.
func open(ctx context.Context, p purpose) (*app, error) {
	cfg, err := config.FromEnv()
	if err != nil {
		return nil, err
	}
	log := newLogger(cfg, os.Stderr)
	// For work, a statement never outlives the request transaction's
	// deadline (see idempotency.Config.TxTimeout).
	opt := models.DBOptions{}
	if p == forWork {
		opt.StatementTimeout = cfg.IdempotencyTxTimeout
	}
	db, err := models.Open(ctx, cfg.DatabaseURL, opt)
	if err != nil {
		return nil, &config.Error{Var: "DATABASE_URL", Value: redact(cfg.DatabaseURL), Problem: oneLine(err)}
	}
	a := &app{cfg: cfg, log: log, db: db}
	if p == forWork {
		if err := a.ensureMigrated(ctx); err != nil {
			a.close()
			return nil, err
		}
	}
	return a, nil
}

func (a *app) close() { _ = models.SQLDB(a.db).Close() }

func (a *app) ensureMigrated(ctx context.Context) error {
	n, err := migrations.Pending(ctx, models.SQLDB(a.db))
	if err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	if !a.cfg.MigrateOnStart {
		return &exitError{fmt.Sprintf("the database has %d pending migration(s): run `valruns migrate up` (or set MIGRATE_ON_START=true)", n)}
	}
	// Not a.db: its statement_timeout is for requests, and a migration may
	// rightly take longer.
	mdb, err := models.Open(ctx, a.cfg.DatabaseURL, models.DBOptions{MaxOpenConns: 2})
	if err != nil {
		return err
	}
	defer func() { _ = models.SQLDB(mdb).Close() }()
	p, err := migrations.NewProvider(models.SQLDB(mdb))
	if err != nil {
		return err
	}
	res, err := p.Up(ctx)
	if err != nil {
		return fmt.Errorf("migrate up: %w", err)
	}
	a.log.InfoContext(ctx, "migrated on start", "applied", len(res))
	return nil
}

func newLogger(cfg config.Config, w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.LogLevel)) // validated by config
	opts := &slog.HandlerOptions{Level: level}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

func cmdServe(ctx context.Context, args []string, out io.Writer) error {
	fs := flags("serve", "serve [--worker]", out)
	withWorker := fs.Bool("worker", false, "also run the worker in this process (single-node mode)")
	if err := fs.Parse(args); err != nil {
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
	var worker *workerProcess
	if *withWorker {
		if worker, err = startWorker(ctx, a); err != nil {
			return err
		}
	}
	srv := &http.Server{
		Handler:           handlers.New(handlers.Deps{Config: a.cfg, DB: a.db, Log: a.log, Registry: newRegistry(worker)}),
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
	if worker != nil {
		worker.stop()
	}
	return err
}

func cmdMigrate(ctx context.Context, args []string, out io.Writer) error {
	fs := flags("migrate", "migrate up|down|status", out)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return &exitError{"want one of up, down, status"}
	}
	a, err := open(ctx, forMigration)
	if err != nil {
		return err
	}
	defer a.close()
	p, err := migrations.NewProvider(models.SQLDB(a.db))
	if err != nil {
		return err
	}
	switch fs.Arg(0) {
	case "up":
		res, err := p.Up(ctx)
		if err != nil {
			return err
		}
		for _, r := range res {
			fmt.Fprintf(out, "applied %s (%s)\n", r.Source.Path, r.Duration.Round(time.Millisecond))
		}
		v, _ := p.GetDBVersion(ctx)
		fmt.Fprintf(out, "database at version %d\n", v)
	case "down":
		r, err := p.Down(ctx)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "rolled back %s\n", r.Source.Path)
	case "status":
		st, err := p.Status(ctx)
		if err != nil {
			return err
		}
		for _, s := range st {
			applied := "pending"
			if s.State == "applied" {
				applied = "applied " + s.AppliedAt.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(out, "%-30s %s\n", s.Source.Path, applied)
		}
	default:
		fs.Usage()
		return &exitError{fmt.Sprintf("unknown migrate action %q: want up, down or status", fs.Arg(0))}
	}
	return nil
}

func cmdCleanup(ctx context.Context, args []string, out io.Writer) error {
	fs := flags("cleanup", "cleanup [--dry-run]", out)
	dry := fs.Bool("dry-run", false, "only count the expired keys")
	if err := fs.Parse(args); err != nil {
		return err
	}
	a, err := open(ctx, forWork)
	if err != nil {
		return err
	}
	defer a.close()
	keys := models.NewKeyStore(a.db)
	if *dry {
		n, err := keys.CountExpired(ctx)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "%d expired idempotency keys would be deleted\n", n)
		return nil
	}
	n, err := keys.DeleteExpired(ctx, a.cfg.CleanupBatchSize)
	fmt.Fprintf(out, "deleted %d expired idempotency keys\n", n)
	return err
}

func cmdOrg(ctx context.Context, args []string, out io.Writer) error {
	fs := flags("org", "org create NAME", out)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 2 || fs.Arg(0) != "create" {
		fs.Usage()
		return &exitError{"want: org create NAME"}
	}
	a, err := open(ctx, forWork)
	if err != nil {
		return err
	}
	defer a.close()
	org, err := models.NewOrgStore(a.db).Create(ctx, fs.Arg(1))
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "slug=%s id=%s\n", org.Slug, org.ID)
	return nil
}

func cmdToken(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 || args[0] != "create" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
			fmt.Fprintln(out, "Usage: valruns token create --org SLUG")
			return flag.ErrHelp
		}
		return &exitError{"want: token create --org SLUG"}
	}
	fs := flags("token create", "token create --org SLUG", out)
	slug := fs.String("org", "", "slug of the organisation the token acts for")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if *slug == "" {
		fs.Usage()
		return &exitError{"--org SLUG is required"}
	}
	a, err := open(ctx, forWork)
	if err != nil {
		return err
	}
	defer a.close()
	org, err := models.NewOrgStore(a.db).BySlug(ctx, *slug)
	if errors.Is(err, models.ErrNotFound) {
		return &exitError{fmt.Sprintf("no organisation with slug %q (create one with `valruns org create NAME`)", *slug)}
	}
	if err != nil {
		return err
	}
	token, _, err := models.NewTokenStore(a.db).Create(ctx, org.ID)
	if err != nil {
		return err
	}
	fmt.Fprintln(out, token)
	return nil
}

// listen opens the address a setting names; a failure names the setting.
func listen(setting, addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, &config.Error{Var: setting, Value: addr, Problem: oneLine(err)}
	}
	return ln, nil
}

// redact hides a password in a connection URL for messages.
func redact(u string) string {
	if i := strings.Index(u, "://"); i >= 0 {
		if at := strings.Index(u[i+3:], "@"); at >= 0 {
			cred := u[i+3 : i+3+at]
			if user, _, ok := strings.Cut(cred, ":"); ok {
				return u[:i+3] + user + ":***" + u[i+3+at:]
			}
		}
	}
	return u
}

func oneLine(err error) string { return strings.ReplaceAll(err.Error(), "\n", " ") }
