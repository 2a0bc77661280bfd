-- valruns' new-key start as models/startbatch.go sends a batch of one:
-- start_settings.sql, start_locks.sql and start_batch.sql (models/sql), in
-- one pipeline: one implicit transaction. The statements' text is the
-- server's; each parameter (an array of one element) is written out. The
-- harness runs it with pgbench -M prepared -D org=UUID -D wf=UUID
-- -D token=UUID -D quota=N (the bench organisation, its workflow, its token
-- and the quota its usage slots of this month are balanced for). Fresh in
-- each transaction: the key and its advisory lock, the run's id (time
-- ordered, as a UUIDv7), the request id, the usage slot's offset. The
-- answer stored with the key is a constant of its size. A colon before a
-- letter is a pgbench variable: the texts have none.
\set key random(1, 9223372036854775806)
\set run random(1, 9223372036854775806)
\set req random(1, 9223372036854775806)
\set off random(0, 63)
\startpipeline
SELECT set_config('statement_timeout', '30000', true), set_config('client_connection_check_interval', '1000', true),
	set_config('plan_cache_mode', 'force_generic_plan', true);
WITH checked AS MATERIALIZED (
	SELECT t.i, f.key, f.request_hash, f.request_method, f.request_path, f.response_status, f.response_body,
		f.response_headers, f.validation_run_id, f.request_id, f.created_at, f.expires_at, NOT f.live AS expired,
		CASE WHEN t.key IS NULL THEN true
		     WHEN f.live THEN false
		     ELSE pg_try_advisory_xact_lock(t.lock) END AS locked
	FROM unnest(CAST(ARRAY[:org] AS uuid[]), CAST(ARRAY['workflow_start'] AS text[]),
		CAST(ARRAY['bench-' || :key] AS text[]), CAST(ARRAY[:key] AS bigint[]))
		WITH ORDINALITY AS t(org, endpoint, key, lock, i)
	LEFT JOIN LATERAL (
		SELECT k.*, k.expires_at > now() AS live FROM idempotency_keys k
		WHERE k.org_id = t.org AND k.endpoint = t.endpoint AND k.key = t.key
		ORDER BY k.expires_at DESC LIMIT 1) f ON true
), settings AS MATERIALIZED (
	SELECT set_config('valruns.start_locks', (SELECT string_agg(CASE WHEN locked THEN 't' ELSE 'f' END, '' ORDER BY i) FROM checked), true)
)
SELECT c.key, c.request_hash, c.request_method, c.request_path, c.response_status, c.response_body,
	c.response_headers, c.validation_run_id, c.request_id, c.created_at, c.expires_at, c.expired, c.i, c.locked
FROM settings
LEFT JOIN checked c ON c.key IS NOT NULL AND NOT c.expired OR NOT c.locked;
WITH input AS (
	SELECT * FROM unnest(
		CAST(ARRAY[lpad(to_hex(CAST(extract(epoch FROM clock_timestamp()) * 1000 AS bigint)), 12, '0')
			|| '7' || substr(md5(CAST(:run AS text)), 1, 19)] AS uuid[]),                      -- $1 run id
		CAST(ARRAY[now()] AS timestamptz[]),                                                 -- $2 created_at
		CAST(ARRAY[:org] AS uuid[]),                                                         -- $3
		CAST(ARRAY[:wf] AS uuid[]),                                                          -- $4
		CAST(ARRAY['{"customer":"ACME","total":42,"lines":[{"sku":"A-1","qty":2},{"sku":"B-7","qty":1}]}'] AS text[]),
		CAST(ARRAY['{"source":"bench"}'] AS text[]),                                         -- $6 metadata
		CAST(ARRAY[:quota] AS bigint[]),                                                     -- $7
		CAST(ARRAY[:token] AS uuid[]),                                                       -- $8
		CAST(ARRAY['bench-' || :req] AS text[]),                                             -- $9 request_id
		CAST(ARRAY['bench-' || :key] AS text[]),                                             -- $10 key
		CAST(ARRAY['workflow_start'] AS text[]),                                             -- $11 endpoint
		CAST(ARRAY[:key] AS bigint[]),                                                       -- $12 lock of the key
		CAST(ARRAY[decode('3d3855ce84e9a7381ac1d605e3492abaf88f22e9a1bc706580320ed8ec0aea97', 'hex')] AS bytea[]),
		CAST(ARRAY['POST'] AS text[]),                                                       -- $14
		CAST(ARRAY['/api/workflows/' || :wf || '/start'] AS text[]),                         -- $15
		CAST(ARRAY[201] AS integer[]),                                                       -- $16
		CAST(ARRAY[convert_to('{"id":"01a224a7-b932-7eaa-8b1c-35b2e42dd86d","workflow_id":"cf98ccde-6844-4b50-b988-6b39e94d3872",'
			|| '"status":"queued","submission":{"customer":"ACME","total":42,"lines":[{"sku":"A-1","qty":2},{"sku":"B-7","qty":1}]},'
			|| '"metadata":{"source":"bench"},"attempts":0,"created_at":"2026-11-29T00:15:01.426961Z"}', 'UTF8')] AS bytea[]),
		CAST(ARRAY['{"Content-Type":"application/json; charset=utf-8","Location":"/api/runs/01a224a7-b932-7eaa-8b1c-35b2e42dd86d/"}'] AS text[]),
		CAST(ARRAY['bench-' || :req] AS text[]),                                             -- $19
		CAST(ARRAY['127.0.0.1'] AS text[]),                                                  -- $20
		CAST(ARRAY['Go-http-client/1.1'] AS text[]),                                         -- $21
		CAST(ARRAY[86400000000] AS bigint[]),                                                -- $22 ttl, 24 h
		CAST(ARRAY[date_trunc('month', now() AT TIME ZONE 'UTC')] AS date[]),                -- $23 period
		CAST(ARRAY[:off] AS integer[]))                                                      -- $24
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
		ORDER BY (u.slot + g.off) % 64
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
LEFT JOIN fresh k ON k.run = r.id;
\endpipeline
