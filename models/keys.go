package models

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"gorm.io/gorm"
)

// KeyStore reads and writes idempotency keys. Every lookup is by the scoped
// key (org_id, endpoint, key), the table's unique index.
type KeyStore struct{ db *gorm.DB }

// NewKeyStore returns a KeyStore on db.
func NewKeyStore(db *gorm.DB) *KeyStore { return &KeyStore{db: db} }

// StoredKey is what the replay fast path learns in one statement: the key
// row if there is one (Key is "" when there is none), whether it has expired
// by the database's clock, and, when no live row exists, whether a request
// holding the key's lock is in flight.
type StoredKey struct {
	IdempotencyKey
	Expired  bool
	InFlight bool
}

// Found reports whether a key row exists (live or expired).
func (k *StoredKey) Found() bool { return k.Key != "" }

// Lookup reads the key row with one indexed read, without a transaction.
// When there is no live row it also looks, read-only, at pg_locks for the
// key's advisory lock, so a retry storm against a request in flight is
// answered 409 from this one statement, without a transaction and without
// touching the lock itself. The probe is a hint: only the lock decides who
// executes.
func (s *KeyStore) Lookup(ctx context.Context, orgID, endpoint, key string) (*StoredKey, error) {
	lockID := uint64(LockID(orgID, endpoint, key))
	k := &StoredKey{IdempotencyKey: IdempotencyKey{OrgID: orgID, Endpoint: endpoint}}
	actx, cancel := FirstAnswer(ctx, s.db)
	defer cancel()
	err := withConn(actx, s.db, func(c *pgx.Conn) error {
		return scanKey(c.QueryRow(actx, lookupKeySQL,
			int64(lockID>>32), int64(lockID&0xffffffff), orgID, endpoint, key), k, &k.InFlight)
	})
	if err = stalled(ctx, actx, err); errors.Is(err, ErrStalled) {
		return nil, fmt.Errorf("lookup idempotency key: %w", err)
	}
	if err != nil {
		return nil, fmt.Errorf("lookup idempotency key: %w", translate(err))
	}
	return k, nil
}

// scanKey reads a key row's columns (NULL when there is none: k stays
// empty), as Lookup and beginKeyedSQL select them, then extra.
func scanKey(row pgx.Row, k *StoredKey, extra ...any) error {
	var (
		key, method, path, requestID *string
		status                       *int
		created, expires             *time.Time
		expired                      *bool
	)
	dest := append([]any{&key, &k.RequestHash, &method, &path, &status, &k.ResponseBody,
		&k.ResponseHeaders, &k.ValidationRunID, &requestID, &created, &expires, &expired}, extra...)
	if err := row.Scan(dest...); err != nil || key == nil {
		return err
	}
	k.Key, k.RequestMethod, k.RequestPath, k.RequestID = *key, *method, *path, *requestID
	k.ResponseStatus, k.CreatedAt, k.ExpiresAt, k.Expired = *status, *created, *expires, *expired
	return nil
}

// LockID is the advisory lock number of a scoped key: 64 bits of SHA-256, so
// two keys share a lock (and one sees a spurious 409) with negligible odds.
func LockID(orgID, endpoint, key string) int64 {
	h := sha256.New()
	for _, s := range []string{orgID, endpoint, key} {
		var n [4]byte
		binary.BigEndian.PutUint32(n[:], uint32(len(s)))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	return int64(binary.BigEndian.Uint64(h.Sum(nil)))
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
// RequestTx.CommitWithKey's write of the finished row; sql/delete_expired_keys.sql).
var (
	lookupKeySQL         = statement("lookup_key")
	saveKeySQL           = statement("save_key")
	deleteExpiredKeysSQL = statement("delete_expired_keys")
)

func saveKeyArgs(k *IdempotencyKey, ttl time.Duration) []any {
	return []any{
		k.OrgID, k.Endpoint, k.Key, k.RequestHash, k.RequestMethod, truncate(k.RequestPath, 2000),
		k.ResponseStatus, k.ResponseBody, string(k.ResponseHeaders), k.ValidationRunID,
		k.RequestID, truncate(k.ClientIP, 100), truncate(k.UserAgent, 1000), ttl.Microseconds(),
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
