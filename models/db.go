// Package models is the data layer of valruns: GORM structs, the stores that
// read and write them, and the sentinel errors every other package matches
// with errors.Is. It is the one place that reads *pgconn.PgError codes.
package models

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/valruns/valruns/idempotency"
)

// Sentinel errors returned by the stores, wrapped with context.
var (
	// ErrNotFound: no such row in the caller's organisation.
	ErrNotFound = errors.New("not found")
	// ErrConflict: a unique constraint refused the write.
	ErrConflict = errors.New("conflict")
	// ErrQuotaExceeded: the organisation has used its monthly run quota.
	ErrQuotaExceeded = errors.New("monthly run quota exceeded")
	// ErrOrgGone: the caller's organisation no longer exists. An operator
	// deleted it (docs/operations.md) while one of its tokens was still
	// trusted from a cache: a write naming it broke a foreign key to
	// organizations, or a read of its own row found none.
	ErrOrgGone = errors.New("the organisation no longer exists")
	// ErrTestsPending: the endpoint has as many test events waiting for
	// their attempt as it may (SendTestEvent).
	ErrTestsPending = errors.New("test events pending")
	// ErrStalled: the database did not hand out a connection, or did not
	// answer a request's first statement, within DBOptions.AcquireTimeout or
	// AnswerTimeout (a hung or overwhelmed server). IsUnavailable holds for it.
	ErrStalled = errors.New("the database did not answer in time")
	// ErrOutcomeUnknown: a write was sent and its answer never came (the
	// connection broke, or the database stopped answering): it may have
	// committed or not. Only the retry of a keyed request can tell (it
	// replays, or does the work); IsUnavailable holds for it too.
	ErrOutcomeUnknown = errors.New("the database stopped answering after the write was sent: whether it committed is unknown")
)

// DBOptions tunes Open. The zero value is fine for production.
type DBOptions struct {
	// Tracer, when set, sees every statement pgx sends (tests count them).
	Tracer pgx.QueryTracer
	// MaxOpenConns caps the pool; 0 means 12 (DATABASE_MAX_CONNS's default).
	MaxOpenConns int
	// StatementTimeout, when set, is PostgreSQL's statement_timeout on every
	// connection: the server cancels a statement that runs longer and the
	// connection stays usable, so a rollback (which releases the request's
	// advisory lock) completes before the caller answers.
	StatementTimeout time.Duration
	// AcquireTimeout bounds how long a request waits for a connection
	// (connecting included); 0 means no bound but the request's own.
	AcquireTimeout time.Duration
	// AnswerTimeout bounds how long a request waits for the database's
	// answer to its first statement; 0 means no bound but the request's
	// own. Later statements of a request transaction are bounded by its
	// deadline only: they may wait on locks.
	AnswerTimeout time.Duration
	// TransactionPooler says the URL reaches a pooler in transaction mode
	// (PgBouncer's pool_mode=transaction, DATABASE_POOLER=transaction):
	// each transaction, and each statement outside one, may run on another
	// server connection, and the pooler refuses session parameters at
	// connect. So pgx prepares no named statement (see execModeBehindPooler)
	// and sends no session parameter: StatementTimeout and the client
	// check are then the role's settings (ALTER ROLE ... SET), and each
	// request transaction still sets its own (set_config(..., true)).
	TransactionPooler bool
}

// execModeBehindPooler picks pgx's query exec mode for a transaction
// pooler. pgx's default, cache_statement, prepares named statements on
// one server connection and executes them on whichever the pooler hands
// out next (PgBouncer 1.18: 42P05 / 26000). describe_exec describes an
// unnamed statement in one round trip and executes it in another, which a
// pooler may send to a different server connection whose unnamed statement
// is another: wrong results without an error. exec, cache_describe and
// simple_protocol each send a statement in one round trip; exec (text
// parameters typed by the server) is the default here, and the URL's
// default_query_exec_mode may pick either of the other two.
func execModeBehindPooler(m pgx.QueryExecMode) (pgx.QueryExecMode, error) {
	switch m {
	case pgx.QueryExecModeCacheStatement: // pgx's default: not asked for
		return pgx.QueryExecModeExec, nil
	case pgx.QueryExecModeDescribeExec:
		return m, errors.New("default_query_exec_mode=describe_exec returns wrong results behind a transaction pooler (DATABASE_POOLER=transaction): use exec, cache_describe or simple_protocol")
	}
	return m, nil
}

