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
)

// RequestTx is the one transaction of an idempotent request, on a pooled
// connection it holds until Commit or Rollback. It spends as few round
// trips as PostgreSQL allows, by sending statements that do not depend on
// each other together (a pgx batch: one write, one read):
//
//   - BeginRequest: BEGIN, the transaction's own statement_timeout and, for a
//     keyed request, pg_try_advisory_xact_lock on the key;
//   - the handler's statements, through DB;
//   - CommitWithKey: the key row with the answer, and COMMIT.
//
// A keyed request therefore costs its handler's statements plus two round
// trips, and a request without a key one more than its handler (Commit).
type RequestTx struct {
	conn *sql.Conn
	db   *gorm.DB
	// open: BEGIN was sent and neither COMMIT nor ROLLBACK since.
	open bool
}

// BeginRequest takes a connection from db's pool and begins a transaction on
// it whose statements may each run for at most timeout (SET LOCAL
// statement_timeout: the server cancels a statement that hangs and the
// connection stays usable, so the rollback that frees the key's lock
// completes before the caller answers). With lockID, it also tries the
// transaction-scoped advisory lock: locked is false when another
// transaction holds it, and the transaction is then already rolled back.
func BeginRequest(ctx context.Context, db *gorm.DB, timeout time.Duration, lockID *int64) (t *RequestTx, locked bool, err error) {
	conn, err := SQLDB(db).Conn(ctx)
	if err != nil {
		return nil, false, fmt.Errorf("begin: %w", translate(err))
	}
	t = &RequestTx{conn: conn}
	locked = true
	err = t.pgx(func(c *pgx.Conn) error {
		var b pgx.Batch
		b.Queue("begin")
		ms := strconv.FormatInt(max(timeout.Milliseconds(), 1), 10)
		if lockID == nil {
			b.Queue(`SELECT set_config('statement_timeout', $1, true)`, ms)
		} else {
			b.Queue(`SELECT set_config('statement_timeout', $1, true), pg_try_advisory_xact_lock($2)`, ms, *lockID).
				QueryRow(func(row pgx.Row) error {
					var setting string
					return row.Scan(&setting, &locked)
				})
		}
		t.open = true
		return c.SendBatch(ctx, &b).Close()
	})
	if err != nil {
		t.Rollback()
		return nil, false, fmt.Errorf("begin: %w", translate(err))
	}
	if !locked {
		t.Rollback()
		return nil, false, nil
	}
	t.db = db.Session(&gorm.Session{NewDB: true, Context: ctx})
	t.db.Statement.ConnPool = conn
	return t, true, nil
}

// DB is the transaction, for the handler's statements.
func (t *RequestTx) DB() *gorm.DB { return t.db }

// Commit commits. A transaction that failed (a statement's error was
// ignored) is rolled back instead, and Commit says so.
func (t *RequestTx) Commit(ctx context.Context) error {
	err := t.pgx(func(c *pgx.Conn) error {
		tag, err := c.Exec(ctx, "commit")
		t.open = err != nil // an error leaves the state unknown: Rollback discards the connection
		if err == nil && tag.String() == "ROLLBACK" {
			return errors.New("the transaction had failed and was rolled back")
		}
		return err
	})
	if err != nil {
		t.Rollback()
		return fmt.Errorf("commit: %w", translate(err))
	}
	t.release()
	return nil
}

// CommitWithKey writes the finished key row k, replayed for ttl, and commits,
// in one round trip, and returns when the key expires (by the database's
// clock). A row of the same scoped key that has expired is taken over (the
// upsert gives it k.ID, which unlinks its old run). If a live row exists,
// someone finished this key first: nothing is committed, and the error is
// ErrConflict.
func (t *RequestTx) CommitWithKey(ctx context.Context, k *IdempotencyKey, ttl time.Duration) (expires time.Time, err error) {
	err = t.pgx(func(c *pgx.Conn) error {
		var b pgx.Batch
		b.Queue(saveKeySQL, saveKeyArgs(k, ttl))
		b.Queue("commit")
		br := c.SendBatch(ctx, &b)
		if err := br.QueryRow().Scan(&expires); err != nil {
			_ = br.Close()
			return err // the COMMIT was skipped: still open, in a failed state
		}
		tag, err := br.Exec()
		if err == nil {
			t.open = false
			if tag.String() == "ROLLBACK" {
				err = errors.New("the transaction had failed and was rolled back")
			}
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		return err
	})
	if err != nil {
		t.Rollback()
		return time.Time{}, fmt.Errorf("save idempotency key: %w", translate(err))
	}
	t.release()
	return expires, nil
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
		_ = t.conn.Close()
		t.conn = nil
	}
}

// pgx runs fn on the pgx connection under t's database/sql connection: the
// one way to send a batch. The handler's statements go through database/sql
// on the same connection, never at the same time.
func (t *RequestTx) pgx(fn func(*pgx.Conn) error) error {
	return t.conn.Raw(func(dc any) error {
		sc, ok := dc.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("database/sql driver connection is %T, not pgx's", dc)
		}
		return fn(sc.Conn())
	})
}
