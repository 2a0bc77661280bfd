package models

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"gorm.io/gorm"

	"github.com/valruns/valruns/idempotency"
)

// KeyStore reads and writes idempotency keys, and is the idempotency
// wrapper's Store: its transactions are RequestTx. Every lookup is by the
// scoped key (org_id, endpoint, key), a prefix of the primary key, and
// reads the key's newest row (the table is partitioned by day of
// expires_at, migration 0012: a key may have an expired row and a live
// one); a key's tenant is its organisation and its scope the endpoint. A
// key's ResourceID is kept in validation_run_id, a run's id (no foreign
// key: migration 0012 says why), or empty.
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
// RequestTx.Commit's write of the finished row).
var (
	lookupKeySQL = statement("lookup_key")
	saveKeySQL   = statement("save_key")
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

// KeyPartition is one day partition of idempotency_keys (migration 0012).
type KeyPartition struct {
	Name string
	// From and To bound its keys' expires_at: [From, To), a UTC day.
	From, To time.Time
	// Attached is false for a partition a cleanup detached but did not drop.
	Attached bool
	// Pending: a DETACH ... CONCURRENTLY of it was interrupted.
	Pending bool
	// Expired: its whole range has passed (To <= now, the database's clock).
	Expired bool
	// Ahead: its range starts after now.
	Ahead bool
	// Estimate is the planner's estimate of its rows; -1: never vacuumed
	// or analysed.
	Estimate int64
}

// KeyCleanup is what a cleanup of the keys did, and the partitions it left.
type KeyCleanup struct {
	// Made is the partitions made ahead, Dropped those dropped.
	Made, Dropped int
	// Keys is the keys in the partitions dropped: counted, or at least
	// Keys when AtLeast (a partition past countBound; see dropPartition).
	Keys    int64
	AtLeast bool
	// Oldest is the lower bound of the oldest partition kept (zero: none).
	Oldest time.Time
	// Ahead is the partitions kept whose range starts after now.
	Ahead int
}

// partitionMargin is how far past the longest expiry a new key can have
// (now + IDEMPOTENCY_TTL) partitions are made: a cleanup may miss a day or
// two (its worker down) without any insert lacking a partition.
const partitionMargin = 48 * time.Hour

// countBound: a partition's keys are counted up to this many before it is
// dropped (a few milliseconds); a larger one reports the planner's
// estimate, or the bound when the planner has none: counting them all
// would read the whole partition, the cost dropping it avoids.
const countBound = 100_000

// The statements of the partitions (sql/key_partitions.sql lists them;
// idempotency_key_partitions, migration 0012, makes them).
var keyPartitionsSQL = statement("key_partitions")

const makePartitionsSQL = `SELECT idempotency_key_partitions(now(), now() + CAST(? AS bigint) * interval '1 microsecond')`

// MakePartitions makes the missing day partitions from today through the
// day of now + ttl + partitionMargin, and returns how many it made. A
// partition is made empty and then attached, which takes no lock a start
// waits on.
func (s *KeyStore) MakePartitions(ctx context.Context, ttl time.Duration) (int, error) {
	var made int
	if err := s.db.WithContext(ctx).Raw(makePartitionsSQL, (ttl + partitionMargin).Microseconds()).Scan(&made).Error; err != nil {
		return 0, fmt.Errorf("make key partitions: %w", translate(err))
	}
	return made, nil
}

// Partitions lists the day partitions of the keys, oldest first.
func (s *KeyStore) Partitions(ctx context.Context) ([]KeyPartition, error) {
	rows, err := s.db.WithContext(ctx).Raw(keyPartitionsSQL).Rows()
	if err != nil {
		return nil, fmt.Errorf("list key partitions: %w", translate(err))
	}
	defer rows.Close()
	var out []KeyPartition
	for rows.Next() {
		var p KeyPartition
		if err := rows.Scan(&p.Name, &p.From, &p.To, &p.Attached, &p.Pending, &p.Expired, &p.Ahead, &p.Estimate); err != nil {
			return nil, fmt.Errorf("list key partitions: %w", translate(err))
		}
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list key partitions: %w", translate(err))
	}
	return out, nil
}

// Clean makes the partitions ahead (MakePartitions), then detaches and
// drops every partition whose whole range has expired: no key row is
// deleted, so nothing is written per key and nothing is left to vacuum.
// The detach is CONCURRENTLY: it takes SHARE UPDATE EXCLUSIVE on the
// parent, which no start's lock conflicts with, and waits for the
// transactions that may still see the partition; the drop then locks only
// the detached table, which no statement reads any more. A detach
// interrupted (a timeout, a crash) is finished by the next cleanup, and a
// partition another cleaner is dropping meanwhile is skipped.
func (s *KeyStore) Clean(ctx context.Context, ttl time.Duration) (KeyCleanup, error) {
	var c KeyCleanup
	var err error
	if c.Made, err = s.MakePartitions(ctx, ttl); err != nil {
		return c, err
	}
	parts, err := s.Partitions(ctx)
	if err != nil {
		return c, err
	}
	for _, p := range parts {
		if !p.Expired {
			if p.Attached && (c.Oldest.IsZero() || p.From.Before(c.Oldest)) {
				c.Oldest = p.From
			}
			if p.Attached && p.Ahead {
				c.Ahead++
			}
			continue
		}
		n, atLeast, err := s.dropPartition(ctx, p)
		if err != nil {
			return c, err
		}
		c.Dropped++
		c.Keys += n
		c.AtLeast = c.AtLeast || atLeast
	}
	return c, nil
}

// dropPartition detaches (if attached) and drops p, and returns its keys:
// counted up to countBound, past it the planner's estimate (atLeast when
// it has none, and the count stopped at the bound). A partition gone
// meanwhile (another cleaner dropped it) counts no key.
func (s *KeyStore) dropPartition(ctx context.Context, p KeyPartition) (n int64, atLeast bool, err error) {
	name := pgx.Identifier{p.Name}.Sanitize()
	db := s.db.WithContext(ctx)
	n = p.Estimate
	if n < countBound {
		var gone bool
		if n, gone, err = s.countKeys(ctx, p.Name, countBound); err != nil || gone {
			return 0, false, err
		}
		atLeast = n == countBound // the planner's estimate was below the bound, or none
	}
	detach := ""
	switch {
	case p.Pending:
		detach = `ALTER TABLE idempotency_keys DETACH PARTITION ` + name + ` FINALIZE`
	case p.Attached:
		detach = `ALTER TABLE idempotency_keys DETACH PARTITION ` + name + ` CONCURRENTLY`
	}
	if detach != "" {
		if err := db.Exec(detach).Error; err != nil {
			// Another cleaner detached it, or is detaching it (it then
			// drops it, or the next cleanup finishes its detach).
			var busy bool
			const attachedSQL = `SELECT NOT EXISTS (SELECT 1 FROM pg_inherits WHERE inhrelid = to_regclass(?) AND NOT inhdetachpending)`
			if db.Raw(attachedSQL, p.Name).Scan(&busy).Error == nil && busy {
				return 0, false, nil
			}
			return 0, false, fmt.Errorf("detach %s: %w", p.Name, translate(err))
		}
	}
	if err := db.Exec(`DROP TABLE IF EXISTS ` + name).Error; err != nil {
		return 0, false, fmt.Errorf("drop %s: %w", p.Name, translate(err))
	}
	return n, atLeast, nil
}

// CountExpired counts the keys a cleanup would drop now: those of the
// partitions whose whole range has expired (each counted exactly). A key
// that expired today goes with today's partition, once the day is over.
func (s *KeyStore) CountExpired(ctx context.Context) (int64, error) {
	parts, err := s.Partitions(ctx)
	if err != nil {
		return 0, err
	}
	var total int64
	for _, p := range parts {
		if !p.Expired {
			continue
		}
		n, _, err := s.countKeys(ctx, p.Name, math.MaxInt64)
		if err != nil {
			return 0, err
		}
		total += n
	}
	return total, nil
}

// countKeys counts the keys of partition name, up to limit; gone: another
// cleaner dropped it meanwhile (no key counted).
func (s *KeyStore) countKeys(ctx context.Context, name string, limit int64) (n int64, gone bool, err error) {
	err = s.db.WithContext(ctx).Raw(`SELECT count(*) FROM (SELECT FROM `+pgx.Identifier{name}.Sanitize()+` LIMIT ?) k`, limit).Scan(&n).Error
	switch {
	case isUndefinedTable(err):
		return 0, true, nil
	case err != nil:
		return 0, false, fmt.Errorf("count keys of %s: %w", name, translate(err))
	}
	return n, false, nil
}
