// Command valruns is the idempotent job-start API: the HTTP server, the
// worker, migrations and bootstrap commands in one binary. main is the
// composition root: it parses the configuration, opens PostgreSQL and Redis,
// builds the stores and the router, and shuts down on SIGINT/SIGTERM.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"gorm.io/gorm"

	"github.com/valruns/valruns/config"
	"github.com/valruns/valruns/handlers"
	"github.com/valruns/valruns/migrations"
	"github.com/valruns/valruns/models"
)

// command is one entry of the table run() dispatches on. The usage
// overview, every --help and the tests walk this one table, so a command
// added here is listed, answers --help and is tested with no other change.
type command struct {
	// name is the word on the command line.
	name string
	// args is what follows the name in the synopsis ("NAME [--slug SLUG]").
	args string
	// summary is the command's line in the overview.
	summary string
	// run executes the command with the arguments after its name. Given
	// ["-h"] it must print its usage (Usage: valruns NAME ARGS...) on out and
	// return flag.ErrHelp without acting: run() calls it so for --help and
	// to show the usage after a bad call. A bad call returns a *usageError.
	// nil for a group of subcommands.
	run func(ctx context.Context, args []string, out io.Writer) error
	// subs are the subcommands of a group.
	subs []command
}

// commands is every command of the binary, in the order the overview lists them.
var commands = []command{
	{name: "serve", args: "[--worker]", summary: "run the HTTP API (--worker: also the worker, single-node mode)", run: cmdServe},
	{name: "worker", summary: "run the worker: task server, cleanup schedule, stranded-run sweeper", run: cmdWorker},
	{name: "migrate", summary: "schema migrations", subs: []command{
		{name: "up", summary: "apply every pending migration", run: cmdMigrate("up")},
		{name: "down", summary: "roll back the last applied migration", run: cmdMigrate("down")},
		{name: "status", summary: "list the migrations, applied or pending", run: cmdMigrate("status")},
	}},
	{name: "cleanup", args: "[--dry-run]", summary: "delete expired idempotency keys once, print the count", run: cmdCleanup},
	{name: "org", summary: "organisations, their quotas and limits", subs: []command{
		{name: "create", args: "NAME [--slug SLUG]", summary: "create an organisation, print its slug and id", run: cmdOrgCreate},
		{name: "list", args: "[--json]", summary: "list the organisations: slug, id, monthly run quota, start rate, run share, created", run: cmdOrgList},
		{name: "quota", args: "SLUG N|default", summary: "set an organisation's monthly run quota (0: unlimited)", run: cmdOrgQuota},
		{name: "rate", args: "SLUG N|default", summary: "set an organisation's start rate, starts per second (0: unlimited)", run: cmdOrgRate},
		{name: "share", args: "SLUG N|default", summary: "set how many of an organisation's runs may wait in the queue at once (0: unlimited)", run: cmdOrgShare},
	}},
	{name: "token", summary: "API tokens", subs: []command{
		{name: "create", args: "--org SLUG", summary: "create an API token, print it once (only its SHA-256 is stored)", run: cmdTokenCreate},
		{name: "list", args: "--org SLUG [--json]", summary: "list an organisation's tokens: id, prefix, created, revoked", run: cmdTokenList},
		{name: "revoke", args: "ID|PREFIX", summary: "revoke a token, named by its id or its display prefix", run: cmdTokenRevoke},
	}},
	{name: "demo", args: "[--token-file PATH]", summary: "ensure a demo org, token and workflow (used by make run)", run: cmdDemo},
	{name: "start", args: startSynopsis,
		summary: "start a run through the Go client: one key per call, safe retries, --wait for the result", run: cmdStart},
}

// synopsis is how a command is called: "org create NAME [--slug SLUG]".
func synopsis(path []string, c command) string {
	return strings.TrimSpace(strings.Join(path, " ") + " " + c.args)
}

// listing is one line per runnable command under path, aligned:
// "valruns org create NAME [--slug SLUG]   create an organisation...".
func listing(path []string, cmds []command) []string {
	type row struct{ syn, summary string }
	var rows []row
	var walk func(path []string, cmds []command)
	walk = func(path []string, cmds []command) {
		for _, c := range cmds {
			p := append(slices.Clone(path), c.name)
			if c.subs != nil {
				walk(p, c.subs)
				continue
			}
			rows = append(rows, row{"valruns " + synopsis(p, c), c.summary})
		}
	}
	walk(path, cmds)
	// Summaries line up after the synopses, except that one too long to
	// leave room for its summary has it on the next line.
	const maxWidth = 44
	width := 0
	for _, r := range rows {
		if len(r.syn) <= maxWidth {
			width = max(width, len(r.syn))
		}
	}
	var lines []string
	for _, r := range rows {
		if len(r.syn) > maxWidth {
			lines = append(lines, r.syn, fmt.Sprintf("%-*s  %s", width, "", r.summary))
			continue
		}
		lines = append(lines, fmt.Sprintf("%-*s  %s", width, r.syn, r.summary))
	}
	return lines
}

