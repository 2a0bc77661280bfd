-- not_pending.sql: those of a set of run ids whose run is neither queued
-- nor running: final, or no run (RunStore.NotPending).
--
-- Parameters (GORM):
--   ?1 text: the run ids (UUIDs), comma-separated (one parameter whatever
--      their number; GORM would expand a slice into a list)
SELECT x FROM unnest(string_to_array(?, ',')) AS x
WHERE NOT EXISTS (SELECT 1 FROM validation_runs r
	WHERE r.id = CAST(x AS uuid) AND r.status IN ('queued', 'running'))
