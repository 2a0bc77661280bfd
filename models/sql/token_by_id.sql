-- token_by_id.sql: the token of an id, revoked or not, as TokenInfo
-- (TokenStore.Find, RevokeRef).
--
-- Parameters (GORM):
--   ?1 token uuid   ?2 integer: the most rows (MaxTokenCandidates + 1)
SELECT t.id, t.org_id, o.slug AS org_slug, t.display, t.created_at, t.revoked_at
FROM api_tokens t JOIN organizations o ON o.id = t.org_id
WHERE t.id = ? ORDER BY t.created_at, t.id LIMIT ?
