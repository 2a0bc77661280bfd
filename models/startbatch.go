package models

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"gorm.io/gorm"
)

// The start's fast path. A start is nearly always one statement in one
// round trip, in autocommit: it takes the key's lock, checks the key and
// the workflow, bills a usage slot, and writes the key row with its answer
// and the run, all or nothing. Concurrent starts share that statement: a
// few writers each send whatever starts are waiting, up to startBatchMax,
// as one statement over arrays (startBatchSQL). PostgreSQL's work per start
// then shrinks to its rows, without a statement, a round trip and a commit
// (one WAL flush) of its own; at low load a start goes alone, at once.
//
// The answer is rendered before the SQL: the run's id (UUIDv7, so new runs
// land at the right edge of the primary key) and creation time are made
// here. Whatever the statement cannot decide alone (an unknown workflow, a
// new month or quota to rebalance, the quota's edge, an error), it leaves
// to the transactional slow path (RunStore.Start on a RequestTx).

// NewRunID makes a run's id: a UUIDv7, time-ordered.
func NewRunID() string { return uuid.Must(uuid.NewV7()).String() }

// NewRunTime is a run's creation time as stored (microseconds, UTC).
func NewRunTime() time.Time { return time.Now().UTC().Truncate(time.Microsecond) }

// KeyWrite is the finished key row a keyed start writes with its run.
type KeyWrite struct {
	Endpoint, Key string
	LockID        int64
	RequestHash   []byte
	Method, Path  string
	Status        int
	Body          []byte
	// Headers is the JSON object of the stored headers.
	Headers                        []byte
	RequestID, ClientIP, UserAgent string
	TTL                            time.Duration
}

// OneResult is what the fast path did with one start; exactly one of Done,
// InFlight, Stored and Slow holds.
type OneResult struct {
	// Done: the run (and its key row) committed; Expires is when the key
	// expires, Replaced whether it took over an expired row.
	Done     bool
	Expires  time.Time
	Replaced bool
	// InFlight: another request holds the key.
	InFlight bool
	// Stored is the live key row that answers the request.
	Stored *StoredKey
	// Slow: nothing was written; take the transactional path.
	Slow bool
}

const (
	// startBatchMax is the most starts one statement carries.
	startBatchMax = 64
	// startWriters is how many statements of starts may be under way at
	// once: enough to keep PostgreSQL's two cores busy while one batch
	// travels, few enough that starts wait in batches, not in connections.
	startWriters = 4
	// expressWriters is how many more statements may be under way for the
	// starts of organisations that have none queued or being written,
	// while every writer is busy: each goes alone, at once, instead of
	// waiting behind a busy organisation's batches (issue 16: one
	// tenant's flood must not set another's start latency).
	expressWriters = 2
)

type startReq struct {
	p    StartParams
	k    *KeyWrite
	done chan struct{}
	res  OneResult
	err  error
}

// startBatcher sends waiting starts in batches. Writers exist only while
// there is work: a start that finds fewer than startWriters at work starts
// one, and a writer that finds nothing waiting ends. A start of an
// organisation with nothing in the batcher that finds every writer busy
// goes alone, by an express writer, when fewer than expressWriters are.
type startBatcher struct {
	db      *gorm.DB
	timeout time.Duration
	mu      sync.Mutex
	queue   []*startReq
	active  int
	express int
	// orgs counts each organisation's starts queued or being written.
	orgs map[string]int
}

func (b *startBatcher) submit(r *startReq) {
	b.mu.Lock()
	light := b.orgs[r.p.OrgID] == 0
	b.orgs[r.p.OrgID]++
	if light && b.active >= startWriters && b.express < expressWriters {
		b.express++
		b.mu.Unlock()
		go func() {
			b.send([]*startReq{r})
			b.mu.Lock()
			b.express--
			b.mu.Unlock()
		}()
		return
	}
	b.queue = append(b.queue, r)
	spawn := b.active < startWriters
	if spawn {
		b.active++
	}
	b.mu.Unlock()
	if spawn {
		go b.write()
	}
}

