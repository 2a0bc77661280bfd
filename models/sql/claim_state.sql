-- claim_state.sql: why a claim took nothing (RunStore.Claim): the run's
-- status, attempts and lease, and whether the lease has run out.
--
-- Parameters (GORM):
--   ?1 run uuid
SELECT status, attempts, lease_expires_at,
	coalesce(lease_expires_at < now(), true) AS expired FROM validation_runs WHERE id = ?
