-- tokens_by_display.sql: the tokens whose display (their first characters)
-- starts with a prefix, revoked ones included, oldest first, as TokenInfo
-- (TokenStore.Find). starts_with, not LIKE: the _ of vr_ is a LIKE
-- wildcard.
--
-- Parameters (GORM):
--   ?1 text: the prefix   ?2 integer: the most rows (MaxTokenCandidates + 1)
SELECT t.id, t.org_id, o.slug AS org_slug, t.display, t.created_at, t.revoked_at
FROM api_tokens t JOIN organizations o ON o.id = t.org_id
WHERE starts_with(t.display, ?) ORDER BY t.created_at, t.id LIMIT ?