func (b *startBatcher) write() {
	for {
		b.mu.Lock()
		if len(b.queue) == 0 {
			b.active--
			b.mu.Unlock()
			return
		}
		// Two starts of one key never share a statement: the second waits
		// for the next one, where it finds the first's row (or its lock).
		batch := make([]*startReq, 0, min(len(b.queue), startBatchMax))
		locks := map[int64]bool{}
		rest := b.queue[:0]
		for _, r := range b.queue {
			dup := r.k != nil && locks[r.k.LockID]
			if dup || len(batch) == startBatchMax {
				rest = append(rest, r)
				continue
			}
			if r.k != nil {
				locks[r.k.LockID] = true
			}
			batch = append(batch, r)
		}
		clear(b.queue[len(rest):])
		b.queue = rest
		b.mu.Unlock()
		b.send(batch)
	}
}

// send runs one batch; when it fails for another reason than an
// unreachable database or an outcome it cannot know, each start not yet
// answered is tried alone, so one bad start (or a key another request
// finished meanwhile) fails alone.
func (b *startBatcher) send(batch []*startReq) {
	rest, err := b.exec(batch)
	if err != nil && len(rest) > 1 && !IsUnavailable(err) && !errors.Is(err, ErrOutcomeUnknown) {
		for _, r := range rest {
			for try := 1; ; try++ {
				left, err := b.exec([]*startReq{r})
				if len(left) == 0 {
					break // answered by its key's lock or row
				}
				if err == nil || !isDeadlock(err) || try == 5 {
					r.err = err
					b.answer([]*startReq{r})
					break
				}
			}
		}
		return
	}
	for _, r := range rest {
		if err != nil {
			r.err = err
		}
	}
	b.answer(rest)
}

// answer forgets the starts of a statement that has ended, then lets
// their requests go on: forgotten first, so that a client's next start,
// sent once it has its answer, is counted afresh.
func (b *startBatcher) answer(batch []*startReq) {
	if len(batch) == 0 {
		return
	}
	b.mu.Lock()
	for _, r := range batch {
		if b.orgs[r.p.OrgID]--; b.orgs[r.p.OrgID] <= 0 {
			delete(b.orgs, r.p.OrgID)
		}
	}
	b.mu.Unlock()
	for _, r := range batch {
		close(r.done)
	}
}