// overview is the usage of the binary itself.
func overview() string {
	return "valruns: the idempotent job-start API\n\nUsage:\n  " +
		strings.Join(listing(nil, commands), "\n  ") +
		"\n\nConfiguration is environment variables; see the README.\n" +
		"Run any command with --help (or `valruns help COMMAND`) for its usage.\n"
}

// groupUsage is the usage of a group of subcommands such as `valruns org`.
func groupUsage(path []string, c command) string {
	name := strings.Join(path, " ")
	return fmt.Sprintf("Usage: valruns %s SUBCOMMAND\n\n%s, one of:\n  %s\n\nRun `valruns %s SUBCOMMAND --help` for its usage.\n",
		name, upperFirst(c.summary), strings.Join(listing(path[:len(path)-1], []command{c}), "\n  "), name)
}

func upperFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

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

// usageError is a bad call of a command (a missing or extra argument, a bad
// flag or value): exit code 2, and run() prints the command's usage after it.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

// ExitCode is 2, the conventional code of bad usage.
func (e *usageError) ExitCode() int { return 2 }

func badUsage(format string, a ...any) error { return &usageError{fmt.Sprintf(format, a...)} }

// Exit codes of run.
const (
	exitOK    = 0
	exitFail  = 1 // the command failed
	exitUsage = 2 // the command was called wrongly
)

// run executes the command args name and returns the process's exit code:
// 0 done (or usage asked for), 1 failed (one line on stderr: "valruns CMD:
// why"), 2 bad usage (why, then the command's usage, on stderr), or the
// code an exitCoder error chooses.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "help" { // `valruns help org create` = `valruns org create --help`
		if len(args) == 1 {
			fmt.Fprint(stdout, overview())
			return exitOK
		}
		args = append(slices.Clone(args[1:]), "--help")
	}
	if len(args) == 0 {
		fmt.Fprint(stderr, overview())
		return exitUsage
	}
	if isHelp(args[0]) {
		fmt.Fprint(stdout, overview())
		return exitOK
	}

	// Find the command: one word per level of the table.
	var (
		cmd   command
		path  []string
		table = commands
		rest  = args
	)
	for {
		i := slices.IndexFunc(table, func(c command) bool { return c.name == rest[0] })
		if i < 0 {
			if path == nil {
				fmt.Fprintf(stderr, "valruns: unknown command %q\n\n%s", rest[0], overview())
				return exitUsage
			}
			name := strings.Join(path, " ")
			fmt.Fprintf(stderr, "valruns %s: unknown subcommand %q\n\n%s", name, rest[0], groupUsage(path, cmd))
			return exitUsage
		}
		cmd, path, rest = table[i], append(path, table[i].name), rest[1:]
		if cmd.subs == nil {
			break
		}
		if len(rest) == 0 || strings.HasPrefix(rest[0], "-") || rest[0] == "help" {
			if wantsHelp(rest) || (len(rest) > 0 && rest[0] == "help") {
				fmt.Fprint(stdout, groupUsage(path, cmd))
				return exitOK
			}
			fmt.Fprintf(stderr, "valruns %s: missing subcommand\n\n%s", strings.Join(path, " "), groupUsage(path, cmd))
			return exitUsage
		}
		table = cmd.subs
	}
	name := strings.Join(path, " ")

	// --help anywhere (before a "--") shows the usage and nothing else runs:
	// `org create Acme --help` must not create Acme.
	if wantsHelp(rest) {
		rest = []string{"-h"}
	}
	err := cmd.run(ctx, rest, stdout)
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.As(err, new(*usageError)):
		fmt.Fprintf(stderr, "valruns %s: %s\n\n", name, oneLine(err))
		_ = cmd.run(ctx, []string{"-h"}, stderr)
		return exitUsage
	}
	fmt.Fprintf(stderr, "valruns %s: %s\n", name, oneLine(err))
	if ec, ok := errors.AsType[exitCoder](err); ok {
		return ec.ExitCode()
	}
	return exitFail
}

