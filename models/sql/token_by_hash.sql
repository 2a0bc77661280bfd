-- token_by_hash.sql: the token itself, named by its hash, revoked or not,
-- as TokenInfo (TokenStore.Find).
--
-- Parameters (GORM):
--   ?1 bytea: the token's hash (HashToken)
--   ?2 integer: the most rows (MaxTokenCandidates + 1)
SELECT t.id, t.org_id, o.slug AS org_slug, t.display, t.created_at, t.revoked_at
FROM api_tokens t JOIN organizations o ON o.id = t.org_id
WHERE t.token_hash = ? ORDER BY t.created_at, t.id LIMIT ?
