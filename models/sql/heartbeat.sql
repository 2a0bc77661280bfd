-- heartbeat.sql: renews the lease of one execution of a running run
-- (RunStore.Heartbeat). Like every write of a delivery it is fenced by the
-- attempt's live lease: the run still running, by this attempt, its lease
-- not run out (clock_timestamp: the time of the write, not of the
-- transaction). No row changed: the attempt no longer holds the run.
--
-- Parameters (GORM):
--   ?1 bigint: the lease (microseconds)   ?2 run uuid   ?3 integer: the attempt
UPDATE validation_runs SET lease_expires_at = clock_timestamp() + ? * interval '1 microsecond'
WHERE id = ? AND status = 'running' AND attempts = ? AND lease_expires_at > clock_timestamp()
