-- fail_run.sql: ends a run that no delivery holds (queued, or its lease run
-- out) with status error (RunStore.Fail); a run that is final, or that a
-- live delivery holds, is left alone. In the same statement, as
-- fail_attempt.sql: the run leaves unfinished_runs, and its
-- validation_run.finished event is recorded for each subscribed endpoint.
--
-- Parameters (GORM):
--   ?1 text: the reason   ?2 run uuid
-- Returns the run it ended (endedRun), or no row.
WITH done AS (UPDATE validation_runs SET status = 'error', error = ?,
	finished_at = now(), lease_expires_at = NULL
	WHERE id = ? AND (status = 'queued' OR (status = 'running' AND coalesce(lease_expires_at <= now(), true)))
	RETURNING id, org_id, status, created_at, finished_at
), unlisted AS (
	DELETE FROM unfinished_runs u USING done d WHERE u.id = d.id
), finished_hooks AS (
	INSERT INTO webhook_deliveries (org_id, endpoint_id, run_id, event_id)
	SELECT d.org_id, e.id, d.id, 'evt_' || replace(d.id::text, '-', '')
	FROM done d JOIN webhook_endpoints e ON e.org_id = d.org_id AND e.events @> '["validation_run.finished"]'
	FOR KEY SHARE OF e
	ON CONFLICT DO NOTHING)
SELECT id, status, CAST(greatest(extract(epoch FROM finished_at - created_at), 0) AS float8) AS seconds FROM done
