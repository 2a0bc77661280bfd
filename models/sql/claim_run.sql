-- claim_run.sql: a delivery's claim of a run (RunStore.Claim): a queued
-- run, or a running one whose lease has run out, becomes running with
-- attempts + 1 and a new lease, unless it has been started the most times
-- already. No row: the run cannot be taken (claim_state.sql says why).
--
-- Parameters (GORM):
--   ?1 bigint: the lease (microseconds)   ?2 run uuid
--   ?3 integer: the most attempts
-- Returns the run's row and its workflow's schema and assertions.
UPDATE validation_runs r SET status = 'running', attempts = r.attempts + 1,
	started_at = coalesce(r.started_at, now()), lease_expires_at = now() + ? * interval '1 microsecond'
FROM workflows w
WHERE r.id = ? AND w.id = r.workflow_id AND r.attempts < ?
  AND (r.status = 'queued' OR (r.status = 'running' AND coalesce(r.lease_expires_at < now(), true)))
RETURNING r.*, w.schema, w.assertions
