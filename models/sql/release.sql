-- release.sql: gives up one execution's lease at once (RunStore.Release),
-- so the task's next delivery claims the run without waiting. Fenced by
-- the attempt's live lease, as heartbeat.sql is.
--
-- Parameters (GORM):
--   ?1 run uuid   ?2 integer: the attempt
UPDATE validation_runs SET lease_expires_at = clock_timestamp()
WHERE id = ? AND status = 'running' AND attempts = ? AND lease_expires_at > clock_timestamp()
