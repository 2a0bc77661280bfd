package models

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"gorm.io/gorm"

	"github.com/valruns/valruns/idempotency"
)

// RequestTx is the one transaction of an idempotent request, on a pooled
// connection it holds until Commit or Rollback. It spends as few round
// trips as PostgreSQL allows, by sending statements that do not depend on
// each other together (a pgx batch: one write, one read):
//
//   - BeginRequest: BEGIN, and one statement that sets the transaction's own
//     statement_timeout and client_connection_check_interval and, for a
//     keyed request, reads the key's row and takes pg_try_advisory_xact_lock
//     on it unless a live row answers it;
//   - the handler's statements, through DB;
//   - Commit: the key row with the answer, and COMMIT.
//
// Either way a request costs its handler's statements plus two round trips.
type RequestTx struct {
	ctx  context.Context // the request's, detached from its client
	conn *sql.Conn
	done func() // gives conn back (requestConn)
	db   *gorm.DB
	// open: BEGIN was sent and neither COMMIT nor ROLLBACK since.
	open bool
	// replaces: the key's newest row has expired; Commit writes a new row
	// beside it (the old one goes with its partition).
	replaces bool
}

var _ idempotency.Tx = (*RequestTx)(nil)

// ClientCheckInterval is how often PostgreSQL checks, while a statement of
// a request's transaction runs, that the API process is still connected
// (client_connection_check_interval, PostgreSQL 14+, set for the
// transaction only). A backend notices a dead client on its own only when
// it next reads from or writes to the socket: one blocked on a lock when
// its process is killed would keep the key's advisory lock (every retry:
// 409) until its statement ended, at worst IDEMPOTENCY_TX_TIMEOUT later.
// With the check it exits, and frees the key, within this interval.
const ClientCheckInterval = time.Second

// clientCheckMS is ClientCheckInterval as set_config takes it.
var clientCheckMS = strconv.FormatInt(ClientCheckInterval.Milliseconds(), 10)

// beginKeyedSQL sets the transaction's statement_timeout and
// client_connection_check_interval, reads the key's row and takes the
// key's lock (sql/begin_keyed.sql).
var beginKeyedSQL = statement("begin_keyed")

// BeginRequest takes a connection from db's pool and begins a transaction on
// it whose statements may each run for at most timeout (SET LOCAL
// statement_timeout: the server cancels a statement that hangs and the
// connection stays usable, so the rollback that frees the key's lock
// completes before the caller answers).
//
// With a key (k's Tenant, Scope, Key and LockID), the same round trip reads
// the key's row and tries the key's transaction-scoped advisory lock. t is
// nil, and the transaction already rolled back, when the request must not
// execute: a live row answers it (KeyAnswered), or another transaction
// holds the lock (KeyInFlight). Otherwise the result is NotDone, with the
// key's newest row, expired, if there is one.
func BeginRequest(ctx context.Context, db *gorm.DB, timeout time.Duration, k *idempotency.Key) (t *RequestTx, res idempotency.Result, err error) {
	conn, done, err := requestConn(ctx, db)
	if errors.Is(err, ErrStalled) {
		return nil, res, fmt.Errorf("begin: %w", err)
	}
	if err != nil {
		return nil, res, fmt.Errorf("begin: %w", translate(err))
	}
	t = &RequestTx{ctx: ctx, conn: conn, done: done}
	locked, expired := true, false
	err = t.pgx(func(c *pgx.Conn) error {
		var b pgx.Batch
		b.Queue("begin")
		ms := strconv.FormatInt(max(timeout.Milliseconds(), 1), 10)
		if k == nil {
			b.Queue(`SELECT set_config('statement_timeout', $1, true), set_config('client_connection_check_interval', $2, true)`, ms, clientCheckMS)
		} else {
			b.Queue(beginKeyedSQL, ms, k.LockID, k.Tenant, k.Scope, k.Key, clientCheckMS).
				QueryRow(func(row pgx.Row) error {
					var timeout, check string
					var err error
					res.Key, expired, err = scanKey(row, &timeout, &check, &locked)
					return err
				})
		}
		t.open = true
		// The first answer has its own short deadline: a hung database
		// is a 503 in seconds, not at the transaction's deadline.
		actx, cancel := stallBound(ctx, optionsOf(db).AnswerTimeout)
		defer cancel()
		return stalled(ctx, actx, c.SendBatch(actx, &b).Close())
	})
	if errors.Is(err, ErrStalled) {
		t.Rollback()
		return nil, idempotency.Result{}, fmt.Errorf("begin: %w", err)
	}
	if err != nil {
		t.Rollback()
		return nil, idempotency.Result{}, fmt.Errorf("begin: %w", translate(err))
	}
	if res.Key != nil {
		res.Key.Tenant, res.Key.Scope, res.Key.LockID = k.Tenant, k.Scope, k.LockID
	}
	if res.Kind = keyState(res.Key, expired, locked); res.Kind != idempotency.NotDone {
		t.Rollback()
		return nil, res, nil
	}
	t.replaces = res.Key != nil
	t.db = db.Session(&gorm.Session{NewDB: true, Context: ctx})
	t.db.Statement.ConnPool = conn
	return t, res, nil
}