// exec runs a batch: with keyed starts, first their keys' locks
// (startLocksSQL), whose answers let the starts whose key is taken or
// answered go on at once (answered here), then the others (startBatchSQL),
// in one implicit transaction and one round trip (pipe). It returns the
// starts it did not answer, with the error that stopped them.
func (b *startBatcher) exec(batch []*startReq) (rest []*startReq, err error) {
	n := len(batch)
	var (
		ids, orgs, wfs, subs, metas, reqIDs      = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		created                                  = make([]time.Time, n)
		periods                                  = make([]time.Time, n)
		quotas, locks, ttls                      = make([]int64, n), make([]*int64, n), make([]int64, n)
		offs, statuses                           = make([]int32, n), make([]int32, n)
		tokens, keys, endpoints                  = make([]*string, n), make([]*string, n), make([]*string, n)
		methods, paths, headers, krids, ips, uas = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		hashes, bodies                           = make([][]byte, n), make([][]byte, n)
		keyed                                    bool
	)
	for i, r := range batch {
		p := r.p
		ids[i], orgs[i], wfs[i], subs[i], reqIDs[i] = p.ID, p.OrgID, p.WorkflowID, string(p.Submission), truncate(p.RequestID, 200)
		metas[i] = "{}"
		if len(p.Metadata) > 0 {
			metas[i] = string(p.Metadata)
		}
		created[i], periods[i], quotas[i], offs[i] = p.CreatedAt, UsagePeriod(p.CreatedAt), p.Quota, int32(slotOffset())
		tokens[i] = nullable(p.TokenID)
		if k := r.k; k != nil {
			keyed = true
			keys[i], endpoints[i], locks[i] = &k.Key, &k.Endpoint, &k.LockID
			hashes[i], methods[i], paths[i], statuses[i], bodies[i] = k.RequestHash, k.Method, truncate(k.Path, 2000), int32(k.Status), k.Body
			headers[i], krids[i], ips[i], uas[i] = string(k.Headers), truncate(k.RequestID, 200), truncate(k.ClientIP, 100), truncate(k.UserAgent, 1000)
			ttls[i] = k.TTL.Microseconds()
		} else {
			hashes[i], bodies[i], headers[i], methods[i], paths[i], krids[i] = []byte{}, []byte{}, "{}", "-", "-", "-"
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), b.timeout+txGrace)
	defer cancel()
	settings := []any{strconv.FormatInt(max(b.timeout.Milliseconds(), 1), 10), clientCheckMS}
	early := map[int]bool{} // the starts answered by their key's lock or row
	seen := 0
	sent := false
	err = withConn(ctx, b.db, func(c *pgx.Conn) error {
		// The answers have their own short deadline (DATABASE_ANSWER_TIMEOUT),
		// as a request transaction's first round trip does: a hung
		// database is a 503 in seconds.
		actx, cancel := stallBound(ctx, optionsOf(b.db).AnswerTimeout)
		defer cancel()
		q := startPipe(actx, c, !optionsOf(b.db).TransactionPooler)
		var err error
		if keyed {
			// The keys' locks first, flushed: a start whose key another
			// request holds, or whose key's row answers it, is answered
			// before this batch waits on anything (a lock, a full disk).
			err = q.query(startLocksSQL, append(settings, orgs, endpoints, keys, locks), func(rows pgx.Rows) error {
				var answered []*startReq
				for rows.Next() {
					var (
						i    *int64
						held *bool
						st   StoredKey
					)
					if err := scanKey(rows, &st, &i, &held); err != nil {
						return err
					}
					if i == nil {
						continue // the settings' row: no start answered yet
					}
					if *i < 1 || int(*i) > n {
						return fmt.Errorf("start batch: key %d of %d", *i, n)
					}
					r := batch[*i-1]
					switch {
					case st.Found() && !st.Expired:
						st.OrgID, st.Endpoint = r.p.OrgID, r.k.Endpoint
						r.res = OneResult{Stored: &st}
					case !*held:
						r.res = OneResult{InFlight: true}
					default:
						continue
					}
					early[int(*i)] = true
					answered = append(answered, r)
				}
				if err := rows.Err(); err != nil {
					return err
				}
				b.answer(answered)
				return nil
			}, true)
		} else {
			err = q.query(startSettingsSQL, settings, func(pgx.Rows) error { return nil }, false)
		}
		if err == nil && len(early) < n {
			err = q.query(startBatchSQL, []any{ids, created, orgs, wfs, subs, metas, quotas, tokens, reqIDs, keys, endpoints, locks,
				hashes, methods, paths, statuses, bodies, headers, krids, ips, uas, ttls, periods, offs}, func(rows pgx.Rows) error {
				for rows.Next() {
					var (
						i                          int64
						outcome                    string
						expires, created, lexpires *time.Time
						replaced                   *bool
						key, method, path, reqID   *string
						status                     *int
						st                         StoredKey
					)
					if err := rows.Scan(&i, &outcome, &expires, &replaced, &key, &st.RequestHash, &method,
						&path, &status, &st.ResponseBody, &st.ResponseHeaders, &st.ValidationRunID,
						&reqID, &created, &lexpires); err != nil {
						return err
					}
					if i < 1 || int(i) > n {
						return fmt.Errorf("start batch: row %d of %d", i, n)
					}
					seen++
					if early[int(i)] {
						continue
					}
					res := &batch[i-1].res
					switch outcome {
					case "done":
						res.Done = true
						if expires != nil {
							res.Expires = *expires
						}
						res.Replaced = replaced != nil && *replaced
					case "stored":
						st.OrgID, st.Endpoint = batch[i-1].p.OrgID, batch[i-1].k.Endpoint
						st.Key, st.RequestMethod, st.RequestPath, st.RequestID = *key, *method, *path, *reqID
						st.ResponseStatus, st.CreatedAt, st.ExpiresAt = *status, *created, *lexpires
						res.Stored = &st
					case "inflight":
						res.InFlight = true
					default:
						res.Slow = true
					}
				}
				return rows.Err()
			}, false)
		}
		err = q.sync(err)
		sent = q.sent
		return stalled(ctx, actx, err)
	})
	for i, r := range batch {
		if !early[i+1] {
			rest = append(rest, r)
		}
	}
	switch {
	case err != nil:
		for _, r := range rest {
			r.res = OneResult{}
		}
		if sent && inDoubt(err) {
			// The statement reached the server, and its answer did not
			// come back: it may have committed (ErrOutcomeUnknown).
			return rest, fmt.Errorf("start run: %w: %w", ErrOutcomeUnknown, err)
		}
		if errors.Is(err, ErrStalled) {
			return rest, fmt.Errorf("start run: %w", err)
		}
		return rest, fmt.Errorf("start run: %w", translate(err))
	case len(rest) > 0 && seen != n:
		return rest, fmt.Errorf("start run: %d answers for %d starts", seen, n)
	}
	return rest, nil
}

