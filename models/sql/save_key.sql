-- save_key.sql: writes a finished key row (RequestTx.Commit), sent
-- with the request transaction's COMMIT. A row of the same scoped key is
-- replaced only if it has expired; a live one is left alone, and then the
-- statement fails with unique_violation (raised by idempotency_key_taken,
-- migration 0002), so that the COMMIT sent with it does not commit the
-- request's work. start_batch.sql writes the same columns.
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
	INSERT INTO idempotency_keys AS k (org_id, endpoint, key, request_hash, request_method, request_path,
		response_status, response_body, response_headers, validation_run_id, request_id, client_ip, user_agent,
		created_at, expires_at)
	VALUES ($1, $2, $3, $4, $5, $6, $7, $8, CAST($9 AS jsonb), CAST($10 AS uuid),
		$11, $12, $13, now(), now() + $14 * interval '1 microsecond')
	ON CONFLICT (org_id, endpoint, key) DO UPDATE SET
		request_hash = EXCLUDED.request_hash, request_method = EXCLUDED.request_method,
		request_path = EXCLUDED.request_path, response_status = EXCLUDED.response_status,
		response_body = EXCLUDED.response_body, response_headers = EXCLUDED.response_headers,
		validation_run_id = EXCLUDED.validation_run_id, request_id = EXCLUDED.request_id,
		client_ip = EXCLUDED.client_ip, user_agent = EXCLUDED.user_agent,
		created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at
	WHERE k.expires_at <= now()
	RETURNING expires_at
)
SELECT CASE WHEN EXISTS (SELECT 1 FROM saved) THEN (SELECT expires_at FROM saved) ELSE idempotency_key_taken() END
