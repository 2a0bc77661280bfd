-- finish_run.sql: ends one execution of a run with its status (passed or
-- failed) and findings (RunStore.Finish), fenced by the attempt's live
-- lease (as heartbeat.sql is), so findings are written once. In the same
-- statement, as fail_attempt.sql: the run leaves unfinished_runs, and its
-- validation_run.finished event is recorded for each subscribed endpoint.
--
-- Parameters (GORM):
--   ?1 status text   ?2 findings text (a JSON array)   ?3 run uuid
--   ?4 integer: the attempt
-- Returns the run it ended (endedRun), or no row.
WITH done AS (UPDATE validation_runs SET status = ?, findings = CAST(? AS json),
	finished_at = now(), lease_expires_at = NULL
	WHERE id = ? AND status = 'running' AND attempts = ? AND lease_expires_at > clock_timestamp()
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