// startLocksSQL sets a batch's statement_timeout,
// client_connection_check_interval and plan_cache_mode (as
// startSettingsSQL does) and takes its keyed starts' locks, as
// the statement after it (startBatchSQL) would otherwise do: a start whose
// key has a live row is answered by it (that row is returned; a replay
// takes no lock, so replays never contend), and otherwise it tries the
// key's lock (pg_try_advisory_xact_lock, held to the implicit
// transaction's end); one taken elsewhere is returned as not held. Which
// starts hold their lock is left for startBatchSQL in the setting
// valruns.start_locks: one character per start of the batch, t when it
// goes on (a start without a key always does).
//
// This is a statement of its own, run and answered before the start's
// statement, because that one can wait (on a lock of validation_runs, on
// I/O): the first request to send a key takes its lock at once, and a
// duplicate of it learns so at once, never after the first has committed.
const startLocksSQL = `
WITH checked AS MATERIALIZED (
	SELECT t.i, f.key, f.request_hash, f.request_method, f.request_path, f.response_status, f.response_body,
		f.response_headers, f.validation_run_id, f.request_id, f.created_at, f.expires_at, NOT f.live AS expired,
		CASE WHEN t.key IS NULL THEN true
		     WHEN f.live THEN false
		     ELSE pg_try_advisory_xact_lock(t.lock) END AS locked
	FROM unnest(CAST($3 AS uuid[]), CAST($4 AS text[]), CAST($5 AS text[]), CAST($6 AS bigint[]))
		WITH ORDINALITY AS t(org, endpoint, key, lock, i)
	LEFT JOIN LATERAL (
		SELECT k.*, k.expires_at > now() AS live FROM idempotency_keys k
		WHERE k.org_id = t.org AND k.endpoint = t.endpoint AND k.key = t.key
		OFFSET 0) f ON true
), settings AS MATERIALIZED (
	SELECT set_config('statement_timeout', $1, true), set_config('client_connection_check_interval', $2, true),
		set_config('plan_cache_mode', 'force_generic_plan', true),
		set_config('valruns.start_locks', (SELECT string_agg(CASE WHEN locked THEN 't' ELSE 'f' END, '' ORDER BY i) FROM checked), true)
)
SELECT c.key, c.request_hash, c.request_method, c.request_path, c.response_status, c.response_body,
	c.response_headers, c.validation_run_id, c.request_id, c.created_at, c.expires_at, c.expired, c.i, c.locked
FROM settings
LEFT JOIN checked c ON c.key IS NOT NULL AND NOT c.expired OR NOT c.locked`