// DB is the transaction as a GORM session, for the handler's statements.
// The stores' hot statements (RunStore.Start) take the RequestTx itself
// and go to pgx directly: GORM builds every statement's text anew, and
// renders it with its values for its logger even when nothing logs.
func (t *RequestTx) DB() *gorm.DB { return t.db }

// Context is the transaction's context: the request's, which the client
// cannot cancel, with the transaction's deadline.
func (t *RequestTx) Context() context.Context { return t.ctx }

// errRolledBack: COMMIT answered ROLLBACK (a statement of the transaction
// had failed): nothing was written.
var errRolledBack = errors.New("the transaction had failed and was rolled back")

// Commit writes k, the finished key row (nil: none), and commits, in one
// round trip, and answers Committed with k, its ExpiresAt set by the
// database's clock. An expired row of the same scoped key is left alone
// (the new row succeeds it). If a live row exists, someone finished
// this key first: nothing is committed, and the error is an ErrConflict
// and an idempotency.ErrKeyTaken. A transaction that failed (a statement's
// error was ignored) is rolled back instead, and Commit says so.
func (t *RequestTx) Commit(ctx context.Context, k *idempotency.Key) (idempotency.Result, error) {
	var err error
	if k == nil {
		err = t.pgx(func(c *pgx.Conn) error { return t.commit(ctx, c) })
	} else {
		err = t.pgx(func(c *pgx.Conn) error { return t.commitWithKey(ctx, c, k) })
	}
	if err != nil {
		t.Rollback()
		if inDoubt(err) {
			return idempotency.Result{}, fmt.Errorf("commit: %w: %w", ErrOutcomeUnknown, err)
		}
		return idempotency.Result{}, fmt.Errorf("commit: %w", translate(err))
	}
	t.release()
	return idempotency.Result{Kind: idempotency.Committed, Key: k, Replaced: k != nil && t.replaces}, nil
}

// commit sends COMMIT.
func (t *RequestTx) commit(ctx context.Context, c *pgx.Conn) error {
	tag, err := c.Exec(ctx, "commit")
	t.open = err != nil // an error leaves the state unknown: Rollback discards the connection
	if err == nil && tag.String() == "ROLLBACK" {
		return errRolledBack
	}
	return err
}

// commitWithKey sends the key row k (save_key.sql) and COMMIT together,
// and sets k.ExpiresAt.
func (t *RequestTx) commitWithKey(ctx context.Context, c *pgx.Conn, k *idempotency.Key) error {
	var b pgx.Batch
	b.Queue(saveKeySQL, saveKeyArgs(k)...)
	b.Queue("commit")
	br := c.SendBatch(ctx, &b)
	if err := br.QueryRow().Scan(&k.ExpiresAt); err != nil {
		_ = br.Close()
		return err // the COMMIT was skipped: still open, in a failed state
	}
	tag, err := br.Exec()
	if err == nil {
		t.open = false
		if tag.String() == "ROLLBACK" {
			err = errRolledBack
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}

// Rollback rolls back an open transaction and gives the connection back to
// the pool; after Commit it does nothing. A connection whose state is
// unknown (the rollback failed, the context ended mid-statement) is closed
// rather than reused.
func (t *RequestTx) Rollback() {
	if t.conn == nil {
		return
	}
	if t.open {
		// Not the request's context: it may be past its deadline, and the
		// rollback is what frees the key's lock.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err := t.pgx(func(c *pgx.Conn) error {
			_, err := c.Exec(ctx, "rollback")
			return err
		})
		if err != nil {
			_ = t.conn.Raw(func(any) error { return driver.ErrBadConn }) // closes it
		}
		t.open = false
	}
	t.release()
}

func (t *RequestTx) release() {
	if t.conn != nil {
		t.done()
		t.conn = nil
	}
}

// withConn runs fn on a pgx connection of db's pool, for statements that
// are hot enough to skip GORM (see RequestTx.DB).
func withConn(ctx context.Context, db *gorm.DB, fn func(*pgx.Conn) error) error {
	conn, done, err := requestConn(ctx, db)
	if err != nil {
		return err
	}
	defer done()
	return rawPgx(conn, fn)
}

// pgx runs fn on the pgx connection under t's database/sql connection: the
// way to send a batch, and the stores' hot statements. The handler's
// statements through DB go over database/sql on the same connection, never
// at the same time.
func (t *RequestTx) pgx(fn func(*pgx.Conn) error) error { return rawPgx(t.conn, fn) }

func rawPgx(conn *sql.Conn, fn func(*pgx.Conn) error) error {
	return conn.Raw(func(dc any) error {
		sc, ok := dc.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("database/sql driver connection is %T, not pgx's", dc)
		}
		return fn(sc.Conn())
	})
}