// isHelp reports whether a command-line word asks for help.
func isHelp(arg string) bool {
	switch arg {
	case "-h", "-help", "--h", "--help":
		return true
	}
	return false
}

// wantsHelp reports whether args ask for help before a "--" (after which
// every word is an operand: `org create -- --help` names an organisation).
func wantsHelp(args []string) bool {
	for _, a := range args {
		if a == "--" {
			return false
		}
		if isHelp(a) {
			return true
		}
	}
	return false
}

// flags returns the FlagSet of a command: synopsis is its usage line after
// "valruns ", doc optional paragraphs after it. The usage goes to out when
// asked for (-h); a bad flag prints nothing here, since parse turns it into
// a *usageError and run() prints it with the usage on stderr.
func flags(name, synopsis string, out io.Writer, doc ...string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	failed := &flagFailure{}
	fs.SetOutput(failed)
	fs.Usage = func() {
		if failed.seen {
			return
		}
		fmt.Fprintf(out, "Usage: valruns %s\n", synopsis)
		for _, d := range doc {
			fmt.Fprintf(out, "\n%s\n", d)
		}
		printFlags(out, fs)
	}
	return fs
}

// printFlags lists a FlagSet's flags as the synopses spell them (--name),
// which the flag package accepts as well as -name.
func printFlags(out io.Writer, fs *flag.FlagSet) {
	first := true
	fs.VisitAll(func(f *flag.Flag) {
		if first {
			fmt.Fprint(out, "\nFlags:\n")
			first = false
		}
		value, usage := flag.UnquoteUsage(f)
		fmt.Fprintf(out, "  --%s", f.Name)
		if value != "" {
			fmt.Fprintf(out, " %s", value)
		}
		fmt.Fprintf(out, "\n      %s", strings.ReplaceAll(usage, "\n", "\n      "))
		if f.DefValue != "" && f.DefValue != "false" {
			fmt.Fprintf(out, " (default %s)", f.DefValue)
		}
		fmt.Fprintln(out)
	})
}

// flagFailure is a FlagSet's output: the flag package writes there only to
// report a bad flag, just before it calls Usage.
type flagFailure struct{ seen bool }

func (f *flagFailure) Write(p []byte) (int, error) {
	f.seen = true
	return len(p), nil
}

// parse parses the flags of args wherever they stand among the operands
// (`org create Acme --slug acme` as well as `org create --slug acme Acme`)
// and returns the operands; after a "--" every word is an operand, and so
// is a negative number (`org quota acme -5` is judged as a quota, not as a
// flag named 5). A bad flag is a *usageError, and so is a flag given
// explicitly empty (`--key ""`, `--token "$UNSET"`): a flag wins over its
// default and the environment, so an empty one is a mistake, never "use
// the default". -h is flag.ErrHelp, with the usage printed.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	operands, err := parseWords(fs, args)
	if err != nil {
		return nil, err
	}
	var empty []string
	fs.Visit(func(f *flag.Flag) {
		if f.Value.String() == "" {
			empty = append(empty, f.Name)
		}
	})
	if len(empty) > 0 {
		return nil, badUsage("--%s is empty (an unset variable?): give it a value, or leave the flag out", empty[0])
	}
	return operands, nil
}

func parseWords(fs *flag.FlagSet, args []string) ([]string, error) {
	var operands []string
	for {
		// The flag package would take a negative number for a flag: parse
		// the words before it on their own, and keep it as an operand.
		end := negativeNumberAt(fs, args)
		if err := fs.Parse(args[:end]); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, &usageError{err.Error()}
		}
		rest := fs.Args()
		if done := end - len(rest); done > 0 && args[done-1] == "--" {
			return slices.Concat(operands, rest, args[end:]), nil
		}
		switch {
		case len(rest) > 0:
			operands = append(operands, rest[0])
			args = slices.Concat(rest[1:], args[end:])
		case end < len(args):
			operands = append(operands, args[end])
			args = args[end+1:]
		default:
			return operands, nil
		}
	}
}

// negativeNumberAt is the index of the first word of args, before any
// "--", that is a negative number ("-5", "-1.5") and not the value of the
// flag before it; len(args) when there is none.
func negativeNumberAt(fs *flag.FlagSet, args []string) int {
	for i, a := range args {
		if a == "--" {
			break
		}
		if len(a) < 2 || a[0] != '-' || a[1] < '0' || a[1] > '9' {
			continue
		}
		if i > 0 && takesValue(fs, args[i-1]) {
			continue
		}
		return i
	}
	return len(args)
}

