package models

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"gorm.io/gorm"

	"github.com/valruns/valruns/idempotency"
)

// KeyStore reads and writes idempotency keys, and is the idempotency
// wrapper's Store: its transactions are RequestTx. Every lookup is by the
// scoped key (org_id, endpoint, key), the table's unique index; a key's
// tenant is its organisation and its scope the endpoint. A key's
// ResourceID is kept in validation_run_id, a uuid with a foreign key to
// validation_runs (ON DELETE SET NULL): a run's id, or empty.
type KeyStore struct{ db *gorm.DB }

// NewKeyStore returns a KeyStore on db.
func NewKeyStore(db *gorm.DB) *KeyStore { return &KeyStore{db: db} }

var _ idempotency.Store[*RequestTx] = (*KeyStore)(nil)

// Lookup reads k's row with one indexed read, without a transaction.
// When there is no live row it also looks, read-only, at pg_locks for the
// key's advisory lock (k.LockID), so a retry storm against a request in
// flight is answered 409 from this one statement, without a transaction
// and without touching the lock itself. The probe is a hint: only the lock
// decides who executes.
func (s *KeyStore) Lookup(ctx context.Context, k *idempotency.Key) (idempotency.Result, error) {
	lockID := uint64(k.LockID)
	var (
		res      idempotency.Result
		expired  bool
		inFlight bool
	)
	actx, cancel := FirstAnswer(ctx, s.db)
	defer cancel()
	err := withConn(actx, s.db, func(c *pgx.Conn) error {
		var err error
		res.Key, expired, err = scanKey(c.QueryRow(actx, lookupKeySQL,
			int64(lockID>>32), int64(lockID&0xffffffff), k.Tenant, k.Scope, k.Key), &inFlight)
		return err
	})
	if err = stalled(ctx, actx, err); errors.Is(err, ErrStalled) {
		return idempotency.Result{}, fmt.Errorf("lookup idempotency key: %w", err)
	}
	if err != nil {
		return idempotency.Result{}, fmt.Errorf("lookup idempotency key: %w", translate(err))
	}
	res.Kind = keyState(res.Key, expired, !inFlight)
	if res.Key != nil {
		res.Key.Tenant, res.Key.Scope, res.Key.LockID = k.Tenant, k.Scope, k.LockID
	}
	return res, nil
}

// keyState is what a key's row (nil: none) and its lock say of a request
// with the key: its live row answers it, another request holds it (not
// free), or it may be done.
func keyState(row *idempotency.Key, expired, free bool) idempotency.Kind {
	switch {
	case row != nil && !expired:
		return idempotency.KeyAnswered
	case !free:
		return idempotency.KeyInFlight
	}
	return idempotency.NotDone
}

// Begin begins a request's transaction (BeginRequest).
func (s *KeyStore) Begin(ctx context.Context, timeout time.Duration, k *idempotency.Key) (*RequestTx, idempotency.Result, error) {
	return BeginRequest(ctx, s.db, timeout, k)
}

// Failure says what err means for an idempotent request: ErrOutcomeUnknown,
// then unavailable (IsUnavailable), then a timeout (IsTimeout).
func (s *KeyStore) Failure(err error) idempotency.Failure {
	switch {
	case errors.Is(err, ErrOutcomeUnknown):
		return idempotency.OutcomeUnknown
	case IsUnavailable(err):
		return idempotency.Unavailable
	case IsTimeout(err):
		return idempotency.Timeout
	}
	return idempotency.Internal
}

