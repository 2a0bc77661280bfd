package models_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/valruns/valruns/idempotency"
	"github.com/valruns/valruns/internal/testdb"
	"github.com/valruns/valruns/models"
)

// The keys are partitioned by day of expiry (migration 0012): a key's rows
// may live in several partitions, and one live row per key rests on the
// key's lock, not on an index. These tests hold a key's rows in two
// partitions.

// keyRef is the key of org as a request names it (no answer yet).
func keyRef(org, key string) *idempotency.Key {
	return &idempotency.Key{Tenant: org, Scope: "workflow_start", Key: key, LockID: idempotency.LockID(org, "workflow_start", key)}
}

// keyRows counts the rows of key, and its runs.
func keyRows(t *testing.T, db *gorm.DB, key string) (rows, runs int64) {
	t.Helper()
	require.NoError(t, db.Raw(`SELECT (SELECT count(*) FROM idempotency_keys WHERE key = ?),
		(SELECT count(*) FROM validation_runs WHERE idempotency_key = ?)`, key, key).Row().Scan(&rows, &runs))
	return rows, runs
}

// requireAnswered checks that k's live row, of run, answers a retry on
// every path: the fast path's probe, the start's statement (k, its write)
// and the request transaction.
func requireAnswered(t *testing.T, f *usageFixture, k *idempotency.Key, run string) {
	t.Helper()
	ctx := context.Background()
	got, err := models.NewKeyStore(f.db).Lookup(ctx, keyRef(f.org, k.Key))
	require.NoError(t, err)
	require.Equal(t, idempotency.KeyAnswered, got.Kind, "the fast path's probe")
	require.Equal(t, run, got.Key.ResourceID)

	res, err := f.runs.StartOne(ctx, f.params(f.org, f.wf, 0), k)
	require.NoError(t, err)
	require.Equal(t, idempotency.KeyAnswered, res.Kind, "the start's statement: %+v", res)
	require.Equal(t, run, res.Key.ResourceID)

	tx, res, err := models.BeginRequest(ctx, f.db, 10*time.Second, keyRef(f.org, k.Key))
	require.NoError(t, err)
	require.Nil(t, tx, "the request transaction")
	require.Equal(t, idempotency.KeyAnswered, res.Kind, "the request transaction")
	require.Equal(t, run, res.Key.ResourceID)
}

// partitionOf names the partition that holds key's newest row.
func partitionOf(t *testing.T, db *gorm.DB, key string) string {
	t.Helper()
	var p string
	require.NoError(t, db.Raw(`SELECT CAST(CAST(tableoid AS regclass) AS text) FROM idempotency_keys WHERE key = ?
		ORDER BY expires_at DESC LIMIT 1`, key).Scan(&p).Error)
	return p
}

// A retry whose key's row lives in the partition before the one a new row
// of its TTL lands in (the key was used the day before: its row expires
// today, a retry's would expire tomorrow) is answered by that row on every
// path (the fast path's probe, the start's statement, the request
// transaction), and never creates a second run. Fails with the lookups
// limited to the partitions a new key of the TTL lands in.
func TestRetryOfAKeyInThePreviousPartitionReplays(t *testing.T) {
	t.Parallel()
	f := newUsageFixture(t)
	k, first := startDayKey(t, f, "retry")

	// The row's expiry moves to the last second of today: still live, one
	// partition before the one of now + TTL.
	var live bool
	require.NoError(t, f.db.Raw(`UPDATE idempotency_keys
		SET created_at = now() - interval '20 hours',
		    expires_at = CAST(date_trunc('day', now() AT TIME ZONE 'UTC') + interval '1 day' AS timestamp) AT TIME ZONE 'UTC' - interval '1 second'
		WHERE key = 'retry' RETURNING expires_at > now() + interval '10 seconds'`).Scan(&live).Error)
	if !live {
		t.Skip("within seconds of midnight UTC: no live row can be in today's partition")
	}
	var next string
	require.NoError(t, f.db.Raw(`SELECT 'idempotency_keys_p' || to_char((now() + interval '1 day') AT TIME ZONE 'UTC', 'YYYYMMDD')`).Scan(&next).Error)
	require.NotEqual(t, next, partitionOf(t, f.db, "retry"), "the row is in another partition than a retry's")

	requireAnswered(t, f, k, first.ID)
	rows, runs := keyRows(t, f.db, "retry")
	require.EqualValues(t, 1, rows, "one key row")
	require.EqualValues(t, 1, runs, "one run")
}

