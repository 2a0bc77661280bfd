package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/valruns/valruns/config"
	"github.com/valruns/valruns/migrations"
	"github.com/valruns/valruns/models"
)

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
	opt := models.DBOptions{MaxOpenConns: cfg.DatabaseMaxConns,
		AcquireTimeout: cfg.DatabaseAcquireTimeout, AnswerTimeout: cfg.DatabaseAnswerTimeout}
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
