-- start_batch.sql: the runs of a batch of starts (models.batchWrite.send),
-- after start_locks.sql (keyed starts) or startSettingsSQL, in the same
-- implicit transaction. One element of each array per start, in order;
-- the answer has one row per start, numbered by i (1-based).
--
-- For each start, in one snapshot:
--   - a keyed start whose key has a live row is answered by it (stored);
--     one whose lock start_locks.sql did not get (the setting
--     valruns.start_locks: one character per start, t when it goes on)
--     is in flight;
--   - a start whose workflow is not its organisation's goes slow;
--   - the starts of one organisation, period and quota bill one usage
--     slot that has room for all of them, held by no other transaction
--     (SKIP LOCKED); none: they go slow;
--   - the rest write their key row and run (and list the run as
--     unfinished). The key row is a plain INSERT, in the partition of its
--     expiry; an expired row of the key is left to its partition's drop
--     (migration 0012), never taken over.
-- One live row per key: a keyed start goes on only with its key's lock,
-- which start_locks.sql took in an earlier statement of this transaction,
-- so this statement's snapshot holds every row another holder of the lock
-- committed (a commit is visible before its locks are released), and no
-- other writer can commit the key until this transaction ends. The key's
-- newest row is read (an older one expired before it); a live one answers.
--
-- Parameters (arrays, one element per start; startColumns builds them):
--   $1 id uuid             $2 created_at timestamptz   $3 org uuid
--   $4 workflow uuid       $5 submission text (JSON)  $6 metadata text (JSON object)
--   $7 quota bigint (0: none)                          $8 token uuid (null: none)
--   $9 request_id text     $10 key text (null: no key) $11 endpoint text (null: no key)
--   $12 lock bigint (the key's advisory lock; null: no key)
--   $13 request_hash bytea $14 method text            $15 path text
--   $16 status integer     $17 body bytea             $18 headers text (JSON object)
--   $19 the key row's request_id text                 $20 client_ip text
--   $21 user_agent text    $22 ttl bigint (microseconds)
--   $23 period date (the usage period)                 $24 off integer (slot offset)
-- and one value:
--   $25 integer: the usage slots per organisation and period (UsageSlots)
-- Returns per start: i, the outcome (done, stored, inflight, slow), the new
-- key row's expires_at and whether the key had an expired row, and for
-- stored the live key row's columns.
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
		ORDER BY k.expires_at DESC LIMIT 1) f ON true
), going AS (
	SELECT * FROM checked WHERE locked AND live_key IS NULL AND wf_ok
), slots AS (
	SELECT g.org, g.period, g.quota, g.n, s.slot
	FROM (SELECT org, period, quota, count(*) AS n, min(off) AS off FROM going GROUP BY org, period, quota) g
	CROSS JOIN LATERAL (
		SELECT u.slot FROM usage_slots u
		WHERE u.org_id = g.org AND u.period = g.period AND u.quota = g.quota
		  AND (g.quota = 0 OR u.runs + g.n <= u.cap)
		ORDER BY (u.slot + g.off) % $25
		LIMIT 1 FOR UPDATE SKIP LOCKED) s
), bump AS (
	UPDATE usage_slots u SET runs = u.runs + s.n FROM slots s
	WHERE u.org_id = s.org AND u.period = s.period AND u.slot = s.slot
	RETURNING u.org_id, u.period, u.quota
), ran AS (
	SELECT g.* FROM going g JOIN bump b ON b.org_id = g.org AND b.period = g.period AND b.quota = g.quota
), fresh AS (
	INSERT INTO idempotency_keys AS k (org_id, endpoint, key, request_hash, request_method, request_path,
		response_status, response_body, response_headers, validation_run_id, request_id, client_ip, user_agent,
		created_at, expires_at)
	SELECT org, endpoint, key, hash, method, path, status, body, CAST(headers AS jsonb), id, key_request_id,
		ip, ua, now(), now() + ttl * interval '1 microsecond'
	FROM ran WHERE key IS NOT NULL
	RETURNING k.validation_run_id AS run, k.expires_at
), run AS (
	INSERT INTO validation_runs (id, org_id, workflow_id, status, submission, metadata, created_at,
		token_id, request_id, idempotency_key)
	SELECT id, org, wf, 'queued', CAST(submission AS json), CAST(metadata AS json), created_at,
		token, request_id, key
	FROM ran
	RETURNING id
), listed AS (
	INSERT INTO unfinished_runs (id) SELECT id FROM run
)
SELECT c.i,
	CASE WHEN c.live_key IS NOT NULL THEN 'stored'
	     WHEN NOT c.locked THEN 'inflight'
	     WHEN r.id IS NULL THEN 'slow'
	     WHEN c.key IS NOT NULL AND k.run IS NULL THEN CAST(idempotency_key_taken() AS text)
	     ELSE 'done' END,
	k.expires_at, c.stale,
	c.live_key, c.live_hash, c.live_method, c.live_path, c.live_status, c.live_body, c.live_headers,
	c.live_run, c.live_request, c.live_created, c.live_expires
FROM checked c
LEFT JOIN ran r ON r.i = c.i
LEFT JOIN fresh k ON k.run = r.id
