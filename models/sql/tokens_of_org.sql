-- tokens_of_org.sql: an organisation's tokens, revoked ones included,
-- oldest first (TokenStore.List), as TokenInfo: never the token itself.
--
-- Parameters (GORM):
--   ?1 org uuid
SELECT t.id, t.org_id, o.slug AS org_slug, t.display, t.created_at, t.revoked_at
FROM api_tokens t JOIN organizations o ON o.id = t.org_id
WHERE t.org_id = ? ORDER BY t.created_at, t.id
