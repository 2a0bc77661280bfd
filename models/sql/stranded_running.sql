-- stranded_running.sql: running runs whose lease ran out, oldest first
-- (RunStore.StrandedRunning), found through unfinished_runs (no index of
-- validation_runs holds its status). Takes no lock.
--
-- Parameters (GORM):
--   ?1 integer: the most runs
SELECT r.id, r.org_id, r.status, r.redeliveries, r.created_at
FROM unfinished_runs u JOIN validation_runs r ON r.id = u.id
WHERE r.status = 'running' AND coalesce(r.lease_expires_at < now(), true)
ORDER BY u.id
LIMIT ?