// Concurrent first requests of one key, whose rows would land in two
// partitions (TTLs of one and two days: no index entry can collide), on
// both write paths (the start's statement and the request transaction):
// exactly one run and one key row per key. Fails with the key's lock taken
// away from start_locks.sql and begin_keyed.sql (each then writes its own
// row and run).
func TestConcurrentFirstRequestsAcrossPartitionsOneRun(t *testing.T) {
	t.Parallel()
	f := newUsageFixture(t)
	ctx := context.Background()
	require.NoError(t, f.startCommitted(t, 0, f.now)) // the period's slots
	const rounds, each = 25, 4
	var wg sync.WaitGroup
	errs := make(chan error, rounds*each)
	for r := range rounds {
		key := fmt.Sprintf("boundary-%d", r)
		ready := make(chan struct{})
		for i := range each {
			ttl := time.Duration(1+i%2) * 24 * time.Hour
			batch := i < each/2
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-ready
				if err := f.startKeyed(ctx, key, ttl, batch); err != nil {
					errs <- fmt.Errorf("%s (ttl %s, batch %t): %w", key, ttl, batch, err)
				}
			}()
		}
		close(ready)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	for r := range rounds {
		key := fmt.Sprintf("boundary-%d", r)
		rows, runs := keyRows(t, f.db, key)
		require.EqualValues(t, 1, runs, "%s: one run", key)
		require.EqualValues(t, 1, rows, "%s: one key row", key)
	}
}

// startKeyed is a first request of key with ttl, as the wrapper sends it:
// by the start's statement (batch) and, when that sends it on (NotDone),
// or directly, in a request transaction. An answer by the key's row or
// lock, or a commit refused because another request finished the key
// first, is not an error.
func (f *usageFixture) startKeyed(ctx context.Context, key string, ttl time.Duration, batch bool) error {
	k := keyWrite(f.org, key)
	k.TTL = ttl
	p := f.params(f.org, f.wf, 0)
	p.IdempotencyKey = key // the run names its key, as the handler's start does
	if batch {
		res, err := f.runs.StartOne(ctx, p, k)
		if err != nil || res.Kind != idempotency.NotDone {
			return err
		}
	}
	tx, _, err := models.BeginRequest(ctx, f.db, 10*time.Second, k)
	if err != nil || tx == nil {
		return err
	}
	if err := f.runs.Start(tx, p); err != nil {
		tx.Rollback()
		return err
	}
	k.ResourceID = p.ID
	if _, err := tx.Commit(ctx, k); err != nil && !errors.Is(err, idempotency.ErrKeyTaken) {
		return err
	}
	return nil
}

// An expired key whose row lives in an old partition does not answer: a
// new request with it creates one new run (its row in its own partition,
// the old one left to the cleanup), and from then on the new row, the
// key's newest, answers. Fails with the lookups' live check removed (the
// expired row replays), or with their newest-first order removed (the old
// row, in the older partition, is read first: a third run).
func TestExpiredKeyInAnOldPartitionDoesNotAnswer(t *testing.T) {
	t.Parallel()
	f := newUsageFixture(t)
	ctx := context.Background()
	k, _ := startDayKey(t, f, "old")
	require.NoError(t, f.db.Exec(`UPDATE idempotency_keys SET created_at = now() - interval '2 days',
		expires_at = now() - interval '1 day' WHERE key = 'old'`).Error)
	var yesterday string
	require.NoError(t, f.db.Raw(`SELECT 'idempotency_keys_p' || to_char((now() - interval '1 day') AT TIME ZONE 'UTC', 'YYYYMMDD')`).Scan(&yesterday).Error)
	require.Equal(t, yesterday, partitionOf(t, f.db, "old"))

	keys := models.NewKeyStore(f.db)
	got, err := keys.Lookup(ctx, keyRef(f.org, "old"))
	require.NoError(t, err)
	require.Equal(t, idempotency.NotDone, got.Kind, "the expired row does not answer")

	second := f.params(f.org, f.wf, 0)
	res, err := f.runs.StartOne(ctx, second, k)
	require.NoError(t, err)
	require.Equal(t, idempotency.Committed, res.Kind, "a new request: %+v", res)
	require.True(t, res.Replaced, "it reused an expired key")
	require.NotEqual(t, yesterday, partitionOf(t, f.db, "old"), "the new row is in its own partition")

	requireAnswered(t, f, k, second.ID) // the new row, the key's newest
	rows, runs := keyRows(t, f.db, "old")
	require.EqualValues(t, 2, rows, "the expired row and the new one")
	require.EqualValues(t, 2, runs, "the first run and the new one")
}

