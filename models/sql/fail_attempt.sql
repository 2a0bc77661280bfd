-- fail_attempt.sql: ends one execution of a run with status error
-- (RunStore.FailAttempt), fenced by the attempt's live lease (as
-- heartbeat.sql is). As every statement that ends runs, in the same
-- statement: the run leaves unfinished_runs, and a delivery of its
-- validation_run.finished event is recorded for each endpoint of its
-- organisation that subscribes to it (the outbox; ON CONFLICT keeps an
-- event once). The endpoints are read FOR KEY SHARE, so one deleted
-- meanwhile never fails the statement on the deliveries' foreign key: the
-- read waits for the delete's commit and leaves the endpoint out, or,
-- read first, makes the delete wait for this commit (and remove the
-- delivery with the endpoint).
--
-- Parameters (GORM):
--   ?1 text: the reason   ?2 run uuid   ?3 integer: the attempt
-- Returns the run it ended (endedRun: id, status, seconds from start to
-- final), or no row.
WITH done AS (UPDATE validation_runs SET status = 'error', error = ?,
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