// errUnsurePrimary: a primary that has synchronous replication configured
// and no standby connected (see validateSyncPrimary).
var errUnsurePrimary = errors.New("primary with synchronous replication configured and no standby connected: it may show commits no standby has, and cannot acknowledge new ones")

// validateSyncPrimary refuses a primary that cannot acknowledge a commit:
// synchronous_standby_names set and no standby connected. That is a primary
// restarted after a crash (pg_auto_failover's keeper restarts a killed
// postmaster at once) while its standby is being promoted: until the
// monitor demotes it, it takes connections as a read-write server, and it
// shows the transactions it committed locally but never acknowledged (their
// COMMIT died waiting for the standby). A request reading there would
// replay a start the new primary never had, and the run would be lost. A
// healthy pg_auto_failover primary has a standby connected, or runs with
// synchronous replication off (wait_primary). Refused, pgx tries the URL's
// next host; when none is acceptable the request is 503 with Retry-After.
func validateSyncPrimary(ctx context.Context, c *pgconn.PgConn) error {
	res, err := c.Exec(ctx, `SELECT current_setting('synchronous_standby_names') = '' OR EXISTS (SELECT FROM pg_stat_replication)`).ReadAll()
	if err != nil {
		return err
	}
	if len(res) != 1 || len(res[0].Rows) != 1 || string(res[0].Rows[0][0]) != "t" {
		return errUnsurePrimary
	}
	return nil
}

// Open connects to PostgreSQL through pgx and GORM and pings it.
// With target_session_attrs in the URL (a multi-host URL that lists a
// formation's nodes: target_session_attrs=read-write picks its primary), a
// server is accepted only if it can acknowledge commits: see
// validateSyncPrimary.
// GORM's implicit per-statement transactions are off: every transaction in
// valruns is explicit, so a request costs exactly the statements it makes.
func Open(ctx context.Context, url string, opt DBOptions) (*gorm.DB, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse database url: %w", err)
	}
	cfg.Tracer = opt.Tracer
	if v := cfg.ValidateConnect; v != nil {
		// target_session_attrs picks the primary among the URL's hosts
		// (valruns needs writes); it must also be one whose data is sure.
		cfg.ValidateConnect = func(ctx context.Context, c *pgconn.PgConn) error {
			if err := v(ctx, c); err != nil {
				return err
			}
			return validateSyncPrimary(ctx, c)
		}
	}
	if opt.AcquireTimeout > 0 {
		cfg.ConnectTimeout = opt.AcquireTimeout
	}
	if opt.TransactionPooler {
		if cfg.DefaultQueryExecMode, err = execModeBehindPooler(cfg.DefaultQueryExecMode); err != nil {
			return nil, err
		}
	} else {
		if opt.StatementTimeout > 0 {
			cfg.RuntimeParams["statement_timeout"] = fmt.Sprint(opt.StatementTimeout.Milliseconds())
		}
		// A backend whose process died while one of its statements waits (on a
		// lock, say) exits within a second instead of finishing that statement,
		// which, in autocommit, would commit for a client that is gone: a
		// killed worker's final write, a killed API's start (see
		// ClientCheckInterval; PostgreSQL 14+).
		cfg.RuntimeParams["client_connection_check_interval"] = clientCheckMS
	}
	sqlDB := stdlib.OpenDB(*cfg)
	maxOpen := opt.MaxOpenConns
	if maxOpen == 0 {
		maxOpen = 12
	}
	sqlDB.SetMaxOpenConns(maxOpen)
	sqlDB.SetMaxIdleConns(maxOpen)
	connGates.Store(sqlDB, newTurns(maxOpen))
	poolLimits.Store(sqlDB, opt)
	sqlDB.SetConnMaxIdleTime(5 * time.Minute)
	pingCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := sqlDB.PingContext(pingCtx); err != nil {
		_ = sqlDB.Close()
		return nil, fmt.Errorf("connect to database: %w", err)
	}
	db, err := gorm.Open(postgres.New(postgres.Config{Conn: sqlDB}), &gorm.Config{
		SkipDefaultTransaction: true,
		Logger:                 logger.Discard,
		TranslateError:         false,
	})
	if err != nil {
		_ = sqlDB.Close()
		return nil, fmt.Errorf("open gorm: %w", err)
	}
	return db, nil
}