// The cleanup drops the partitions whose whole range has expired (with
// their keys), keeps every partition a live key is in (today's too, which
// also holds keys expired earlier today), and makes the partitions ahead
// through now + TTL and the margin. Fails with a partition dropped once it
// starts in the past (today's goes, with its live key), or with the
// partitions not made ahead.
func TestCleanDropsExpiredPartitionsAndMakesThoseAhead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _ := testdb.New(t)
	org, _ := acmeWorkflow(t, db)
	insert := func(key, expires string) {
		t.Helper()
		require.NoError(t, db.Exec(`INSERT INTO idempotency_keys (org_id, endpoint, key, request_hash, request_method,
			request_path, response_status, response_body, request_id, created_at, expires_at)
			VALUES (?, 'workflow_start', ?, sha256('x'::bytea), 'POST', '/p', 201, '\x7b7d', 'req',
			now() + CAST(? AS interval) - interval '1 day', now() + CAST(? AS interval))`, org, key, expires, expires).Error)
	}
	insert("gone-1", "-1 day")
	insert("gone-2", "-2 days")
	insert("live", "1 minute")
	insert("later", "47 hours")
	// The empty partitions past tomorrow go: the cleanup must make them.
	var ahead []string
	require.NoError(t, db.Raw(`SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = CAST('idempotency_keys' AS regclass) AND c.relname > 'idempotency_keys_p' || to_char(now() AT TIME ZONE 'UTC' + interval '2 days', 'YYYYMMDD')`).Scan(&ahead).Error)
	require.NotEmpty(t, ahead)
	for _, p := range ahead {
		require.NoError(t, db.Exec(`DROP TABLE `+p).Error)
	}

	keys := models.NewKeyStore(db)
	n, err := keys.CountExpired(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2, n, "a dry run counts the keys of the expired partitions")
	const ttl = 24 * time.Hour
	c, err := keys.Clean(ctx, ttl)
	require.NoError(t, err)
	require.EqualValues(t, 2, c.Keys)
	require.GreaterOrEqual(t, c.Dropped, 2)
	require.Positive(t, c.Made, "it made partitions ahead")
	var left []string
	require.NoError(t, db.Raw(`SELECT key FROM idempotency_keys ORDER BY key`).Scan(&left).Error)
	require.Equal(t, []string{"later", "live"}, left, "exactly the keys of the expired partitions went")

	parts, err := keys.Partitions(ctx)
	require.NoError(t, err)
	var dbNow time.Time
	require.NoError(t, db.Raw(`SELECT now()`).Scan(&dbNow).Error)
	require.NotEmpty(t, parts)
	aheadKept := 0
	for _, p := range parts {
		require.True(t, p.Attached, "%s", p.Name)
		require.False(t, p.Expired, "%s: an expired partition kept", p.Name)
		if p.Ahead {
			aheadKept++
		}
	}
	require.True(t, dbNow.UTC().Truncate(24*time.Hour).Equal(parts[0].From), "the oldest kept is today's: %s", parts[0].From)
	require.True(t, parts[0].From.Equal(c.Oldest), "%s, %s", parts[0].From, c.Oldest)
	require.Equal(t, aheadKept, c.Ahead)
	require.False(t, parts[len(parts)-1].To.Before(dbNow.Add(ttl+48*time.Hour)), "made through now + TTL + the margin")

	c, err = keys.Clean(ctx, ttl)
	require.NoError(t, err)
	require.Equal(t, models.KeyCleanup{Oldest: c.Oldest, Ahead: c.Ahead}, c, "nothing more to drop or make")
}

// The cleanup does not read a large partition whole to count its keys: past
// 100,000 it reports the planner's estimate, or at least 100,000 when the
// planner has none (a partition never analysed). Fails with the count's
// bound removed (it counts them all).
func TestCleanCountsALargePartitionAtLeast(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _ := testdb.New(t)
	org, _ := acmeWorkflow(t, db)
	require.NoError(t, db.Exec(`INSERT INTO idempotency_keys (org_id, endpoint, key, request_hash, request_method,
		request_path, response_status, response_body, request_id, created_at, expires_at)
		SELECT ?, 'workflow_start', 'k' || g, sha256('x'::bytea), 'POST', '/p', 201, '\x7b7d', 'req',
		now() - interval '2 days', now() - interval '1 day' FROM generate_series(1, 100001) g`, org).Error)
	c, err := models.NewKeyStore(db).Clean(ctx, 24*time.Hour)
	require.NoError(t, err)
	require.EqualValues(t, 100_000, c.Keys)
	require.True(t, c.AtLeast, "a partition counted to the bound reports at least its keys")
	require.Zero(t, countKeys(t, db), "its keys went with it")
}

func countKeys(t *testing.T, db *gorm.DB) (n int64) {
	t.Helper()
	require.NoError(t, db.Raw(`SELECT count(*) FROM idempotency_keys`).Scan(&n).Error)
	return n
}

// startDayKey starts a run with key (a day's TTL) on f, committed, after the
// period's slots; it returns the key and the start's parameters.
func startDayKey(t *testing.T, f *usageFixture, key string) (*idempotency.Key, models.StartParams) {
	t.Helper()
	require.NoError(t, f.startCommitted(t, 0, f.now)) // the period's slots
	k := keyWrite(f.org, key)
	k.TTL = 24 * time.Hour
	first := f.params(f.org, f.wf, 0)
	res, err := f.runs.StartOne(context.Background(), first, k)
	require.NoError(t, err)
	require.Equal(t, idempotency.Committed, res.Kind)
	return k, first
}
