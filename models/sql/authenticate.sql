-- authenticate.sql: the organisation and token of a bearer token that is
-- not revoked (TokenStore.Authenticate). No row: no such token.
--
-- Parameters (GORM):
--   ?1 bytea: the token's hash (HashToken)
SELECT o.id AS org_id, o.slug AS org_slug, t.id AS token_id, o.monthly_run_quota, o.start_rate, o.run_share
FROM api_tokens t JOIN organizations o ON o.id = t.org_id
WHERE t.token_hash = ? AND t.revoked_at IS NULL