// connGates are the admission gates of the pools Open made, by pool.
var connGates sync.Map // *sql.DB -> *turns

// poolLimits are the options of the pools Open made, by pool.
var poolLimits sync.Map // *sql.DB -> DBOptions

func optionsOf(db *gorm.DB) DBOptions {
	o, _ := poolLimits.Load(SQLDB(db))
	opt, _ := o.(DBOptions)
	return opt
}

// stallBound returns ctx bounded by d, ending with cause ErrStalled (d 0:
// ctx as it is).
func stallBound(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if d <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeoutCause(ctx, d, ErrStalled)
}

// stalled is err, or ErrStalled when bounded ran out while ctx (the
// caller's) had time left.
func stalled(ctx, bounded context.Context, err error) error {
	if err != nil && ctx.Err() == nil && errors.Is(context.Cause(bounded), ErrStalled) {
		return fmt.Errorf("%w: %v", ErrStalled, err)
	}
	return err
}

// FirstAnswer bounds ctx, for a request's statements that make its first
// round trip (a read of one statement), by the pool's AcquireTimeout plus
// AnswerTimeout, with ErrStalled as its cause.
func FirstAnswer(ctx context.Context, db *gorm.DB) (context.Context, context.CancelFunc) {
	opt := optionsOf(db)
	if opt.AcquireTimeout <= 0 || opt.AnswerTimeout <= 0 {
		return context.WithCancel(ctx)
	}
	return stallBound(ctx, opt.AcquireTimeout+opt.AnswerTimeout)
}

// requestConn takes a connection of db's pool for a request's statements,
// when its tenant's turn comes (turns), and returns the function that
// gives it back. Statements outside requests (GORM's reads, the worker)
// take connections straight from the pool, so a request may still wait
// there, but behind at most the pool's size of others.
func requestConn(ctx context.Context, db *gorm.DB) (*sql.Conn, func(), error) {
	pool := SQLDB(db)
	gate, _ := connGates.Load(pool)
	actx, cancel := stallBound(ctx, optionsOf(db).AcquireTimeout)
	defer cancel()
	var leave func()
	if g, ok := gate.(*turns); ok {
		if !g.take(actx, tenantOf(ctx)) {
			return nil, nil, stalled(ctx, actx, fmt.Errorf("wait for a connection: %w", actx.Err()))
		}
		leave = g.give
	}
	conn, err := pool.Conn(actx)
	if err != nil {
		if leave != nil {
			leave()
		}
		return nil, nil, stalled(ctx, actx, err)
	}
	return conn, func() {
		_ = conn.Close()
		if leave != nil {
			leave()
		}
	}, nil
}

// SQLDB returns the database/sql pool under db (for migrations and Close).
func SQLDB(db *gorm.DB) *sql.DB {
	s, err := db.DB()
	if err != nil { // only when db was not opened by Open
		panic(err)
	}
	return s
}

