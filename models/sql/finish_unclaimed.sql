-- finish_unclaimed.sql: ends queued runs with their outcomes, in one
-- statement (RunStore.FinishUnclaimed): the fast path of a run, written
-- once, from queued to final, without a claim. A run no longer queued is
-- left alone. In the same statement, as fail_attempt.sql: the runs leave
-- unfinished_runs, and their validation_run.finished events are recorded
-- for each subscribed endpoint.
--
-- Parameters (arrays, one element per run):
--   $1 id uuid   $2 status text   $3 findings text (a JSON array)
--   $4 error text (null: none)   $5 started_at timestamptz
-- Returns the runs it ended (endedRun).
WITH done AS (UPDATE validation_runs r SET status = v.status, findings = CAST(v.findings AS json), error = v.error,
	attempts = r.attempts + 1, started_at = v.started, finished_at = now()
FROM unnest(CAST($1 AS uuid[]), CAST($2 AS text[]), CAST($3 AS text[]), CAST($4 AS text[]), CAST($5 AS timestamptz[]))
	AS v(id, status, findings, error, started)
WHERE r.id = v.id AND r.status = 'queued'
RETURNING r.id, r.org_id, r.status, r.created_at, r.finished_at
), unlisted AS (
	DELETE FROM unfinished_runs u USING done d WHERE u.id = d.id
), finished_hooks AS (
	INSERT INTO webhook_deliveries (org_id, endpoint_id, run_id, event_id)
	SELECT d.org_id, e.id, d.id, 'evt_' || replace(d.id::text, '-', '')
	FROM done d JOIN webhook_endpoints e ON e.org_id = d.org_id AND e.events @> '["validation_run.finished"]'
	FOR KEY SHARE OF e
	ON CONFLICT DO NOTHING)
SELECT id, status, CAST(greatest(extract(epoch FROM finished_at - created_at), 0) AS float8) AS seconds FROM done