// takesValue reports whether word is a flag of fs that takes the next word
// as its value (`--quota -5`): not a bool flag, not written --name=value.
func takesValue(fs *flag.FlagSet, word string) bool {
	name, ok := strings.CutPrefix(word, "-")
	if !ok || strings.Contains(name, "=") {
		return false
	}
	name = strings.TrimPrefix(name, "-")
	f := fs.Lookup(name)
	if f == nil {
		return false
	}
	b, isBool := f.Value.(interface{ IsBoolFlag() bool })
	return !isBool || !b.IsBoolFlag()
}

// parseFlagsOnly is parse for a command that takes flags and no operands.
func parseFlagsOnly(fs *flag.FlagSet, args []string) error {
	operands, err := parse(fs, args)
	if err != nil {
		return err
	}
	return noOperands(operands)
}

// noOperands is a *usageError when a command that takes none got one.
func noOperands(operands []string) error {
	if len(operands) > 0 {
		return badUsage("unexpected argument %q", operands[0])
	}
	return nil
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
	// forMigration: any schema state, no statement timeout, on
	// DATABASE_DIRECT_URL (the migrations hold a session advisory lock).
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
	opt := models.DBOptions{MaxOpenConns: cfg.DatabaseMaxConns,
		AcquireTimeout: cfg.DatabaseAcquireTimeout, AnswerTimeout: cfg.DatabaseAnswerTimeout}
	name, url := "DATABASE_URL", cfg.DatabaseURL
	if p == forWork {
		opt.StatementTimeout = cfg.IdempotencyTxTimeout
		opt.TransactionPooler = cfg.DatabasePooler == "transaction"
	} else if cfg.DatabaseDirectURL != cfg.DatabaseURL {
		name, url = "DATABASE_DIRECT_URL", cfg.DatabaseDirectURL
	}
	db, err := models.Open(ctx, url, opt)
	if err != nil {
		return nil, &config.Error{Var: name, Value: redact(url), Problem: oneLine(err)}
	}
	a := &app{cfg: cfg, log: log, db: db}
	if p == forWork {
		if err := a.ensureMigrated(ctx); err != nil {
			a.close()
			return nil, err
		}
		if opt.TransactionPooler {
			a.checkRoleSettings(ctx)
		}
	}
	return a, nil
}

// checkRoleSettings warns when, behind a transaction pooler (which
// refuses session parameters at connect), the database role does not
// bound its statements as valruns would have: statement_timeout at most
// IDEMPOTENCY_TX_TIMEOUT, and client_connection_check_interval set. Request
// transactions set both themselves; the worker's statements outside them
// rely on the role's.
func (a *app) checkRoleSettings(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var timeoutMS, checkMS int64
	err := models.SQLDB(a.db).QueryRowContext(ctx, `SELECT
		CAST(extract(epoch FROM CAST(current_setting('statement_timeout') AS interval)) * 1000 AS bigint),
		CAST(extract(epoch FROM CAST(current_setting('client_connection_check_interval') AS interval)) * 1000 AS bigint)`).Scan(&timeoutMS, &checkMS)
	switch {
	case err != nil:
		a.log.WarnContext(ctx, "could not read the role's statement_timeout behind the pooler", "error", err)
	case timeoutMS == 0 || time.Duration(timeoutMS)*time.Millisecond > a.cfg.IdempotencyTxTimeout || checkMS == 0:
		a.log.WarnContext(ctx, "behind a transaction pooler valruns cannot set session parameters: set them on the database role "+
			"(ALTER ROLE ... SET statement_timeout = ..., SET client_connection_check_interval = '1s')",
			"statement_timeout_ms", timeoutMS, "want_at_most_ms", a.cfg.IdempotencyTxTimeout.Milliseconds(),
			"client_connection_check_interval_ms", checkMS)
	}
}

func (a *app) close() { _ = models.SQLDB(a.db).Close() }

