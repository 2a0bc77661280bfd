-- read_backlog.sql: the backlog (RunStore.ReadBacklog): how many runs are
-- listed as unfinished, and the age in seconds of the oldest of them still
-- queued or running (its smallest id: UUIDv7), 0 when none.
--
-- Parameters: none.
SELECT (SELECT count(*) FROM unfinished_runs) AS unfinished,
	coalesce((SELECT greatest(extract(epoch FROM now() - r.created_at), 0)
		FROM unfinished_runs u JOIN validation_runs r ON r.id = u.id
		WHERE r.status IN ('queued', 'running')
		ORDER BY u.id LIMIT 1), 0) AS seconds
