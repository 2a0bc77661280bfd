-- save_key.sql: writes a finished key row (RequestTx.Commit), sent
-- with the request transaction's COMMIT, in the partition of its expiry.
-- An expired row of the same scoped key is left to its partition's drop
-- (migration 0012). A live one means another request finished the key
-- first: then nothing is written and the statement fails with
-- unique_violation (raised by idempotency_key_taken, migration 0004), so
-- that the COMMIT sent with it does not commit the request's work. The
-- look is exact: the request holds the key's lock (begin_keyed.sql), taken
-- before this statement's snapshot, and every writer of a key holds it.
-- start_batch.sql writes the same columns.
--
-- Parameters (saveKeyArgs builds them):
--   $1 org uuid          $2 endpoint text       $3 key text
--   $4 request_hash bytea                       $5 request_method text
--   $6 request_path text $7 response_status integer
--   $8 response_body bytea                      $9 response_headers text (JSON object)
--   $10 validation_run_id (text, null: none)    $11 request_id text
--   $12 client_ip text   $13 user_agent text    $14 ttl bigint (microseconds)
-- Returns the row's expires_at.
WITH saved AS (
	INSERT INTO idempotency_keys (org_id, endpoint, key, request_hash, request_method, request_path,
		response_status, response_body, response_headers, validation_run_id, request_id, client_ip, user_agent,
		created_at, expires_at)
	SELECT CAST($1 AS uuid), CAST($2 AS text), CAST($3 AS text), CAST($4 AS bytea), CAST($5 AS text),
		CAST($6 AS text), CAST($7 AS integer), CAST($8 AS bytea), CAST($9 AS jsonb), CAST($10 AS uuid),
		CAST($11 AS text), CAST($12 AS text), CAST($13 AS text), now(), now() + CAST($14 AS bigint) * interval '1 microsecond'
	WHERE NOT EXISTS (SELECT 1 FROM idempotency_keys k
		WHERE k.org_id = CAST($1 AS uuid) AND k.endpoint = CAST($2 AS text) AND k.key = CAST($3 AS text)
		  AND k.expires_at > now())
	RETURNING expires_at
)
SELECT CASE WHEN EXISTS (SELECT 1 FROM saved) THEN (SELECT expires_at FROM saved) ELSE idempotency_key_taken() END
