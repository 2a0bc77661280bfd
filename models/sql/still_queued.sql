-- still_queued.sql: those of a set of runs that exist and are still queued
-- (RunStore.StillQueued).
--
-- Parameters (GORM):
--   ?1 text: the run ids, comma-separated (one parameter whatever their
--      number; GORM would expand a slice into a list)
--   ?2 text: the queued status
SELECT id FROM validation_runs
WHERE id = ANY(CAST(string_to_array(?, ',') AS uuid[])) AND status = ?