// scanKey reads a key row's columns, as lookup_key.sql and begin_keyed.sql
// select them, then extra: the row, nil when there is none (its columns
// NULL), and whether it has expired by the database's clock.
func scanKey(row pgx.Row, extra ...any) (k *idempotency.Key, expired bool, err error) {
	var (
		key, method, path, requestID, resource *string
		status                                 *int
		created, expires                       *time.Time
		exp                                    *bool
		hash, body, headers                    []byte
	)
	dest := append([]any{&key, &hash, &method, &path, &status, &body,
		&headers, &resource, &requestID, &created, &expires, &exp}, extra...)
	if err := row.Scan(dest...); err != nil || key == nil {
		return nil, false, err
	}
	k = &idempotency.Key{Key: *key, RequestHash: hash, Method: *method, Path: *path, RequestID: *requestID,
		Status: *status, Headers: headers, Body: body, CreatedAt: *created, ExpiresAt: *expires}
	if resource != nil {
		k.ResourceID = *resource
	}
	return k, *exp, nil
}

// TryLock takes the transaction-scoped advisory lock on tx without waiting.
// It is released by the transaction's commit or rollback, or with the
// connection if the process dies: a crash never leaves a key locked.
func (s *KeyStore) TryLock(tx *gorm.DB, lockID int64) (bool, error) {
	var ok bool
	if err := tx.Raw(`SELECT pg_try_advisory_xact_lock(?)`, lockID).Scan(&ok).Error; err != nil {
		return false, fmt.Errorf("lock idempotency key: %w", translate(err))
	}
	return ok, nil
}

// The key's statements (sql/lookup_key.sql: Lookup's probe; sql/save_key.sql:
// RequestTx.Commit's write of the finished row; sql/delete_expired_keys.sql).
var (
	lookupKeySQL         = statement("lookup_key")
	saveKeySQL           = statement("save_key")
	deleteExpiredKeysSQL = statement("delete_expired_keys")
)

func saveKeyArgs(k *idempotency.Key) []any {
	return []any{
		k.Tenant, k.Scope, k.Key, k.RequestHash, k.Method, truncate(k.Path, 2000),
		k.Status, k.Body, string(k.Headers), nullable(k.ResourceID),
		k.RequestID, truncate(k.ClientIP, 100), truncate(k.UserAgent, 1000), k.TTL.Microseconds(),
	}
}

// truncate makes s storable in a text column of at most n characters:
// invalid UTF-8 and NUL become U+FFFD, and s is cut to n characters, never
// inside one. (Client-supplied values such as User-Agent must never turn a
// request into a 500.)
func truncate(s string, n int) string {
	s = strings.ToValidUTF8(strings.ReplaceAll(s, "\x00", "\uFFFD"), "\uFFFD")
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	return string([]rune(s)[:n])
}

// DeleteExpiredBatch deletes up to n keys past expires_at in one short
// transaction of its own. SKIP LOCKED: rows a concurrent request is
// overwriting (or another cleaner is deleting) are left for the next batch,
// so the cleanup never waits on, or blocks, a request. Runs keep existing
// (and the key they were started with). A key has no id: the batch found
// by the expires_at index is deleted by the rows' places (ctid).
func (s *KeyStore) DeleteExpiredBatch(ctx context.Context, n int) (int64, error) {
	res := s.db.WithContext(ctx).Exec(deleteExpiredKeysSQL, n)
	if res.Error != nil {
		return 0, fmt.Errorf("delete expired keys: %w", translate(res.Error))
	}
	return res.RowsAffected, nil
}

// CountExpired counts the keys past expires_at.
func (s *KeyStore) CountExpired(ctx context.Context) (int64, error) {
	var n int64
	if err := s.db.WithContext(ctx).Raw(`SELECT count(*) FROM idempotency_keys WHERE expires_at <= now()`).Scan(&n).Error; err != nil {
		return 0, fmt.Errorf("count expired keys: %w", translate(err))
	}
	return n, nil
}

// DeleteExpired deletes every key past expires_at, batch keys per
// transaction, until none remain, and returns how many it deleted.
func (s *KeyStore) DeleteExpired(ctx context.Context, batch int) (int64, error) {
	var total int64
	for {
		n, err := s.DeleteExpiredBatch(ctx, batch)
		total += n
		if err != nil {
			return total, err
		}
		if n == 0 { // not n < batch: SKIP LOCKED may return a short batch while more remain
			return total, nil
		}
	}
}
