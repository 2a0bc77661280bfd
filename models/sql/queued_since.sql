-- queued_since.sql: a page of the runs listed as unfinished, in id order
-- after a cursor (RunStore.QueuedSince), each with whether it is queued and
-- was created long enough ago to be due. A listed run that is final, or
-- gone, leaves the list in the same statement.
--
-- Parameters (GORM, named):
--   @from uuid: the cursor, the last id of the page before (the nil UUID,
--      below every UUIDv7, for the first page)
--   @limit integer: the page's size
--   @after bigint: how long ago a queued run must have been created to be
--      due (microseconds)
WITH page AS (
	SELECT u.id, r.org_id, r.status, r.redeliveries, r.created_at
	FROM unfinished_runs u LEFT JOIN validation_runs r ON r.id = u.id
	WHERE u.id > CAST(@from AS uuid)
	ORDER BY u.id
	LIMIT @limit
), unlisted AS (
	DELETE FROM unfinished_runs u USING page p
	WHERE u.id = p.id AND coalesce(p.status NOT IN ('queued', 'running'), true)
)
SELECT id, coalesce(org_id::text, '') AS org_id, coalesce(status, '') AS status, coalesce(redeliveries, 0) AS redeliveries,
	coalesce(created_at, now()) AS created_at,
	coalesce(status = 'queued' AND created_at < now() - @after * interval '1 microsecond', false) AS due
FROM page ORDER BY id