// startSettingsSQL sets a batch of starts without a key: its
// statement_timeout, its client_connection_check_interval, and a generic
// plan for startBatchSQL (as startLocksSQL does for keyed starts), all
// local to the batch's implicit transaction.
//
// The generic plan: PostgreSQL plans a prepared statement afresh at each
// execution (a custom plan) while it estimates a custom plan cheaper than
// the generic one, and for startBatchSQL it always does. Planning that
// statement took 0.56 ms at each execution, longer than executing it for
// a lone start (0.3 ms); its generic plan is made once per connection and
// costs 0.06 ms to reuse (EXPLAIN ANALYZE EXECUTE, twelve lone starts).
// Every plan it can take is index lookups per start, whatever the batch's
// size (TestStartBatchPlanIsGeneric).
const startSettingsSQL = `SELECT set_config('statement_timeout', $1, true), set_config('client_connection_check_interval', $2, true),
	set_config('plan_cache_mode', 'force_generic_plan', true)`

// txGrace lets a statement's statement_timeout fire before its context's
// deadline does (see idempotency.Config.TxTimeout).
const txGrace = 2 * time.Second

// startBatchSQL starts the runs of a batch: one element of each array per
// start. For each, in one snapshot:
//   - a keyed start whose key has a live row is answered by it (stored);
//     otherwise it tries the key's lock (pg_try_advisory_xact_lock, held
//     to the statement's end): taken elsewhere, it is in flight;
//   - a start whose workflow is not its organisation's goes slow;
//   - the starts of one organisation, period and quota bill one usage
//     slot that has room for all of them, held by no other transaction
//     (SKIP LOCKED); none: they go slow;
//   - the rest write their key row and run. The key row is a plain INSERT,
//     or an UPDATE of the expired row the lookup found (taking it over):
//     not INSERT ... ON CONFLICT, whose speculative insertion costs an
//     index probe and a WAL record more per key.
//
// A key row that another request committed after this snapshot (it held
// the lock until then) makes the INSERT fail (unique_violation on
// idempotency_keys_pkey), or the takeover find no expired row and write
// nothing (then idempotency_key_taken raises the same error): the
// statement writes nothing, and each start is tried alone.
const startBatchSQL = `
WITH input AS (
	SELECT * FROM unnest(CAST($1 AS uuid[]), CAST($2 AS timestamptz[]), CAST($3 AS uuid[]), CAST($4 AS uuid[]),
		CAST($5 AS text[]), CAST($6 AS text[]), CAST($7 AS bigint[]), CAST($8 AS uuid[]), CAST($9 AS text[]),
		CAST($10 AS text[]), CAST($11 AS text[]), CAST($12 AS bigint[]), CAST($13 AS bytea[]), CAST($14 AS text[]),
		CAST($15 AS text[]), CAST($16 AS integer[]), CAST($17 AS bytea[]), CAST($18 AS text[]), CAST($19 AS text[]),
		CAST($20 AS text[]), CAST($21 AS text[]), CAST($22 AS bigint[]), CAST($23 AS date[]), CAST($24 AS integer[]))
	WITH ORDINALITY AS t(id, created_at, org, wf, submission, metadata, quota, token, request_id, key, endpoint, lock,
		hash, method, path, status, body, headers, key_request_id, ip, ua, ttl, period, off, i)
), checked AS MATERIALIZED (
	SELECT t.*, CASE WHEN f.live THEN f.key END AS live_key, f.request_hash AS live_hash,
		f.request_method AS live_method, f.request_path AS live_path, f.response_status AS live_status,
		f.response_body AS live_body, f.response_headers AS live_headers, f.validation_run_id AS live_run,
		f.request_id AS live_request, f.created_at AS live_created, f.expires_at AS live_expires,
		coalesce(NOT f.live, false) AS stale,
		CASE WHEN t.key IS NULL THEN true
		     WHEN f.live THEN false
		     ELSE coalesce(substr(current_setting('valruns.start_locks', true), CAST(t.i AS integer), 1) = 't', false)
		END AS locked,
		EXISTS (SELECT 1 FROM workflows w WHERE w.id = t.wf AND w.org_id = t.org) AS wf_ok
	FROM input t
	LEFT JOIN LATERAL (
		SELECT k.*, k.expires_at > now() AS live FROM idempotency_keys k
		WHERE k.org_id = t.org AND k.endpoint = t.endpoint AND k.key = t.key
		OFFSET 0) f ON true
), going AS (
	SELECT * FROM checked WHERE locked AND live_key IS NULL AND wf_ok
), slots AS (
	SELECT g.org, g.period, g.quota, g.n, s.slot
	FROM (SELECT org, period, quota, count(*) AS n, min(off) AS off FROM going GROUP BY org, period, quota) g
	CROSS JOIN LATERAL (
		SELECT u.slot FROM usage_slots u
		WHERE u.org_id = g.org AND u.period = g.period AND u.quota = g.quota
		  AND (g.quota = 0 OR u.runs + g.n <= u.cap)
		ORDER BY (u.slot + g.off) % 64
		LIMIT 1 FOR UPDATE SKIP LOCKED) s
), bump AS (
	UPDATE usage_slots u SET runs = u.runs + s.n FROM slots s
	WHERE u.org_id = s.org AND u.period = s.period AND u.slot = s.slot
	RETURNING u.org_id, u.period, u.quota
), ran AS (
	SELECT g.* FROM going g JOIN bump b ON b.org_id = g.org AND b.period = g.period AND b.quota = g.quota
), fresh AS (` + keyInsert + `	SELECT org, endpoint, key, hash, method, path, status, body, CAST(headers AS jsonb), id, key_request_id,
		ip, ua, now(), now() + ttl * interval '1 microsecond'
	FROM ran WHERE key IS NOT NULL AND NOT stale
	RETURNING k.validation_run_id AS run, k.expires_at, false AS replaced
), retaken AS (
	UPDATE idempotency_keys k SET request_hash = r.hash, request_method = r.method, request_path = r.path,
		response_status = r.status, response_body = r.body, response_headers = CAST(r.headers AS jsonb),
		validation_run_id = r.id, request_id = r.key_request_id, client_ip = r.ip, user_agent = r.ua,
		created_at = now(), expires_at = now() + r.ttl * interval '1 microsecond'
	FROM ran r
	WHERE r.key IS NOT NULL AND r.stale
	  AND k.org_id = r.org AND k.endpoint = r.endpoint AND k.key = r.key AND k.expires_at <= now()
	RETURNING k.validation_run_id AS run, k.expires_at, true AS replaced
), keys AS (
	SELECT * FROM fresh UNION ALL SELECT * FROM retaken
), run AS (
	INSERT INTO validation_runs (id, org_id, workflow_id, status, submission, metadata, created_at,
		token_id, request_id, idempotency_key)
	SELECT id, org, wf, 'queued', CAST(submission AS json), CAST(metadata AS json), created_at,
		token, request_id, key
	FROM ran
	RETURNING id
)` + listRun + `
SELECT c.i,
	CASE WHEN c.live_key IS NOT NULL THEN 'stored'
	     WHEN NOT c.locked THEN 'inflight'
	     WHEN r.id IS NULL THEN 'slow'
	     WHEN c.key IS NOT NULL AND k.run IS NULL THEN CAST(idempotency_key_taken() AS text)
	     ELSE 'done' END,
	k.expires_at, k.replaced,
	c.live_key, c.live_hash, c.live_method, c.live_path, c.live_status, c.live_body, c.live_headers,
	c.live_run, c.live_request, c.live_created, c.live_expires
FROM checked c
LEFT JOIN ran r ON r.i = c.i
LEFT JOIN keys k ON k.run = r.id`

// StartOne starts a run by the fast path (see startBatchSQL), with its key
// row when k is set. It waits for its statement, whatever ctx does: the
// statement has its own deadline, and its outcome must be known to answer.
func (s *RunStore) StartOne(ctx context.Context, p StartParams, k *KeyWrite) (OneResult, error) {
	r := &startReq{p: p, k: k, done: make(chan struct{})}
	s.batcher.submit(r)
	<-r.done
	return r.res, r.err
}