func (a *app) ensureMigrated(ctx context.Context) error {
	// Not a.db: goose's status and migrations hold a session advisory lock,
	// which a transaction pooler would take on one server connection and
	// release on another (DATABASE_DIRECT_URL); and a.db's statement_timeout
	// is for requests, while a migration may rightly take longer.
	mdb, err := models.Open(ctx, a.cfg.DatabaseDirectURL, models.DBOptions{MaxOpenConns: 2})
	if err != nil {
		if a.cfg.DatabaseDirectURL != a.cfg.DatabaseURL {
			return &config.Error{Var: "DATABASE_DIRECT_URL", Value: redact(a.cfg.DatabaseDirectURL), Problem: oneLine(err)}
		}
		return err
	}
	defer func() { _ = models.SQLDB(mdb).Close() }()
	n, err := migrations.Pending(ctx, models.SQLDB(mdb))
	if err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	if !a.cfg.MigrateOnStart {
		return &exitError{fmt.Sprintf("the database has %d pending migration(s): run `valruns migrate up` (or set MIGRATE_ON_START=true)", n)}
	}
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
	var worker *workerProcess
	if *withWorker {
		if worker, err = startWorker(ctx, a); err != nil {
			return err
		}
	}
	deps := handlers.Deps{Config: a.cfg, DB: a.db, Log: a.log, Registry: newRegistry(worker)}
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

// migrateDoc says what each `migrate` action does, in its usage.
var migrateDoc = map[string]string{
	"up":     "Applies every pending migration (embedded in the binary) and prints the database's version.",
	"down":   "Rolls back the last applied migration.",
	"status": "Lists the migrations embedded in the binary, each applied (with the time) or pending.",
}

// cmdMigrate is the command `valruns migrate ACTION`.
func cmdMigrate(action string) func(context.Context, []string, io.Writer) error {
	return func(ctx context.Context, args []string, out io.Writer) error {
		fs := flags("migrate "+action, "migrate "+action, out, migrateDoc[action])
		if err := parseFlagsOnly(fs, args); err != nil {
			return err
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
		switch action {
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
			return fmt.Errorf("unknown migrate action %q", action) // the command table names only the above
		}
		return nil
	}
}

func cmdCleanup(ctx context.Context, args []string, out io.Writer) error {
	fs := flags("cleanup", "cleanup [--dry-run]", out,
		"Deletes the idempotency keys past their expiry, in batches of CLEANUP_BATCH_SIZE as the worker's\n"+
			"scheduled cleanup does, and prints how many.")
	dry := fs.Bool("dry-run", false, "only count the expired keys")
	if err := parseFlagsOnly(fs, args); err != nil {
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

func cmdOrgCreate(ctx context.Context, args []string, out io.Writer) error {
	fs := flags("org create", "org create NAME [--slug SLUG]", out,
		"Creates an organisation and prints its slug and id. The slug addresses the organisation in the\n"+
			"other commands; it is derived from NAME (lowercase, runs of other characters become -) unless\n"+
			"--slug is given. A slug that is taken is refused: nothing is created.")
	slug := fs.String("slug", "", "the `SLUG` to address the organisation by: 1 to 63 of a-z, 0-9 and -, starting with a letter or digit\n(default: derived from NAME)")
	operands, err := parse(fs, args)
	if err != nil {
		return err
	}
	switch {
	case len(operands) == 0:
		return badUsage("missing NAME")
	case len(operands) > 1:
		return badUsage("want one NAME, got %d words (quote a name with spaces: \"Acme Corp\")", len(operands))
	}
	name := operands[0]
	if err := models.CheckName(name); err != nil {
		return badUsage("NAME: %v", err)
	}
	if *slug != "" {
		if err := models.CheckSlug(*slug); err != nil {
			return badUsage("--slug: %v", err)
		}
	}
	a, err := open(ctx, forWork)
	if err != nil {
		return err
	}
	defer a.close()
	org, err := models.NewOrgStore(a.db).CreateWithSlug(ctx, name, *slug)
	if taken, ok := errors.AsType[*models.SlugTakenError](err); ok {
		if *slug == "" {
			return &exitError{fmt.Sprintf("slug %q, derived from the name, is taken by another organisation (see `valruns org list`): "+
				"nothing created; choose a slug with --slug SLUG", taken.Slug)}
		}
		return &exitError{fmt.Sprintf("slug %q is taken by another organisation (see `valruns org list`): nothing created", taken.Slug)}
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "slug=%s id=%s\n", org.Slug, org.ID)
	return nil
}

// orgJSON is an organisation in `org list --json`.
type orgJSON struct {
	Slug string `json:"slug"`
	ID   string `json:"id"`
	Name string `json:"name"`
	// MonthlyRunQuota: null means DEFAULT_MONTHLY_RUN_QUOTA applies, 0 unlimited.
	MonthlyRunQuota *int64 `json:"monthly_run_quota"`
	// StartRate (starts per second) and RunShare (runs in the queue at
	// once): null means ORG_START_RATE / ORG_RUN_SHARE apply, 0 unlimited.
	StartRate *int      `json:"start_rate"`
	RunShare  *int      `json:"run_share"`
	CreatedAt time.Time `json:"created_at"`
}

func cmdOrgList(ctx context.Context, args []string, out io.Writer) error {
	fs := flags("org list", "org list [--json]", out,
		"Lists every organisation, oldest first. QUOTA is the organisation's monthly run quota, RATE\n"+
			"its starts per second, SHARE its runs in the queue at once: \"default\" when\n"+
			"DEFAULT_MONTHLY_RUN_QUOTA, ORG_START_RATE or ORG_RUN_SHARE applies, \"unlimited\" when it is 0.")
	asJSON := fs.Bool("json", false, "print a JSON array (monthly_run_quota: null = default, 0 = unlimited)")
	if err := parseFlagsOnly(fs, args); err != nil {
		return err
	}
	a, err := open(ctx, forWork)
	if err != nil {
		return err
	}
	defer a.close()
	orgs, err := models.NewOrgStore(a.db).List(ctx)
	if err != nil {
		return err
	}
	if *asJSON {
		list := make([]orgJSON, len(orgs))
		for i, o := range orgs {
			list[i] = orgJSON{Slug: o.Slug, ID: o.ID, Name: o.Name, MonthlyRunQuota: o.MonthlyRunQuota, StartRate: o.StartRate, RunShare: o.RunShare, CreatedAt: o.CreatedAt.UTC()}
		}
		return writeJSON(out, list)
	}
	if len(orgs) == 0 {
		fmt.Fprintln(out, "no organisations yet: create one with `valruns org create NAME`")
		return nil
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SLUG\tID\tQUOTA\tRATE\tSHARE\tCREATED\tNAME")
	for _, o := range orgs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", o.Slug, o.ID, quotaText(o.MonthlyRunQuota),
			limitText(o.StartRate, "/s"), limitText(o.RunShare, ""), timeText(o.CreatedAt), o.Name)
	}
	return tw.Flush()
}

// quotaText is an organisation's own quota as `org list` shows it.
func quotaText(q *int64) string {
	switch {
	case q == nil:
		return "default"
	case *q == 0:
		return "unlimited"
	}
	return strconv.FormatInt(*q, 10)
}

func timeText(t time.Time) string { return t.UTC().Format(time.RFC3339) }

func writeJSON(out io.Writer, v any) error {
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func cmdOrgQuota(ctx context.Context, args []string, out io.Writer) error {
	fs := flags("org quota", "org quota SLUG N|default", out,
		"Sets how many runs the organisation may start per calendar month (UTC):\n"+
			"  N        a whole number; 0 (or \"unlimited\") means unlimited\n"+
			"  default  DEFAULT_MONTHLY_RUN_QUOTA of the API processes applies\n\n"+
			"An API process trusts what it read with a token for AUTH_CACHE_TTL, so running servers apply\n"+
			"the change within AUTH_CACHE_TTL.")
	operands, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(operands) != 2 {
		return badUsage("want SLUG and N|default, got %d argument(s)", len(operands))
	}
	slug, value := operands[0], operands[1]
	var quota *int64
	switch value {
	case "default":
	case "unlimited":
		quota = new(int64)
	default:
		n, err := strconv.ParseInt(value, 10, 64)
		if err != nil || n < 0 {
			return badUsage("quota %q: want a whole number >= 0 (0: unlimited) or default", value)
		}
		quota = &n
	}
	a, err := open(ctx, forWork)
	if err != nil {
		return err
	}
	defer a.close()
	orgs := models.NewOrgStore(a.db)
	org, err := orgBySlug(ctx, orgs, slug)
	if err != nil {
		return err
	}
	if err := orgs.SetQuota(ctx, org.ID, quota); err != nil {
		return err
	}
	var effective string
	switch {
	case quota == nil:
		effective = "default: DEFAULT_MONTHLY_RUN_QUOTA of the API processes applies (" +
			runsPerMonth(a.cfg.DefaultMonthlyRunQuota) + " in this environment)"
	default:
		effective = runsPerMonth(*quota)
	}
	fmt.Fprintf(out, "%s: monthly run quota is now %s\n", org.Slug, effective)
	fmt.Fprintf(out, "Running API processes apply it within AUTH_CACHE_TTL (%s in this environment); new ones at once.\n", a.cfg.AuthCacheTTL)
	return nil
}

func cmdOrgRate(ctx context.Context, args []string, out io.Writer) error {
	return orgLimit{
		name: "rate", what: "start rate", unit: " starts per second", env: "ORG_START_RATE",
		help: "Sets how many starts per second the organisation may make, across every API process (a\n" +
			"token bucket in Redis whose burst is one second's worth); past it a start is answered 429\n" +
			"rate_limited with Retry-After, and nothing is stored against its Idempotency-Key.",
		def: func(a *app) int { return a.cfg.OrgStartRate },
		set: (*models.OrgStore).SetStartRate,
	}.run(ctx, args, out)
}

func cmdOrgShare(ctx context.Context, args []string, out io.Writer) error {
	return orgLimit{
		name: "share", what: "run share", unit: " runs in the queue at once", env: "ORG_RUN_SHARE",
		help: "Sets how many of the organisation's runs may wait in the queue (Redis) at once: another\n" +
			"organisation's run waits behind at most this many of them. The organisation's other runs\n" +
			"wait their turn in PostgreSQL, in order, and enter the queue as its runs finish.",
		def:       func(a *app) int { return a.cfg.OrgRunShare },
		zeroMeans: "adaptive: 0.5 s of its runs on the worker slots alive",
		set:       (*models.OrgStore).SetRunShare,
	}.run(ctx, args, out)
}

// orgLimit is one of an organisation's per-second or per-queue limits as
// `org rate` and `org share` set it.
type orgLimit struct {
	name, what, unit, env, help string
	def                         func(*app) int
	// zeroMeans: what a default of 0 means, when not unlimited.
	zeroMeans string
	set       func(*models.OrgStore, context.Context, string, *int) error
}

func (l orgLimit) run(ctx context.Context, args []string, out io.Writer) error {
	fs := flags("org "+l.name, "org "+l.name+" SLUG N|default", out, l.help+"\n"+
		"  N        a whole number; 0 (or \"unlimited\") means unlimited\n"+
		"  default  "+l.env+" of the running processes applies\n\n"+
		"An API process trusts what it read with a token for AUTH_CACHE_TTL, so running servers apply\n"+
		"the change within AUTH_CACHE_TTL.")
	operands, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(operands) != 2 {
		return badUsage("want SLUG and N|default, got %d argument(s)", len(operands))
	}
	slug, value := operands[0], operands[1]
	var limit *int
	switch value {
	case "default":
	case "unlimited":
		limit = new(int)
	default:
		n, err := strconv.ParseInt(value, 10, 32)
		if err != nil || n < 0 {
			return badUsage("%s %q: want a whole number from 0 to 2147483647 (0: unlimited) or default", l.name, value)
		}
		limit = new(int(n))
	}
	a, err := open(ctx, forWork)
	if err != nil {
		return err
	}
	defer a.close()
	orgs := models.NewOrgStore(a.db)
	org, err := orgBySlug(ctx, orgs, slug)
	if err != nil {
		return err
	}
	if err := l.set(orgs, ctx, org.ID, limit); err != nil {
		return err
	}
	effective := limitText(limit, l.unit)
	if limit == nil {
		def := limitText(new(l.def(a)), l.unit)
		if l.def(a) == 0 && l.zeroMeans != "" {
			def = l.zeroMeans
		}
		effective = fmt.Sprintf("default: %s of the running processes applies (%s in this environment)", l.env, def)
	}
	fmt.Fprintf(out, "%s: %s is now %s\n", org.Slug, l.what, effective)
	fmt.Fprintf(out, "Running API processes apply it within AUTH_CACHE_TTL (%s in this environment); new ones at once.\n", a.cfg.AuthCacheTTL)
	return nil
}

// limitText is a limit as the org commands show it.
func limitText(n *int, unit string) string {
	switch {
	case n == nil:
		return "default"
	case *n == 0:
		return "unlimited"
	}
	return fmt.Sprintf("%d%s", *n, unit)
}

func runsPerMonth(q int64) string {
	if q == 0 {
		return "unlimited"
	}
	return fmt.Sprintf("%d runs a month", q)
}

// orgBySlug finds an organisation; an unknown slug is an error that says
// how to find the right one.
func orgBySlug(ctx context.Context, orgs *models.OrgStore, slug string) (*models.Organization, error) {
	org, err := orgs.BySlug(ctx, slug)
	if errors.Is(err, models.ErrNotFound) {
		return nil, &exitError{fmt.Sprintf("no organisation with slug %q (list them with `valruns org list`, create one with `valruns org create NAME`)", slug)}
	}
	return org, err
}

func cmdTokenCreate(ctx context.Context, args []string, out io.Writer) error {
	fs := flags("token create", "token create --org SLUG", out,
		"Creates an API token for the organisation and prints it. It is shown this once: only its\n"+
			"SHA-256 and its first characters (the display prefix) are stored.")
	slug := fs.String("org", "", "`SLUG` of the organisation the token acts for (required)")
	if err := parseFlagsOnly(fs, args); err != nil {
		return err
	}
	if *slug == "" {
		return badUsage("--org SLUG is required")
	}
	a, err := open(ctx, forWork)
	if err != nil {
		return err
	}
	defer a.close()
	org, err := orgBySlug(ctx, models.NewOrgStore(a.db), *slug)
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

// tokenJSON is a token in `token list --json`: never the token itself.
type tokenJSON struct {
	ID        string     `json:"id"`
	Prefix    string     `json:"prefix"`
	CreatedAt time.Time  `json:"created_at"`
	RevokedAt *time.Time `json:"revoked_at"`
}

func cmdTokenList(ctx context.Context, args []string, out io.Writer) error {
	fs := flags("token list", "token list --org SLUG [--json]", out,
		"Lists the organisation's tokens, revoked ones included, oldest first. PREFIX is the start of\n"+
			"the token, which is all that is kept of it in clear; REVOKED is - while the token works.")
	slug := fs.String("org", "", "`SLUG` of the organisation (required)")
	asJSON := fs.Bool("json", false, "print a JSON array (revoked_at: null while the token works)")
	if err := parseFlagsOnly(fs, args); err != nil {
		return err
	}
	if *slug == "" {
		return badUsage("--org SLUG is required")
	}
	a, err := open(ctx, forWork)
	if err != nil {
		return err
	}
	defer a.close()
	org, err := orgBySlug(ctx, models.NewOrgStore(a.db), *slug)
	if err != nil {
		return err
	}
	tokens, err := models.NewTokenStore(a.db).List(ctx, org.ID)
	if err != nil {
		return err
	}
	if *asJSON {
		list := make([]tokenJSON, len(tokens))
		for i, t := range tokens {
			list[i] = tokenJSON{ID: t.ID, Prefix: t.Display, CreatedAt: t.CreatedAt.UTC(), RevokedAt: t.RevokedAt}
			if t.RevokedAt != nil {
				r := t.RevokedAt.UTC()
				list[i].RevokedAt = &r
			}
		}
		return writeJSON(out, list)
	}
	if len(tokens) == 0 {
		fmt.Fprintf(out, "%s has no tokens: create one with `valruns token create --org %s`\n", org.Slug, org.Slug)
		return nil
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tPREFIX\tCREATED\tREVOKED")
	for _, t := range tokens {
		revoked := "-"
		if t.RevokedAt != nil {
			revoked = timeText(*t.RevokedAt)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", t.ID, t.Display, timeText(t.CreatedAt), revoked)
	}
	return tw.Flush()
}

func cmdTokenRevoke(ctx context.Context, args []string, out io.Writer) error {
	fs := flags("token revoke", "token revoke ID|PREFIX", out,
		"Revokes one token, named by its id, by its display prefix (or the start of it: vr_ and at least\n"+
			"one more character) as `valruns token list` shows it, or by the whole token. A prefix that\n"+
			"matches several tokens revokes none and lists their ids. Revoking a revoked token says so.\n"+
			"API processes started afterwards refuse the token at once; running ones within AUTH_CACHE_TTL,\n"+
			"for which they trust a token they have verified.")
	operands, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(operands) != 1 {
		return badUsage("want one ID or PREFIX, got %d", len(operands))
	}
	ref := operands[0]
	if err := models.CheckTokenRef(ref); err != nil {
		return badUsage("%v", err)
	}
	a, err := open(ctx, forWork)
	if err != nil {
		return err
	}
	defer a.close()
	t, err := models.NewTokenStore(a.db).RevokeRef(ctx, ref)
	if amb, ok := errors.AsType[*models.AmbiguousTokenError](err); ok {
		return &exitError{amb.Error() + "; nothing revoked"}
	}
	switch {
	case errors.Is(err, models.ErrNotFound):
		return &exitError{fmt.Sprintf("no token matches %q (list an organisation's tokens with `valruns token list --org SLUG`)", ref)}
	case errors.Is(err, models.ErrAlreadyRevoked):
		fmt.Fprintf(out, "token %s (%s of %s) was already revoked at %s\n", t.ID, t.Display, t.OrgSlug, timeText(*t.RevokedAt))
		return nil
	case err != nil:
		return err
	}
	fmt.Fprintf(out, "revoked token %s (%s of %s) at %s\n", t.ID, t.Display, t.OrgSlug, timeText(*t.RevokedAt))
	fmt.Fprintf(out, "API processes started from now on refuse it; running ones within AUTH_CACHE_TTL (%s in this environment).\n", a.cfg.AuthCacheTTL)
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
