package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"
	"gorm.io/gorm"

	"github.com/valruns/valruns/config"
	"github.com/valruns/valruns/internal/telemetry"
	"github.com/valruns/valruns/migrations"
	"github.com/valruns/valruns/models"
)

// app is what every command that touches the database needs.
type app struct {
	cfg config.Config
	log *slog.Logger
	db  *gorm.DB
	// tracing is the tracer provider the OTEL_* variables set up for work
	// (serve, worker); nil: tracing is off. stopTracing flushes it.
	tracing     trace.TracerProvider
	stopTracing func(context.Context) error
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
	var tp trace.TracerProvider
	stopTracing := func(context.Context) error { return nil }
	if p == forWork {
		// The one start-up of serve and worker: traces are set up before
		// the pool, whose statements they trace.
		if tp, stopTracing, err = telemetry.Setup(ctx, telemetry.Config{Version: Release, Log: log}); err != nil {
			var ce *telemetry.ConfigError
			if errors.As(err, &ce) {
				return nil, &config.Error{Var: ce.Var, Value: ce.Value, Problem: ce.Problem}
			}
			return nil, err
		}
		if tp != nil {
			log.InfoContext(ctx, "tracing on", "endpoint", telemetry.Endpoint())
		}
	}
	// For work, a statement never outlives the request transaction's
	// deadline (see idempotency.Config.TxTimeout).
	opt := models.DBOptions{MaxOpenConns: cfg.DatabaseMaxConns,
		AcquireTimeout: cfg.DatabaseAcquireTimeout, AnswerTimeout: cfg.DatabaseAnswerTimeout}
	name, url := "DATABASE_URL", cfg.DatabaseURL
	if p == forWork {
		opt.StatementTimeout = cfg.IdempotencyTxTimeout
		opt.TransactionPooler = cfg.DatabasePooler == "transaction"
		opt.Tracer = telemetry.PgxTracer(tp, opt.Tracer, models.StatementName)
	} else if cfg.DatabaseDirectURL != cfg.DatabaseURL {
		name, url = "DATABASE_DIRECT_URL", cfg.DatabaseDirectURL
	}
	db, err := models.Open(ctx, url, opt)
	if err != nil {
		_ = telemetry.Shutdown(stopTracing, time.Second)
		return nil, &config.Error{Var: name, Value: redact(url), Problem: oneLine(err)}
	}
	a := &app{cfg: cfg, log: log, db: db, tracing: tp, stopTracing: stopTracing}
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

// close closes the pool and flushes the spans not yet exported.
func (a *app) close() {
	_ = models.SQLDB(a.db).Close()
	if a.stopTracing != nil {
		if err := telemetry.Shutdown(a.stopTracing, 5*time.Second); err != nil {
			a.log.Warn("could not flush the last traces", "error", err)
		}
	}
}

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
		return a.makeKeyPartitions(ctx, mdb)
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
	return a.makeKeyPartitions(ctx, mdb)
}

// makeKeyPartitions makes the idempotency keys' partitions that this
// process's IDEMPOTENCY_TTL needs and the cleanup has not made yet (a TTL
// just raised): every start's key row then has its partition.
func (a *app) makeKeyPartitions(ctx context.Context, db *gorm.DB) error {
	made, err := models.NewKeyStore(db).MakePartitions(ctx, a.cfg.IdempotencyTTL)
	if made > 0 {
		a.log.InfoContext(ctx, "idempotency key partitions made", "made", made)
	}
	return err
}

func newLogger(cfg config.Config, w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.LogLevel)) // validated by config
	opts := &slog.HandlerOptions{Level: level}
	// Every line logged with a context carries its request_id, and its
	// trace_id and span_id while a span is active.
	if cfg.LogFormat == "json" {
		return slog.New(telemetry.LogHandler(slog.NewJSONHandler(w, opts)))
	}
	return slog.New(telemetry.LogHandler(slog.NewTextHandler(w, opts)))
}

func timeText(t time.Time) string { return t.UTC().Format(time.RFC3339) }

func writeJSON(out io.Writer, v any) error {
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
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
