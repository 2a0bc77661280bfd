-- begin_keyed.sql: the first statement of a keyed request transaction
-- (BeginRequest): sets its statement_timeout and
-- client_connection_check_interval, reads the key's newest row (live if
-- any row is) and takes the
-- key's lock, unless a live row already answers the request (a replay takes
-- no lock, so a storm of replays of one key never contends on it).
--
-- Parameters:
--   $1 statement_timeout (ms, text)   $2 lock bigint (the key's advisory lock)
--   $3 org uuid   $4 endpoint text   $5 key text
--   $6 client_connection_check_interval (ms, text)
-- Returns one row: the key row's columns (null when there is none, as
-- scanKey reads them), expired, the two settings, and whether the lock is
-- held.
SELECT k.key, k.request_hash, k.request_method, k.request_path, k.response_status, k.response_body,
	k.response_headers, k.validation_run_id, k.request_id, k.created_at, k.expires_at,
	k.expires_at <= now() AS expired,
	set_config('statement_timeout', $1, true) AS timeout,
	set_config('client_connection_check_interval', $6, true) AS client_check,
	CASE WHEN k.key IS NOT NULL AND k.expires_at > now() THEN false ELSE pg_try_advisory_xact_lock($2) END AS locked
FROM (SELECT 1) AS one
LEFT JOIN LATERAL (
	SELECT * FROM idempotency_keys k
	WHERE k.org_id = $3 AND k.endpoint = $4 AND k.key = $5
	ORDER BY k.expires_at DESC LIMIT 1) k ON true
