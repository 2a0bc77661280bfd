-- start_locks.sql: the keys of a batch of starts (models.batchWrite.send),
-- sent after start_settings.sql when the batch has keyed starts (so it is
-- planned generically too: startSettingsSQL says why). A start whose key
-- has a live row is answered by it (that row is returned; a replay takes
-- no lock, so replays never contend);
-- otherwise it tries the key's lock (pg_try_advisory_xact_lock, held to
-- the implicit transaction's end), and one taken elsewhere is returned as
-- not held. Which starts hold their lock is left for start_batch.sql in the
-- setting valruns.start_locks: one character per start of the batch, t
-- when it goes on (a start without a key always does).
--
-- It is a statement of its own, run and answered before the start's
-- statement, because that one can wait (on a lock of validation_runs, on
-- I/O): the first request to send a key takes its lock at once, and a
-- duplicate of it learns so at once, never after the first has committed.
--
-- Parameters:
--   $1 org uuid[]   $2 endpoint text[]   $3 key text[]   $4 lock bigint[]
--      (one element per start of the batch; key, endpoint and lock null
--      for a start without a key)
-- Returns one row with i null (the setting), and one per start answered
-- now: the live key row (not expired), or a lock taken elsewhere (locked
-- false).
WITH checked AS MATERIALIZED (
	SELECT t.i, f.key, f.request_hash, f.request_method, f.request_path, f.response_status, f.response_body,
		f.response_headers, f.validation_run_id, f.request_id, f.created_at, f.expires_at, NOT f.live AS expired,
		CASE WHEN t.key IS NULL THEN true
		     WHEN f.live THEN false
		     ELSE pg_try_advisory_xact_lock(t.lock) END AS locked
	FROM unnest(CAST($1 AS uuid[]), CAST($2 AS text[]), CAST($3 AS text[]), CAST($4 AS bigint[]))
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
LEFT JOIN checked c ON c.key IS NOT NULL AND NOT c.expired OR NOT c.locked