// translate maps PostgreSQL errors to the package's sentinels.
func translate(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, gorm.ErrRecordNotFound) || errors.Is(err, sql.ErrNoRows) {
		return ErrNotFound
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "23505": // unique_violation
			if pgErr.ConstraintName == keyConstraint {
				return fmt.Errorf("%w: %w: %s", ErrConflict, idempotency.ErrKeyTaken, pgErr.ConstraintName)
			}
			return fmt.Errorf("%w: %s", ErrConflict, pgErr.ConstraintName)
		case "22P02": // invalid_text_representation, e.g. a malformed uuid
			return ErrNotFound
		case "23503": // foreign_key_violation
			if orgForeignKeys[pgErr.ConstraintName] {
				return fmt.Errorf("%w: %s", ErrOrgGone, pgErr.ConstraintName)
			}
		}
	}
	return err
}

// keyConstraint names the error idempotency_key_taken raises (migrations
// 0002, 0004, 0012): a write of a key found the key's live row, which
// another request committed (sql/save_key.sql, sql/start_batch.sql).
const keyConstraint = "idempotency_keys_pkey"

// isUndefinedTable reports whether err is undefined_table: a key partition
// another cleaner detached or dropped meanwhile.
func isUndefinedTable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42P01"
}

// orgForeignKeys are the foreign keys to organizations (migrations/): a
// write that breaks one names an organisation that no longer exists.
var orgForeignKeys = map[string]bool{
	"api_tokens_org_id_fkey":         true,
	"workflows_org_id_fkey":          true,
	"usage_slots_org_id_fkey":        true,
	"webhook_endpoints_org_id_fkey":  true,
	"webhook_deliveries_org_id_fkey": true,
}

// IsUnavailable reports whether err says the database cannot be reached or
// is going away: the connection was refused or lost, the server is shutting
// down, starting up or in recovery, or it no longer takes writes (a primary
// being demoted in a failover or switchover: read_only_sql_transaction).
// A request that meets it did nothing (its transaction died with the
// connection, or was refused) and can be retried shortly: with a multi-host
// DATABASE_URL and target_session_attrs=read-write, on the new primary.
func IsUnavailable(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, ErrStalled) || errors.Is(err, ErrOutcomeUnknown) {
		return true
	}
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case strings.HasPrefix(pgErr.Code, "08"): // connection_exception
			return true
		case pgErr.Code == "57P01", pgErr.Code == "57P02", pgErr.Code == "57P03": // admin/crash shutdown, cannot connect now
			return true
		case pgErr.Code == "53300": // too_many_connections
			return true
		case pgErr.Code == "25006": // read_only_sql_transaction: a demoted primary, or a standby
			return true
		}
		return false
	}
	var netErr net.Error
	return errors.As(err, &netErr) || errors.Is(err, driver.ErrBadConn) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, io.EOF) || errors.Is(err, sql.ErrConnDone) || errors.Is(err, pgconn.ErrConnClosed) ||
		pgconn.SafeToRetry(err)
}

// inDoubt reports whether err, met after a write (or its COMMIT) was sent,
// leaves the write's outcome unknown: the server answered nothing about it
// (a broken connection, no answer in time) or ended the session (FATAL: it
// may end it after the commit, before the answer). An error the server
// answered the statement with rolled it back; one pgx met before sending
// anything (SafeToRetry) wrote nothing.
func inDoubt(err error) bool {
	if errors.Is(err, errRolledBack) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Severity == "FATAL" || pgErr.Severity == "PANIC"
	}
	return !pgconn.SafeToRetry(err)
}

// IsTimeout reports whether err comes from a cancelled or timed-out statement.
func IsTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return true
	}
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "57014" // query_canceled
}

// ErrRunFinished: the run already ended; executing it again would be a duplicate.
var ErrRunFinished = errors.New("run already finished")

// RunLeasedError: another delivery holds the run until Until; Attempts is
// the attempt it is executing.
type RunLeasedError struct {
	RunID    string
	Until    time.Time
	Attempts int
}

func (e *RunLeasedError) Error() string {
	return fmt.Sprintf("run %s is being executed (attempt %d) until %s", e.RunID, e.Attempts, e.Until.UTC().Format(time.RFC3339))
}
