-- lookup_key.sql: the fast path's probe of a key (KeyStore.Lookup), outside
-- any transaction: the key's newest row (live if any row is: an older row
-- expired before it; docs/design.md), whether it has expired, and, when there
-- is no live row, whether another session holds the key's advisory lock
-- (pg_locks; the lock itself is never touched, so the probe is only a
-- hint: the lock decides who executes).
--
-- Parameters:
--   $1 bigint: the lock number's high 32 bits (pg_locks.classid)
--   $2 bigint: its low 32 bits (pg_locks.objid)
--   $3 org uuid   $4 endpoint text   $5 key text
-- Returns one row: the key row's columns (null when there is none, as
-- scanKey reads them), expired, and in_flight.
SELECT k.key, k.request_hash, k.request_method, k.request_path, k.response_status, k.response_body,
	k.response_headers, k.validation_run_id, k.request_id, k.created_at, k.expires_at,
	k.expires_at <= now() AS expired,
	CASE WHEN k.key IS NULL OR k.expires_at <= now() THEN EXISTS (
		SELECT 1 FROM pg_locks l
		WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
		  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
		  AND l.classid = CAST(CAST($1 AS bigint) AS oid) AND l.objid = CAST(CAST($2 AS bigint) AS oid))
	ELSE false END AS in_flight
FROM (SELECT 1) AS one
LEFT JOIN LATERAL (
	SELECT * FROM idempotency_keys k
	WHERE k.org_id = $3 AND k.endpoint = $4 AND k.key = $5
	ORDER BY k.expires_at DESC LIMIT 1) k ON true
