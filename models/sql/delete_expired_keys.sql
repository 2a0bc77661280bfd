-- delete_expired_keys.sql: deletes a batch of keys past expires_at
-- (KeyStore.DeleteExpiredBatch), found by the expires_at index and deleted
-- by the rows' places (ctid: a key has no id). SKIP LOCKED: rows a request
-- is overwriting, or another cleaner deleting, are left for the next batch.
--
-- Parameters (GORM):
--   ?1 integer: the most keys to delete
DELETE FROM idempotency_keys WHERE ctid = ANY (ARRAY(
	SELECT ctid FROM idempotency_keys WHERE expires_at <= now()
	ORDER BY expires_at LIMIT ? FOR UPDATE SKIP LOCKED))
